"""Ember: energy-frugal on-device training for open-toolchain FPGAs (host package).

The host API (ember.api, docs/api.md)::

    import ember
    with ember.open_device("sim") as device:      # "model", "sim", or a board's port
        net = ember.train(device, ember.load_dataset("digits"), preset="e2train")
        print(net.test_accuracy, net.energy)

Energy is in pJ, work in samples, device time in engine clock cycles.
"""

__version__ = "0.1.0"

# after __version__: the modules below import it
from .api import (EnergyReport, Network, load_checkpoint, load_dataset,  # noqa: E402
                  open_device, train)
from .data import SCALINGS, Dataset  # noqa: E402
from .device import CommandStopped  # noqa: E402
from .policies import PRESETS, TrainConfig, make_config  # noqa: E402
from .protocol import LinkError  # noqa: E402
from .spec import ConfigError  # noqa: E402

__all__ = ["open_device", "load_dataset", "train", "load_checkpoint", "Network",
           "EnergyReport", "Dataset", "TrainConfig", "make_config", "PRESETS", "SCALINGS",
           "ConfigError", "LinkError", "CommandStopped", "__version__"]
