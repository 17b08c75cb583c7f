"""Data sets: the bundled 8x8 digits and a user's own .npz, split and quantized for the engine.

The digits are the 1,797-image copy of the UCI "Optical Recognition of Handwritten Digits"
test set (E. Alpaydin, C. Kaynak, 1998; CC BY 4.0) as distributed by scikit-learn, stored in
ember/assets/digits.npz (X: uint8 pixels 0..16, y: uint8 labels).

Inputs are scaled to [0, 1] and quantized to UQ2.6 (x * 64, so 1.0 -> 64); the digits'
pixel p becomes exactly 4 * p.
"""

from dataclasses import dataclass
from importlib import resources

import numpy as np

from . import spec
from .spec import ConfigError


@dataclass
class Dataset:
    """A train/test split, with float features in [0, 1] and their UQ2.6 integers."""
    name: str
    x_train: np.ndarray     # uint8, UQ2.6
    y_train: np.ndarray     # int64 labels
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int

    @property
    def features(self):
        return self.x_train.shape[1]

    def float_view(self, x):
        """The real value of quantized inputs (what the float reference trains on)."""
        return x.astype(np.float32) / (1 << spec.ACT_FRAC_BITS)


def quantize_inputs(x01):
    """Map features in [0, 1] to UQ2.6 bytes: round(x * 64)."""
    return np.clip(np.round(x01 * (1 << spec.ACT_FRAC_BITS)), 0, spec.ACT_MAX).astype(np.uint8)


def validate(x, y, source):
    """Check a raw (X, y) pair; raise ConfigError naming the problem."""
    x = np.asarray(x)
    y = np.asarray(y)
    if x.ndim != 2:
        raise ConfigError(f"{source}: X has shape {x.shape}; expected (samples, features)")
    if y.ndim != 1 or len(y) != len(x):
        raise ConfigError(f"{source}: y has shape {y.shape}; expected ({len(x)},) to match X")
    if len(x) < 2:
        raise ConfigError(f"{source}: {len(x)} samples; need at least 2 (train and test)")
    if not np.issubdtype(x.dtype, np.number):
        raise ConfigError(f"{source}: X has dtype {x.dtype}; expected numbers")
    if not np.all(np.isfinite(x)):
        bad = int(np.argwhere(~np.isfinite(x))[0][0])
        raise ConfigError(f"{source}: X has NaN or infinite values (first in sample {bad})")
    if not np.issubdtype(y.dtype, np.integer):
        if np.issubdtype(y.dtype, np.floating) and np.all(np.isfinite(y)) and \
                np.all(y == np.round(y)):
            y = y.astype(np.int64)
        else:
            raise ConfigError(f"{source}: y has dtype {y.dtype}; labels must be integers")
    if y.min() < 0:
        raise ConfigError(f"{source}: label {int(y.min())} is negative; labels are 0..C-1")
    classes = int(y.max()) + 1
    if classes < 2:
        raise ConfigError(f"{source}: labels span only class {int(y.max())}; need 2 or more")
    return x, y.astype(np.int64), classes


def split(x, y, test_fraction=0.2, seed=0):
    """A fixed seeded permutation split (the same for every run with the same seed)."""
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = max(1, int(round(len(x) * test_fraction)))
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def from_arrays(x, y, name, split_seed=0, test_fraction=0.2):
    """Validate, scale to [0, 1] by the training split's range, quantize and split."""
    x, y, classes = validate(x, y, name)
    x = x.astype(np.float64)
    xtr, ytr, xte, yte = split(x, y, test_fraction, split_seed)
    lo = min(0.0, float(xtr.min()))
    hi = float(xtr.max())
    scale = (hi - lo) if hi > lo else 1.0
    q = lambda v: quantize_inputs(np.clip((v - lo) / scale, 0.0, None))
    return Dataset(name, q(xtr), ytr, q(xte), yte, classes)


def load_digits(split_seed=0):
    """The bundled digits: 1,797 images of 64 pixels, 10 classes, 80/20 split."""
    with resources.files("ember.assets").joinpath("digits.npz").open("rb") as f:
        d = np.load(f)
        x, y = d["X"], d["y"]
    # pixels are 0..16: dividing by 16 makes the quantization exact (pixel * 4)
    x, y, classes = validate(x, y, "digits")
    xtr, ytr, xte, yte = split(x, y, 0.2, split_seed)
    q = lambda v: quantize_inputs(v.astype(np.float64) / 16.0)
    return Dataset("digits", q(xtr), ytr, q(xte), yte, classes)


def load_npz(path, split_seed=0):
    """A user's data set: an .npz with arrays X (samples, features) and y (samples,)."""
    try:
        d = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise ConfigError(f"data set {path} does not exist") from None
    except Exception as e:   # numpy raises several types for a file that is not an .npz
        raise ConfigError(f"data set {path} is not a readable .npz file ({e})") from None
    missing = [k for k in ("X", "y") if k not in d.files]
    if missing:
        raise ConfigError(f"data set {path} lacks array(s) {missing}; it has {d.files}")
    return from_arrays(d["X"], d["y"], str(path), split_seed)


def load(name_or_path, split_seed=0):
    """'digits' or a path to an .npz file."""
    if name_or_path in (None, "digits"):
        return load_digits(split_seed)
    return load_npz(name_or_path, split_seed)
