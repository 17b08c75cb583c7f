"""The Device API: one interface to an Ember engine, whatever runs it.

Backends:
  model  the golden model in-process (`ModelDevice`);
  sim    the gateware in a simulator process behind a loopback socket (host link issue);
  board  a real board over its serial port (host link issue).

Every backend validates its arguments before touching the device, so a rejected call leaves
the device unchanged.
"""

import numpy as np

from . import __version__, spec
from .golden import GoldenModel
from .spec import ConfigError, StepSettings

BACKENDS = ("model",)


class Device:
    """What every backend provides. Counters are cumulative until `clear_counters`."""

    backend = None

    def identify(self):
        """The build: name, lanes, memory sizes, limits, feature flags, version."""
        raise NotImplementedError

    def configure(self, layers, shifts=None):
        raise NotImplementedError

    def load_weights(self, weights):
        raise NotImplementedError

    def read_weights(self):
        raise NotImplementedError

    def train_batch(self, x, y, settings=StepSettings()):
        """Train on one batch; returns how many samples the forward pass got right."""
        raise NotImplementedError

    def infer(self, x):
        """Predicted class of every sample of a batch (at most identify()['max_batch'])."""
        raise NotImplementedError

    def read_counters(self):
        raise NotImplementedError

    def clear_counters(self):
        raise NotImplementedError

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # helpers shared by all backends
    def infer_all(self, x):
        """Predictions for any number of samples, in batches the build accepts."""
        step = self.identify()["max_batch"]
        return np.concatenate([self.infer(x[i:i + step]) for i in range(0, len(x), step)])

    def take_counters(self):
        """Read the counters and clear them."""
        c = self.read_counters()
        self.clear_counters()
        return c


def build_info(build):
    return {
        "build": build.name, "lanes": build.lanes, "weight_words": build.weight_words,
        "act_bytes": build.act_bytes, "grad_words": build.grad_words,
        "scratch_entries": build.scratch_entries,
        "max_batch": build.max_batch, "max_layers": build.max_layers,
        "max_width": build.max_width, "clock_hz": build.clock_hz,
        "features": list(build.features), "version": __version__,
    }


class ModelDevice(Device):
    """The golden model as a device (bit-exact; cycle counters stay zero)."""

    backend = "model"

    def __init__(self, build=spec.DEFAULT_BUILD):
        self.model = GoldenModel(build)

    def identify(self):
        return build_info(self.model.build)

    def configure(self, layers, shifts=None):
        self.model.configure(layers, shifts)

    def load_weights(self, weights):
        self.model.load_weights(weights)

    def read_weights(self):
        return self.model.read_weights()

    def train_batch(self, x, y, settings=StepSettings()):
        return self.model.train_batch(x, y, settings)

    def infer(self, x):
        return self.model.infer(x)

    def read_counters(self):
        return dict(self.model.counters)

    def clear_counters(self):
        self.model.clear_counters()


def open_device(backend="model", build=None, **options):
    """A Device for a backend name."""
    build = spec.BUILDS[build] if isinstance(build, str) else (build or spec.DEFAULT_BUILD)
    if backend == "model":
        return ModelDevice(build)
    raise ConfigError(f"backend '{backend}' is not one of {', '.join(BACKENDS)}")
