"""The trainer and the `ember train` command on the model backend."""

import json

import numpy as np
import pytest

from ember import cli, data, policies
from ember.device import ModelDevice
from ember.reference import train_float
from ember.trainer import Trainer


def run_cli(tmp_path, *args, name="out.json"):
    path = tmp_path / name
    assert cli.main(["train", "--quiet", "--json", str(path), *args]) == 0
    return json.loads(path.read_text())


def test_json_is_reproducible_and_complete(tmp_path):
    args = ("--epochs", "2", "--preset", "all", "--seed", "5")
    a = run_cli(tmp_path, *args, name="a.json")
    b = run_cli(tmp_path, *args, name="b.json")
    for key in ("backend", "settings", "epochs", "train_accuracy", "test_accuracy", "counters",
                "energy_pj", "energy_breakdown", "skipped", "weights_sha256", "wall_s"):
        assert key in a
    a.pop("wall_s"), b.pop("wall_s")
    assert a == b
    assert set(a["skipped"]) == {"smd", "slu", "ssprop", "psg", "zero"}
    assert all(v > 0 for v in a["skipped"].values())
    c = run_cli(tmp_path, "--epochs", "2", "--preset", "all", "--seed", "6", name="c.json")
    assert c["weights_sha256"] != a["weights_sha256"]


def test_preset_with_override(tmp_path):
    r = run_cli(tmp_path, "--epochs", "1", "--preset", "e2train", "--smd", "0",
                "--layers", "64-20-10", "--batch-size", "16")
    assert r["settings"]["smd"] == 0 and r["settings"]["psg"] is True
    assert r["skipped"]["smd"] == 0 and r["skipped"]["psg"] > 0
    assert r["settings"]["layers"] == [64, 20, 10]


def test_smd_counts_dropped_batches(digits):
    cfg = policies.make_config("smd", epochs=1, seed=1)
    r = Trainer(ModelDevice(), digits, cfg, progress=False).run()
    batches = -(-len(digits.x_train) // 32)
    dropped = r["history"][0]["batches_dropped"]
    assert 0.3 * batches < dropped < 0.7 * batches
    assert r["counters"]["batches"] == batches - dropped
    assert r["skipped"]["smd"] > 0


@pytest.mark.parametrize("args, message", [
    (["--layers", "64-5"], "smaller than the data set's 10 classes"),
    (["--layers", "60-32-10"], "input width 60 does not match the data set's 64"),
    (["--layers", "64-2000-10"], "holds at most 1024"),
    (["--batch-size", "500"], "batch size 500 is outside 1..64"),
    (["--smd", "1.5"], "SMD drop probability 1.5 is outside [0, 1)"),
    (["--dataset", "/nonexistent.npz"], "does not exist"),
    (["--profile", "nope"], "no bundled energy profile named 'nope'"),
])
def test_cli_errors_are_clear(capsys, args, message):
    assert cli.main(["train", "--quiet", "--epochs", "1", *args]) == 2
    err = capsys.readouterr().err
    assert message in err, err


def test_baseline_converges_close_to_float(digits):
    cfg = policies.make_config("baseline", epochs=8)
    r = Trainer(ModelDevice(), digits, cfg, progress=False).run()
    f = train_float(cfg, digits)
    assert r["test_accuracy"] > 0.93
    assert f["test_accuracy"] > 0.93
    assert abs(r["test_accuracy"] - f["test_accuracy"]) < 0.03


def test_schedules():
    cfg = policies.make_config("ssprop", epochs=6, ssprop_warmup=1)
    keeps = [policies.epoch_settings(cfg, e).keep_q8 for e in range(6)]
    assert keeps == [256, 51, 256, 51, 256, 51]
    cfg = policies.make_config("baseline", epochs=8, lr_shift=12, lr_milestones=(0.5, 0.75))
    assert [policies.epoch_settings(cfg, e).lr_shift for e in range(8)] == \
        [12, 12, 12, 12, 13, 13, 14, 14]
    cfg = policies.make_config("ssprop", epochs=5, ssprop_schedule="linear", ssprop_warmup=0,
                               ssprop_keep_start=1.0, ssprop_keep=0.5)
    assert [policies.epoch_settings(cfg, e).keep_q8 for e in range(5)] == \
        [256, 224, 192, 160, 128]
