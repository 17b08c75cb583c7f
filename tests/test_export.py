"""`ember predict` and `ember export`, and the NumPy-only inference that docs/api.md gives
for an export file, checked against a device."""

import inspect
import json
import re
from pathlib import Path

import numpy as np
import pytest

from ember import cli, data, export, trainer
from ember.device import ModelDevice

from test_scaling import save, wide_range_set

DOC = Path(__file__).resolve().parent.parent / "docs" / "api.md"


def doc_predict():
    """The function docs/api.md's "export" section gives, run from the doc's own text with
    nothing but NumPy in its namespace."""
    text = DOC.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    [block] = [b for b in blocks if "def predict_numpy" in b]
    namespace = {}
    exec(compile(block, str(DOC), "exec"), namespace)
    assert set(namespace) - {"__builtins__"} == {"np", "predict_numpy"}
    return block, namespace["predict_numpy"]


@pytest.fixture(scope="module")
def wide_run(tmp_path_factory):
    """A checkpoint of the wide-range set trained on the model, and the run's JSON."""
    tmp = tmp_path_factory.mktemp("wide")
    x, y = wide_range_set()
    path = save(tmp, X=x, y=y)
    ckpt, out = tmp / "run.ckpt", tmp / "run.json"
    assert cli.main(["train", "--quiet", "--dataset", path, "--epochs", "4", "--checkpoint",
                     str(ckpt), "--json", str(out)]) == 0
    return path, ckpt, json.loads(out.read_text())


@pytest.fixture(scope="module")
def digits_ckpt(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("digits") / "digits.ckpt"
    assert cli.main(["train", "--quiet", "--epochs", "2", "--checkpoint", str(ckpt)]) == 0
    return ckpt


def device_predictions(ckpt, x):
    """What a device predicts for raw samples x with the checkpoint's network."""
    doc = trainer.load_checkpoint(ckpt)
    with ModelDevice() as dev:
        dev.configure(doc["settings"]["layers"])
        dev.load_weights(doc["weights"])
        return dev.infer_all(doc["input_scaling"].apply(x))


def test_predict_prints_predictions_and_the_runs_accuracy(wide_run, capsys, tmp_path):
    path, ckpt, result = wide_run
    out = tmp_path / "pred.json"
    assert cli.main(["predict", "--checkpoint", str(ckpt), "--dataset", path, "--split",
                     "test", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0].split() == ["sample", "predicted", "label"]
    assert len(lines) == 1 + 180 + 1
    pred = json.loads(out.read_text())
    # the test split, scaled with the training split's numbers: the run's last test accuracy
    assert pred["accuracy"] == result["test_accuracy"]
    assert f"accuracy {100 * result['test_accuracy']:.2f} % (" in lines[-1]
    x, y = data.split(*wide_range_set(), 0.2, 0)[2:]
    assert pred["predictions"] == device_predictions(ckpt, x).tolist()
    assert [int(l.split()[1]) for l in lines[1:-1]] == pred["predictions"]


def test_predict_samples_without_labels(wide_run, capsys, tmp_path):
    _, ckpt, _ = wide_run
    x, _ = wide_range_set(seed=5, samples=7)      # new samples, no y
    path = save(tmp_path, "new.npz", X=x)
    assert cli.main(["predict", "--checkpoint", str(ckpt), "--dataset", path]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["sample", "predicted"] and len(lines) == 8
    assert [int(l.split()[1]) for l in lines[1:]] == device_predictions(ckpt, x).tolist()


def test_predict_on_digits(digits_ckpt, capsys):
    assert cli.main(["predict", "--checkpoint", str(digits_ckpt), "--dataset", "digits"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert "of 1797 samples, all of digits, network 64-32-10" in last
    assert float(last.split()[1]) > 80


def test_a_checkpoint_of_another_network_is_refused(wide_run, digits_ckpt, capsys,
                                                    monkeypatch):
    path, ckpt, _ = wide_run
    monkeypatch.setattr(cli, "open_device", lambda *a, **k: pytest.fail("device opened"))
    assert cli.main(["predict", "--checkpoint", str(digits_ckpt), "--dataset", path]) == 2
    err = capsys.readouterr().err
    assert "holds network 64-32-10, which takes 64 inputs; data set" in err
    assert "has 10 features" in err
    assert cli.main(["predict", "--checkpoint", str(ckpt), "--dataset", "digits"]) == 2
    assert "holds network 10-32-3, which takes 10 inputs" in capsys.readouterr().err


def test_export_holds_weights_formats_shifts_and_scaling(wide_run, tmp_path, capsys):
    _, ckpt, result = wide_run
    out = tmp_path / "weights.npz"
    assert cli.main(["export", "--checkpoint", str(ckpt), "--out", str(out)]) == 0
    assert "network 10-32-3, weights Q1.14 int16, inputs UQ2.6" in capsys.readouterr().out
    f = np.load(out)
    doc = trainer.load_checkpoint(ckpt)
    assert f["layers"].tolist() == [10, 32, 3] and f["shifts"].tolist() == [14, 12]
    for l, w in enumerate(doc["weights"]):
        assert f[f"weights_{l}"].dtype == np.int16 and np.array_equal(f[f"weights_{l}"], w)
        assert np.array_equal(f[f"float_weights_{l}"], w.astype(np.float32) / 2 ** 14)
    assert str(f["weight_format"]) == "Q1.14" and str(f["input_format"]) == "UQ2.6"
    assert str(f["logit_format"]) == "Q7.8"
    assert str(f["scaling_kind"]) == "minmax"
    assert np.array_equal(f["scaling_offset"], doc["input_scaling"].offset)
    assert np.array_equal(f["scaling_scale"], doc["input_scaling"].scale)
    assert str(f["weights_sha256"]) == result["weights_sha256"]


def test_the_docs_numpy_function_is_the_modules(tmp_path):
    block, _ = doc_predict()
    assert inspect.getsource(export.predict_numpy) in block


@pytest.mark.parametrize("kind", ["wide", "digits", "standard"])
def test_the_docs_numpy_function_reproduces_the_device(kind, wide_run, digits_ckpt, tmp_path):
    _, predict_numpy = doc_predict()
    if kind == "digits":
        ckpt, (x, _) = digits_ckpt, data.digits_arrays()
    else:
        x, y = wide_range_set()
        if kind == "wide":
            ckpt = wide_run[1]
        else:
            ckpt = tmp_path / "standard.ckpt"
            path = save(tmp_path, X=x, y=y)
            assert cli.main(["train", "--quiet", "--dataset", path, "--epochs", "2",
                             "--scaling", "standard", "--hidden", "16,8",
                             "--checkpoint", str(ckpt)]) == 0
        # beyond the training range too: scaled inputs saturate at 0 and 255
        x = np.concatenate([x, x * 3 - x.mean(axis=0), -x])
    out = tmp_path / "weights.npz"
    assert cli.main(["export", "--checkpoint", str(ckpt), "--out", str(out)]) == 0
    expected = device_predictions(ckpt, x)
    got = predict_numpy(str(out), x)
    assert np.array_equal(got, expected)
    assert len(np.unique(expected)) > 1     # a network that predicts one class proves little


def test_export_and_predict_refuse_a_version_1_checkpoint_of_ones_own_data(wide_run,
                                                                          tmp_path, capsys):
    _, ckpt, _ = wide_run
    old = json.loads(Path(ckpt).read_text())
    old["version"] = 1
    del old["input_scaling"], old["settings"]["scaling"]
    one = tmp_path / "v1.ckpt"
    one.write_text(json.dumps(old))
    assert cli.main(["export", "--checkpoint", str(one), "--out", str(tmp_path / "w.npz")]) == 2
    assert "holds no input scaling; resume it" in capsys.readouterr().err
    assert not (tmp_path / "w.npz").exists()
