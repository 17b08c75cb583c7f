"""Data sets: the bundled digits and user .npz files, with clear errors for bad ones."""

import numpy as np
import pytest

from ember import data
from ember.spec import ConfigError


def test_digits_split_is_fixed_and_exactly_quantized(digits):
    assert digits.x_train.shape == (1438, 64) and digits.x_test.shape == (359, 64)
    assert digits.classes == 10
    assert digits.x_train.dtype == np.uint8
    # pixels 0..16 become exactly 4 * pixel
    assert set(np.unique(digits.x_train)) <= set(range(0, 65, 4))
    again = data.load_digits()
    assert np.array_equal(again.x_test, digits.x_test) and np.array_equal(again.y_test,
                                                                          digits.y_test)
    assert set(np.bincount(digits.y_test)) and len(np.unique(digits.y_test)) == 10


def save(tmp_path, **arrays):
    p = tmp_path / "set.npz"
    np.savez(p, **arrays)
    return str(p)


def test_user_npz_loads_and_scales(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 6))
    y = rng.integers(0, 3, size=50)
    ds = data.load(save(tmp_path, X=x, y=y))
    assert ds.features == 6 and ds.classes == 3
    assert ds.x_train.max() == 64 and ds.x_train.min() == 0
    assert len(ds.x_train) + len(ds.x_test) == 50


@pytest.mark.parametrize("arrays, message", [
    ({"X": np.zeros((10, 4)), "y": np.zeros(9, dtype=int)}, r"y has shape \(9,\); expected \(10,\)"),
    ({"X": np.zeros(10), "y": np.zeros(10, dtype=int)}, r"X has shape \(10,\)"),
    ({"X": np.array([[0.0, 1.0], [np.nan, 2.0], [1, 1]]), "y": np.array([0, 1, 1])},
     r"NaN or infinite values \(first in sample 1\)"),
    ({"X": np.zeros((4, 2)), "y": np.array([0, 1, -1, 0])}, "label -1 is negative"),
    ({"X": np.zeros((4, 2)), "y": np.array([0.5, 1, 1, 0])}, "labels must be integers"),
    ({"X": np.zeros((4, 2)), "y": np.zeros(4, dtype=int)}, "need 2 or more"),
    ({"X": np.zeros((4, 2))}, r"lacks array\(s\) \['y'\]"),
])
def test_bad_data_sets_name_the_problem(tmp_path, arrays, message):
    with pytest.raises(ConfigError, match=message):
        data.load(save(tmp_path, **arrays))


def test_missing_and_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        data.load(str(tmp_path / "nope.npz"))
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match="not a readable .npz"):
        data.load(str(bad))
