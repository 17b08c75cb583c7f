"""Train a tabular data set whose features differ in range by 10^4 with each input scaling,
and print the device's test accuracy next to the float32 reference's.

    python examples/compare_scaling.py [model|sim|PORT]

tests/test_scaling.py trains the same data set (`wide_range_set`) and checks that minmax
comes within 2 points of the float reference.
"""

import sys

import numpy as np

import ember
from ember.reference import train_float


def wide_range_set(seed=0, samples=900, features=10, classes=3):
    """Gaussian classes whose features span 0.68 to 9,552 (a factor of 1.4e4) and sit far
    from zero: one range for all features squashes the narrow ones to a few input levels."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, features)) * 1.5
    y = rng.integers(0, classes, size=samples)
    x = centres[y] + rng.normal(size=(samples, features))
    ranges = np.logspace(-1, 3, features)
    return x * ranges + 5 * ranges, y


def compare(target="model", epochs=10, kinds=("minmax", "standard", "global")):
    """{scaling kind: (device test accuracy, float reference test accuracy)}. "global" is
    ember 0.1's one range for all features."""
    x, y = wide_range_set()
    out = {}
    with ember.open_device(target) as device:
        for kind in kinds:
            ds = ember.data.from_arrays(x, y, "wide", scaling=kind)
            net = ember.train(device, ds, epochs=epochs)
            cfg = ember.make_config("baseline", epochs=epochs, scaling=kind)
            out[kind] = net.test_accuracy, train_float(cfg, ds)["test_accuracy"]
    return out


if __name__ == "__main__":
    x, _ = wide_range_set()
    spans = x.max(axis=0) - x.min(axis=0)
    print(f"10 features spanning {spans.min():.2f} to {spans.max():,.0f} "
          f"({spans.max() / spans.min():.2g} apart), 3 classes, 900 samples, 10 epochs")
    for kind, (device, reference) in compare(*sys.argv[1:2]).items():
        print(f"  {kind:<8s}  device {100 * device:6.2f} %   float32 reference "
              f"{100 * reference:6.2f} %")
