"""Checkpoints, resume and the --plot output of `ember train` (model backend)."""

import json
import os

import numpy as np
import pytest

from ember import cli, data, golden, policies, trainer
from ember.device import ModelDevice

#: every RNG stream matters: SMD drops, SLU random masks, ssProp random channels, shuffling;
#: streamed batch by batch, so that a run can be killed in the middle of an epoch (a resident
#: run's kill and resume: tests/test_resident.py)
RUN = ("--preset", "all", "--ssprop-variant", "random", "--epochs", "4", "--seed", "3",
       "--resident", "off")


def run_cli(tmp_path, *args, name="out.json"):
    path = tmp_path / name
    assert cli.main(["train", "--quiet", "--json", str(path), *args]) == 0
    return json.loads(path.read_text())


def without_wall(result):
    result = dict(result)
    result.pop("wall_s")
    return result


class KilledDevice:
    """A device whose train_batch raises KeyboardInterrupt on call number `kill_at` (0-based):
    a run killed in the middle of an epoch."""

    def __init__(self, device, kill_at):
        self.device, self.kill_at, self.calls = device, kill_at, 0

    def __getattr__(self, name):
        return getattr(self.device, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.device.close()

    def train_batch(self, *args):
        if self.calls == self.kill_at:
            raise KeyboardInterrupt
        self.calls += 1
        return self.device.train_batch(*args)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The run without interruption (and without --checkpoint)."""
    return run_cli(tmp_path_factory.mktemp("straight"), *RUN)


def batches_sent(result, epochs):
    """Train batches the device received in the first `epochs` epochs of a run."""
    per_epoch = -(-len(data.load_digits().x_train) // result["settings"]["batch_size"])
    return sum(per_epoch - h["batches_dropped"] for h in result["history"][:epochs])


def test_killed_mid_epoch_resumes_to_the_same_result(tmp_path, monkeypatch, capsys, straight):
    ckpt = tmp_path / "run.ckpt"
    # kill in the middle of epoch 3: the last checkpoint is the one after epoch 2
    done, epoch_3 = batches_sent(straight, 2), batches_sent(straight, 3) - batches_sent(straight, 2)
    kill_at = done + epoch_3 // 2
    monkeypatch.setattr(cli, "open_device",
                        lambda *a, **k: KilledDevice(ModelDevice(), kill_at))
    assert cli.main(["train", "--quiet", *RUN, "--checkpoint", str(ckpt),
                     "--json", str(tmp_path / "killed.json")]) == 130
    assert f"--resume {ckpt}" in capsys.readouterr().err
    assert not (tmp_path / "killed.json").exists()
    saved = trainer.load_checkpoint(ckpt)
    assert saved["epoch"] == 2 and len(saved["history"]) == 2
    assert saved["history"] == straight["history"][:2]
    monkeypatch.undo()
    # a fresh device and the same command line plus --resume
    resumed = run_cli(tmp_path, *RUN, "--checkpoint", str(ckpt), "--resume", str(ckpt),
                      name="resumed.json")
    assert resumed["counters"]["link_rx_bytes"] > 0 and resumed["energy_pj"] > 0
    assert without_wall(resumed) == without_wall(straight)
    assert trainer.load_checkpoint(ckpt)["epoch"] == 4


def test_checkpointing_changes_nothing_and_holds_the_run(tmp_path, straight):
    ckpt = tmp_path / "run.ckpt"
    r = run_cli(tmp_path, *RUN, "--checkpoint", str(ckpt))
    assert without_wall(r) == without_wall(straight)        # link bytes included
    doc = json.loads(ckpt.read_text())
    assert doc["format"] == "ember-checkpoint" and doc["version"] == trainer.CHECKPOINT_VERSION
    assert doc["epoch"] == 4 and doc["settings"] == r["settings"]
    assert doc["history"] == r["history"]
    assert doc["weights_sha256"] == r["weights_sha256"]
    weights = [np.array(w, dtype=np.int16) for w in doc["weights"]]
    assert [w.shape for w in weights] == [(32, 64), (10, 32)]
    assert golden.weights_sha256(weights) == r["weights_sha256"]
    assert doc["train_counters"] == r["counters"]
    assert doc["eval_counters"] == r["eval_counters"]
    assert doc["dense_energy_pj"] == r["dense_energy_pj"]
    assert set(doc["rng"]) == {"shuffle", "smd", "lfsr", "slu"}
    assert doc["notes"] == {"preset": "all"}
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    # resuming a finished run trains nothing and reports the same result
    again = run_cli(tmp_path, "--resume", str(ckpt), "--resident", "off", name="again.json")
    assert without_wall(again) == without_wall(straight)


@pytest.fixture(scope="module")
def killed_in_epoch_3(tmp_path_factory, straight):
    """The checkpoint left by a Trainer killed after one batch of epoch 3, and the config."""
    cfg = policies.make_config("all", ssprop_variant="random", epochs=4, seed=3)
    path = tmp_path_factory.mktemp("killed") / "run.ckpt"
    with pytest.raises(KeyboardInterrupt):
        trainer.Trainer(KilledDevice(ModelDevice(), batches_sent(straight, 2) + 1),
                        data.load_digits(), cfg, progress=False, checkpoint=path,
                        resident="off").run()
    return path, cfg


@pytest.mark.parametrize("stream", [None, "shuffle", "smd", "lfsr", "slu"])
def test_every_rng_stream_is_restored(killed_in_epoch_3, straight, stream):
    """Resuming with one stream reset to its start gives another run (with none reset, the
    same run): the resume test above depends on each stream being restored."""
    path, cfg = killed_in_epoch_3
    saved = trainer.load_checkpoint(path)
    assert saved["epoch"] == 2
    if stream is not None:
        number = {"shuffle": policies.STREAM_SHUFFLE, "smd": policies.STREAM_SMD,
                  "lfsr": policies.STREAM_LFSR, "slu": policies.STREAM_SLU}[stream]
        fresh = policies.rng(cfg.seed, number).bit_generator.state
        saved["rng"][stream] = {"rng": fresh, "count": 0} if stream == "slu" else fresh
    r = trainer.Trainer(ModelDevice(), data.load_digits(), cfg, progress=False,
                        resume=saved, resident="off").run()
    assert (r["weights_sha256"] == straight["weights_sha256"]) == (stream is None)


def test_resume_checks_the_settings(tmp_path, capsys):
    ckpt = tmp_path / "run.ckpt"
    json_path = tmp_path / "out.json"
    base = ["train", "--quiet", "--epochs", "2", "--preset", "smd", "--seed", "4", "--batch", "16"]
    assert cli.main([*base, "--checkpoint", str(ckpt)]) == 0
    capsys.readouterr()
    cases = [
        (["--resume", str(ckpt), "--epochs", "3"], "epochs 3 (checkpoint: 2)"),
        (["--resume", str(ckpt), "--preset", "baseline", "--epochs", "2", "--seed", "4"],
         "smd 0.0 (checkpoint: 0.5)"),
        (["--resume", str(ckpt), "--layers", "64-20-10"],
         "layers [64, 20, 10] (checkpoint: [64, 32, 10])"),
        (["--resume", str(ckpt), "--build", "icebreaker"],
         "written on build 'sim'; this device is build 'icebreaker'"),
    ]
    for args, message in cases:
        assert cli.main(["train", "--quiet", "--json", str(json_path), *args]) == 2, args
        err = capsys.readouterr().err
        assert message in err, err
        assert not json_path.exists()
    # only --resume: the checkpoint's settings; the same command line plus --resume: accepted
    assert run_cli(tmp_path, "--resume", str(ckpt))["settings"]["smd"] == 0.5
    assert run_cli(tmp_path, *base[2:], "--resume", str(ckpt))["epochs"] == 2


def test_bad_checkpoints_are_refused(tmp_path, capsys):
    good = tmp_path / "good.ckpt"
    assert cli.main(["train", "--quiet", "--epochs", "1", "--checkpoint", str(good)]) == 0
    doc = json.loads(good.read_text())
    cases = {"missing.ckpt": (None, "does not exist"),
             "text.ckpt": ("not json", "is not readable JSON"),
             "other.ckpt": (json.dumps({"format": "something"}), "is not an Ember checkpoint"),
             "future.ckpt": (json.dumps({**doc, "version": 99}),
                             "format version 99; this ember reads versions 1, 2")}
    tampered = json.loads(good.read_text())
    tampered["weights"][0][0][0] += 1
    cases["tampered.ckpt"] = (json.dumps(tampered), "do not match their weights_sha256")
    for name, (text, message) in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        assert cli.main(["train", "--quiet", "--resume", str(path)]) == 2
        err = capsys.readouterr().err
        assert message in err and name in err, err


def test_checkpoint_is_replaced_atomically(tmp_path, monkeypatch, digits):
    """A write that fails half-way leaves the previous checkpoint whole and no temp file."""
    path = tmp_path / "run.ckpt"
    cfg = policies.make_config("baseline", epochs=3)
    real_dump, calls = json.dump, []

    def failing_dump(obj, f, **kw):
        calls.append(obj["epoch"])
        if obj["epoch"] == 2:
            f.write('{"format": "ember-checkpoint", "trunc')
            raise OSError("disk full")
        return real_dump(obj, f, **kw)
    monkeypatch.setattr(trainer.json, "dump", failing_dump)
    with pytest.raises(OSError, match="disk full"):
        trainer.Trainer(ModelDevice(), digits, cfg, progress=False, checkpoint=path).run()
    monkeypatch.undo()
    assert calls == [1, 2]
    assert trainer.load_checkpoint(path)["epoch"] == 1
    assert os.listdir(tmp_path) == ["run.ckpt"]


def test_output_paths_are_checked_before_training(tmp_path, capsys):
    for option in ("--checkpoint", "--plot", "--json"):
        target = tmp_path / "no-such-dir" / "out"
        assert cli.main(["train", "--quiet", "--epochs", "1", option, str(target)]) == 2
        err = capsys.readouterr().err
        assert f"{option} {target}" in err and "does not exist" in err, err


def test_plot_writes_a_png(tmp_path):
    png = tmp_path / "run.png"
    run_cli(tmp_path, "--epochs", "2", "--preset", "smd", "--plot", str(png))
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    assert (width, height) == (700, 600)
    assert png.stat().st_size > 10_000
