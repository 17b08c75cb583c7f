"""Per-feature input scaling, the network's ends from the data, and their clear errors."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from ember import cli, data, policies, trainer
from ember.device import ModelDevice
from ember.reference import train_float
from ember.trainer import Trainer

#: `make train`'s weights on the model backend (e2train, digits). The digits' scaling is the
#: one every earlier release used; the order of an epoch's samples is ember.schedule's keyed
#: permutation since resident data (before it: 049bdc34..., numpy's permutation)
E2TRAIN_DIGITS_SHA256 = "83f2eae3ac83841a175d626bd1ff1403589ae960d035a50debbc29e53e86cbe2"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _example(name):
    """A module of examples/ (the scripts keep their own code under __main__)."""
    path = EXAMPLES / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"examples_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: the generated wide-range data set of examples/compare_scaling.py
wide_range_set = _example("compare_scaling").wide_range_set


def save(tmp_path, name="set.npz", **arrays):
    p = tmp_path / name
    np.savez(p, **arrays)
    return str(p)


def run_cli(tmp_path, *args, name="out.json"):
    path = tmp_path / name
    assert cli.main(["train", "--quiet", "--json", str(path), *args]) == 0
    return json.loads(path.read_text())


def test_the_generated_set_spans_four_decades():
    x, _ = wide_range_set()
    spans = x.max(axis=0) - x.min(axis=0)
    assert spans.max() / spans.min() > 1e4


def test_minmax_is_fitted_on_the_training_split_only():
    x, y = wide_range_set()
    ds = data.from_arrays(x, y, "wide")
    xtr, _, xte, _ = data.split(x.astype(np.float64), y, 0.2, 0)
    s = ds.scaling
    assert s.kind == "minmax" and s.base == 0.0
    assert np.array_equal(s.offset, xtr.min(axis=0))
    assert np.array_equal(s.scale, xtr.max(axis=0) - xtr.min(axis=0))
    # every feature spans the whole [0, 1] -> 0..64 on the training split
    assert np.all(ds.x_train.min(axis=0) == 0) and np.all(ds.x_train.max(axis=0) == 64)
    # the test split gets the training split's numbers, not its own
    want = np.clip(np.round((xte - xtr.min(axis=0)) / (xtr.max(axis=0) - xtr.min(axis=0))
                            * 64), 0, 255)
    assert np.array_equal(ds.x_test, want)
    assert not np.all(ds.x_test.max(axis=0) == 64)


def test_standard_and_none():
    x, y = wide_range_set()
    ds = data.from_arrays(x, y, "wide", scaling="standard")
    xtr = data.split(x.astype(np.float64), y, 0.2, 0)[0]
    assert np.allclose(ds.scaling.offset, xtr.mean(axis=0))
    assert np.allclose(ds.scaling.scale, data.STANDARD_SIGMAS_PER_UNIT * xtr.std(axis=0))
    # the mean at 0.5 (32), one standard deviation 0.25 (16 levels)
    assert abs(ds.x_train.mean() - 64 * data.STANDARD_BASE) < 1
    assert abs(ds.x_train.astype(float).std(axis=0).mean() - 16) < 1
    raw = np.array([[0.0, 1.5, 3.99, 5.0]] * 2)
    ds = data.from_arrays(raw, np.array([0, 1]), "raw", scaling="none")
    assert ds.x_train.tolist() == [[0, 96, 255, 255]]


def test_digits_keep_their_exact_scaling(digits):
    x, y = data.digits_arrays()
    xtr = data.split(x, y, 0.2, 0)[0]
    assert np.array_equal(digits.x_train, 4 * xtr)
    assert digits.scaling.kind == "minmax"
    assert set(digits.scaling.offset) == {0.0} and set(digits.scaling.scale) == {16.0}


def test_make_train_weights_are_unchanged_on_the_model(tmp_path):
    r = run_cli(tmp_path, "--backend", "model", "--preset", "e2train")
    assert r["weights_sha256"] == E2TRAIN_DIGITS_SHA256
    assert r["settings"]["layers"] == [64, 32, 10] and r["settings"]["scaling"] == "minmax"
    assert r["input_scaling"]["kind"] == "minmax" and len(r["input_scaling"]["offset"]) == 64


def test_wide_range_set_trains_within_two_points_of_the_float_reference():
    x, y = wide_range_set()
    results = {}
    for kind in ("minmax", data.LEGACY_SCALING):
        ds = data.from_arrays(x, y, "wide", scaling=kind)
        cfg = policies.make_config("baseline", epochs=10, scaling=kind)
        device = Trainer(ModelDevice(), ds, cfg, progress=False).run()["test_accuracy"]
        results[kind] = device, train_float(cfg, ds)["test_accuracy"]
    device, reference = results["minmax"]
    assert device > 0.9 and reference > 0.9
    assert abs(device - reference) <= 0.02
    # one global range (the scaling before) loses most of it: the test has teeth
    assert results[data.LEGACY_SCALING][0] < device - 0.2


def test_network_ends_come_from_the_data(tmp_path):
    x, y = wide_range_set(samples=200)
    path = save(tmp_path, X=x, y=y)
    r = run_cli(tmp_path, "--dataset", path, "--epochs", "1")
    assert r["settings"]["layers"] == [10, 32, 3]
    r = run_cli(tmp_path, "--dataset", path, "--epochs", "1", "--hidden", "64,32")
    assert r["settings"]["layers"] == [10, 64, 32, 3]
    r = run_cli(tmp_path, "--dataset", path, "--epochs", "1", "--layers", "10-16-4")
    assert r["settings"]["layers"] == [10, 16, 4]


@pytest.mark.parametrize("args, message", [
    (["--scaling", "zscore"], "scaling 'zscore' is not one of minmax, standard, none"),
    (["--layers", "64-32-10", "--hidden", "16"],
     "layers 64-32-10 and hidden widths 16 disagree"),
    (["--hidden", "64,x"], "hidden widths '64,x' must look like 64,32"),
    (["--build", "icebreaker", "--hidden", "100"], "holds at most 64 per layer"),
])
def test_bad_options_are_refused_before_training(capsys, args, message):
    try:
        code = cli.main(["train", "--quiet", "--epochs", "1", *args])
    except SystemExit as e:     # argparse's own errors
        code = e.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_too_wide_a_data_set_names_its_width_and_the_limit(tmp_path, capsys, monkeypatch):
    rng = np.random.default_rng(1)
    path = save(tmp_path, X=rng.random((20, 1100)), y=np.arange(20) % 2)
    # refused before any device is opened
    monkeypatch.setattr(cli, "open_device", lambda *a, **k: pytest.fail("device opened"))
    assert cli.main(["train", "--quiet", "--dataset", path]) == 2
    err = capsys.readouterr().err
    assert "has 1100 features; build 'sim' takes at most 1024 inputs per sample" in err
    path = save(tmp_path, "thirteen.npz", X=rng.random((20, 100)), y=np.arange(20) % 3)
    assert cli.main(["train", "--quiet", "--dataset", path, "--build", "icebreaker"]) == 2
    assert "has 100 features; build 'icebreaker' takes at most 64" in capsys.readouterr().err


def test_scaling_is_stored_in_checkpoint_and_json(tmp_path):
    x, y = wide_range_set(samples=200)
    path = save(tmp_path, X=x, y=y)
    ckpt = tmp_path / "run.ckpt"
    r = run_cli(tmp_path, "--dataset", path, "--epochs", "1", "--scaling", "standard",
                "--checkpoint", str(ckpt))
    ds = data.load(path, scaling="standard")
    assert r["input_scaling"] == ds.scaling.to_dict()
    saved = trainer.load_checkpoint(ckpt)
    assert saved["version"] == 2 and saved["settings"]["scaling"] == "standard"
    assert np.array_equal(saved["input_scaling"].offset, ds.scaling.offset)
    assert np.array_equal(saved["input_scaling"].scale, ds.scaling.scale)


def test_version_1_checkpoints_resume_with_their_one_range_scaling(tmp_path):
    """ember 0.1 wrote no input scaling and scaled every feature by one range: such a
    checkpoint resumes with that scaling (its data_sha256 proves it), and ends as the
    uninterrupted run with that scaling does."""
    x, y = wide_range_set(samples=200)
    path = save(tmp_path, X=x, y=y)
    ckpt = tmp_path / "run.ckpt"
    args = ("--dataset", path, "--epochs", "2", "--layers", "10-32-3")
    straight = run_cli(tmp_path, *args, "--scaling", "global", name="straight.json")
    run_cli(tmp_path, *args, "--scaling", "global", "--checkpoint", str(ckpt))
    old = json.loads(ckpt.read_text())
    old["version"] = 1
    del old["input_scaling"], old["settings"]["scaling"]
    one = tmp_path / "v1.ckpt"
    one.write_text(json.dumps(old))
    loaded = trainer.load_checkpoint(one)
    assert loaded["settings"]["scaling"] == data.LEGACY_SCALING
    assert loaded["input_scaling"] is None
    # after epoch 2 of 2: the resume repeats the last evaluation on the data it scales now
    # and checks data_sha256 and the recorded accuracy against it
    resumed = run_cli(tmp_path, "--resume", str(one), name="resumed.json")
    assert resumed["weights_sha256"] == straight["weights_sha256"]
    assert resumed["settings"]["scaling"] == data.LEGACY_SCALING
