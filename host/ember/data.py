"""Data sets: the bundled 8x8 digits and a user's own arrays or .npz, split, scaled per feature
and quantized for the engine.

The digits are the 1,797-image copy of the UCI "Optical Recognition of Handwritten Digits"
test set (E. Alpaydin, C. Kaynak, 1998; CC BY 4.0) as distributed by scikit-learn, stored in
ember/assets/digits.npz (X: uint8 pixels 0..16, y: uint8 labels).

Input scaling
-------------
The engine takes inputs as UQ2.6 bytes (spec.ACT_BITS, spec.ACT_FRAC_BITS: x * 64, so
1.0 -> 64, at most 255/64 = 3.98). Each feature f is scaled on its own, with numbers fitted on
the training split only and applied unchanged to the test split and to every sample predicted
later (they are stored in checkpoints, result JSON and exports)::

    real = (x - offset[f]) / scale[f] + base        then   byte = clip(round(real * 64), 0, 255)

  minmax    offset = the feature's training minimum, scale = its training range, base 0:
            the training split spans [0, 1]. A data set whose features share a known fixed
            range uses that range instead (the digits' pixels, 0..16: pixel p becomes exactly
            4 * p, as in every earlier release).
  standard  offset = the training mean, scale = STANDARD_SIGMAS_PER_UNIT standard deviations,
            base STANDARD_BASE: the mean sits at 0.5 and one sigma is 0.25, so +-2 sigma
            span [0, 1] as minmax's inputs do (the format is unsigned: the mean cannot sit
            at 0, and values below -2 sigma become 0). Every input then averages 0.5, more
            than minmax gives sparse data: the digits need one step smaller (--lr-shift 13)
            with it (docs/api.md, "Input scaling").
  none      offset 0, scale 1, base 0: the values are already the inputs' real values.

A feature that is constant on the training split gets scale 1 (it becomes base + x - offset).
The checkpoints of ember 0.1 (version 1) scaled every feature by one range, the training
split's [min(0, min), max] over all features; LEGACY_SCALING ("global") reproduces that for
resuming them.
"""

from dataclasses import dataclass
from importlib import resources

import numpy as np

from . import spec
from .spec import ConfigError

#: the kinds of input scaling `--scaling` takes (the first is the default)
SCALINGS = ("minmax", "standard", "none")
#: one range for all features, fitted on the training split: version 1 checkpoints' scaling
LEGACY_SCALING = "global"
#: standard scaling: real = (x - mean) / (STANDARD_SIGMAS_PER_UNIT * std) + STANDARD_BASE
STANDARD_SIGMAS_PER_UNIT = 4.0
STANDARD_BASE = 0.5
#: the digits' pixels are 0..16 whatever the split holds
DIGITS_RANGE = (0.0, 16.0)


def check_scaling_kind(kind, legacy=False):
    """Raise ConfigError unless `kind` is one of SCALINGS (or, with legacy, "global")."""
    known = SCALINGS + ((LEGACY_SCALING,) if legacy else ())
    if kind not in known:
        raise ConfigError(f"scaling '{kind}' is not one of {', '.join(SCALINGS)}")
    return kind


@dataclass(frozen=True)
class Scaling:
    """Per-feature input scaling: real = (x - offset) / scale + base, then UQ2.6 bytes.

    kind:   'minmax', 'standard', 'none' or 'global' (version 1 checkpoints);
    offset: (features,) float64, in the data set's own units;
    scale:  (features,) float64, data set units per unit of the input format (> 0);
    base:   float, the real input value a sample at `offset` becomes.
    """
    kind: str
    offset: np.ndarray
    scale: np.ndarray
    base: float = 0.0

    @property
    def features(self):
        """How many features the scaling takes."""
        return len(self.offset)

    def real(self, x):
        """The real (unquantized) input values of raw samples x (samples, features)."""
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.features:
            raise ConfigError(f"samples of shape {x.shape}; this scaling takes (samples, "
                              f"{self.features}) features")
        return (x - self.offset) / self.scale + self.base

    def apply(self, x):
        """Raw samples (samples, features) -> UQ2.6 bytes the engine takes."""
        return quantize_inputs(self.real(x))

    def to_dict(self):
        """JSON-able form (checkpoints, result JSON)."""
        return {"kind": self.kind, "offset": [float(v) for v in self.offset],
                "scale": [float(v) for v in self.scale], "base": float(self.base)}

    @classmethod
    def from_dict(cls, d, source="scaling"):
        """The inverse of to_dict; raises ConfigError naming `source` if `d` is malformed."""
        try:
            kind = check_scaling_kind(d["kind"], legacy=True)
            offset = np.asarray(d["offset"], dtype=np.float64)
            scale = np.asarray(d["scale"], dtype=np.float64)
            base = float(d["base"])
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"{source}: not a valid input scaling ({e!r})") from None
        if offset.ndim != 1 or offset.shape != scale.shape or not np.all(scale > 0) or \
                not np.all(np.isfinite(offset)) or not np.all(np.isfinite(scale)):
            raise ConfigError(f"{source}: offset and scale must be equal-length finite lists, "
                              f"scale > 0 (shapes {offset.shape}, {scale.shape})")
        return cls(kind, offset, scale, base)


def fit_scaling(kind, x_train, value_range=None):
    """The Scaling of `kind` fitted on the training split x_train (samples, features).
    value_range (lo, hi): a range every feature is known to share (minmax then uses it)."""
    check_scaling_kind(kind, legacy=True)
    x = np.asarray(x_train, dtype=np.float64)
    k = x.shape[1]
    ones, zeros = np.ones(k), np.zeros(k)
    if kind == "none":
        return Scaling(kind, zeros, ones, 0.0)
    if kind == LEGACY_SCALING or (kind == "minmax" and value_range is not None):
        if value_range is not None:
            lo, hi = value_range
        else:
            lo, hi = min(0.0, float(x.min())), float(x.max())
        return Scaling(kind, np.full(k, lo), np.full(k, (hi - lo) if hi > lo else 1.0), 0.0)
    if kind == "minmax":
        lo, hi = x.min(axis=0), x.max(axis=0)
        return Scaling(kind, lo, np.where(hi > lo, hi - lo, 1.0), 0.0)
    mean, std = x.mean(axis=0), x.std(axis=0)
    return Scaling(kind, mean, np.where(std > 0, STANDARD_SIGMAS_PER_UNIT * std, 1.0),
                   STANDARD_BASE)


@dataclass
class Dataset:
    """A train/test split: UQ2.6 integer features (what the engine takes), integer labels and
    the input scaling that made them from the raw values (fitted on the training split)."""
    name: str
    x_train: np.ndarray     # uint8, UQ2.6
    y_train: np.ndarray     # int64 labels
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int
    scaling: Scaling = None

    @property
    def features(self):
        return self.x_train.shape[1]

    def float_view(self, x):
        """The real value of quantized inputs (what the float reference trains on)."""
        return x.astype(np.float32) / (1 << spec.ACT_FRAC_BITS)


def quantize_inputs(real):
    """Map real input values to UQ2.6 bytes: round(x * 64), saturated to 0..255."""
    return np.clip(np.round(real * (1 << spec.ACT_FRAC_BITS)), 0, spec.ACT_MAX).astype(np.uint8)


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
    check_samples(x, source)
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


def check_samples(x, source):
    """Check raw features X (samples, features): numbers, finite. Returns X as an array."""
    x = np.asarray(x)
    if x.ndim != 2:
        raise ConfigError(f"{source}: X has shape {x.shape}; expected (samples, features)")
    if not np.issubdtype(x.dtype, np.number):
        raise ConfigError(f"{source}: X has dtype {x.dtype}; expected numbers")
    if not np.all(np.isfinite(x)):
        bad = int(np.argwhere(~np.isfinite(x))[0][0])
        raise ConfigError(f"{source}: X has NaN or infinite values (first in sample {bad})")
    return x


def split(x, y, test_fraction=0.2, seed=0):
    """A fixed seeded permutation split (the same for every run with the same seed)."""
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = max(1, int(round(len(x) * test_fraction)))
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def from_arrays(x, y, name="arrays", split_seed=0, test_fraction=0.2, scaling="minmax",
                value_range=None):
    """Validate, split, fit `scaling` on the training split, and quantize both splits.
    value_range (lo, hi): a range all features are known to share (see fit_scaling)."""
    check_scaling_kind(scaling, legacy=True)
    x, y, classes = validate(x, y, name)
    xtr, ytr, xte, yte = split(x.astype(np.float64), y, test_fraction, split_seed)
    fitted = fit_scaling(scaling, xtr, value_range)
    return Dataset(name, fitted.apply(xtr), ytr, fitted.apply(xte), yte, classes, fitted)


def digits_arrays():
    """The bundled digits' raw pixels X (1797, 64), 0..16, and labels y (1797,)."""
    with resources.files("ember.assets").joinpath("digits.npz").open("rb") as f:
        d = np.load(f)
        return d["X"], d["y"]


def load_digits(split_seed=0, scaling="minmax"):
    """The bundled digits: 1,797 images of 64 pixels, 10 classes, 80/20 split."""
    x, y = digits_arrays()
    # minmax over the pixels' fixed range 0..16 makes the quantization exact (pixel * 4)
    return from_arrays(x, y, "digits", split_seed, 0.2, scaling, value_range=DIGITS_RANGE)


def read_npz(path):
    """The arrays X and y of a user's .npz file (y may be absent: samples to predict)."""
    try:
        d = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise ConfigError(f"data set {path} does not exist") from None
    except Exception as e:   # numpy raises several types for a file that is not an .npz
        raise ConfigError(f"data set {path} is not a readable .npz file ({e})") from None
    if "X" not in d.files:
        raise ConfigError(f"data set {path} lacks array(s) ['X']; it has {d.files}")
    return d["X"], (d["y"] if "y" in d.files else None), d.files


def load_npz(path, split_seed=0, scaling="minmax"):
    """A user's data set: an .npz with arrays X (samples, features) and y (samples,)."""
    x, y, files = read_npz(path)
    if y is None:
        raise ConfigError(f"data set {path} lacks array(s) ['y']; it has {files}")
    return from_arrays(x, y, str(path), split_seed, scaling=scaling)


def load(name_or_path, split_seed=0, scaling="minmax"):
    """'digits' or a path to an .npz file, with `scaling` fitted on its training split."""
    if name_or_path in (None, "digits"):
        return load_digits(split_seed, scaling)
    return load_npz(name_or_path, split_seed, scaling)
