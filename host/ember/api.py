"""Ember's host API: drive on-device training from a Python script.

    import ember

    with ember.open_device("sim") as device:       # a real board: ember.open_device("/dev/ttyUSB1")
        digits = ember.load_dataset("digits")
        net = ember.train(device, digits, preset="e2train", epochs=5, batch_size=16)
        print(net.test_accuracy, net.energy)
        net.predict(raw_samples)                   # classes, scaled as the training split was
        net.save("digits.ckpt")                    # ember.load_checkpoint("digits.ckpt", device)

The pieces are the ones `ember train` uses: a Device (ember.device) on one of three backends,
a Dataset whose inputs are scaled per feature on its training split (ember.data), a
TrainConfig (ember.policies) and the Trainer (ember.trainer). Errors are ConfigError (a bad
setting, data set or checkpoint, raised before the device is changed) and LinkError (the
device stopped answering). Units: energy in picojoules (pJ), work in samples and MACs, time
on the device in engine clock cycles (the sim and board backends count them; the model
leaves them at 0), accuracies as fractions in [0, 1]. docs/api.md has the whole API.
"""

import dataclasses
from pathlib import Path

import numpy as np

from . import data, energy, golden, spec
from .device import BACKENDS, Device
from .device import open_device as _open_backend
from .policies import TrainConfig, make_config
from .spec import ConfigError
from .trainer import Trainer, load_checkpoint as _read_checkpoint, save_checkpoint


def open_device(target="model", *, build=None, simulator="verilator", baud=None,
                port=None, **options):
    """Open an Ember engine; use it as a context manager (or call close()).

    target: "model" (the bit-exact golden model in this process), "sim" (the engine's RTL in
            Verilator, or Icarus with simulator="icarus", in a child process; its first start
            builds the RTL, about 40 s), "board" with port=..., or directly a serial port name
            or pyserial URL ("/dev/ttyUSB1", "socket://host:port"): a real board.
    build:  the build name (spec.BUILDS) whose limits the model and sim backends take
            (default "sim"); a board reports its own.
    baud:   a board's baud rate (bits per second); default the rate of Ember's board
            bitstreams (device.open_board). The board's BAUD register must match it.
    Other options go to the backend (device.open_sim: uart=True, log=PATH).
    """
    if target not in BACKENDS:
        if not isinstance(target, str) or not ("/" in target or "://" in target or
                                               target.upper().startswith("COM")):
            raise ConfigError(f"device {target!r} is not one of {', '.join(BACKENDS)}, nor a "
                              f"serial port name or URL (/dev/ttyUSB1, COM3, socket://...)")
        port, target = target, "board"
    if target == "board":
        return _open_backend("board", port=port, baud=baud, **options)
    return _open_backend(target, build=build, simulator=simulator, **options)


def load_dataset(source="digits", y=None, *, scaling="minmax", name=None, split_seed=0,
                 test_fraction=0.2):
    """A train/test split with its inputs scaled per feature on the training split.

    source:  "digits" (the bundled 1,797 8x8 images, 10 classes), a path to an .npz with
             arrays X (samples, features) and y (samples,), or an array X itself, with
             labels y (integers 0..classes-1).
    scaling: "minmax" (default), "standard" or "none" (ember.data explains each).
    split_seed, test_fraction: the seeded split (the CLI uses seed 0 and 0.2).
    """
    data.check_scaling_kind(scaling)
    if isinstance(source, str) and source == "digits":
        if test_fraction != 0.2:
            raise ConfigError("the digits' split is fixed at test_fraction 0.2")
        return data.load_digits(split_seed, scaling)
    if isinstance(source, (str, Path)):
        if y is not None:
            raise ConfigError(f"give labels in the .npz {source}, not as y")
        x, labels, files = data.read_npz(source)
        if labels is None:
            raise ConfigError(f"data set {source} lacks array(s) ['y']; it has {files}")
        return data.from_arrays(x, labels, name or str(source), split_seed, test_fraction,
                                scaling)
    if y is None:
        raise ConfigError("load_dataset(X, y): arrays need their labels y")
    return data.from_arrays(source, y, name or "arrays", split_seed, test_fraction, scaling)


@dataclasses.dataclass(frozen=True)
class EnergyReport:
    """What a training run spent, by the energy model (docs/energy.md).

    energy_pj:        energy of the training work done on the device, in pJ
    dense_energy_pj:  what plain dense SGD over the same batches would have cost, in pJ
    saved_pj, saved_fraction: their difference, in pJ and as a fraction of the dense cost
    by_component_pj:  energy_pj split by unit and memory (forward_macs, weight_memory, ...)
    skipped_macs:     MACs not done, by reason (smd, slu, ssprop, psg, zero)
    samples:          training samples the device ran (dropped batches excluded)
    cycles:           engine clock cycles of training (0 on the model backend)
    profile:          the energy profile's name
    """
    energy_pj: float
    dense_energy_pj: float
    saved_pj: float
    saved_fraction: float
    by_component_pj: dict
    skipped_macs: dict
    samples: int
    cycles: int
    profile: str

    @property
    def pj_per_sample(self):
        """Training energy per sample the device ran, in pJ."""
        return self.energy_pj / self.samples if self.samples else 0.0

    @classmethod
    def from_counters(cls, counters, dense_energy_pj, profile, build):
        """The report of accumulated training counters (spec.COUNTERS plus skip_smd). Saved
        compares what the dense baseline counts: link and clock energy are left out of it
        (energy.UNCOUNTED_IN_DENSE), as in the trainer's report."""
        model = energy.EnergyModel(profile, build)
        grouped = model.grouped(counters)
        saved_pj, saved_fraction = energy.saved(grouped, dense_energy_pj)
        return cls(energy_pj=sum(grouped.values()), dense_energy_pj=dense_energy_pj,
                   saved_pj=saved_pj, saved_fraction=saved_fraction, by_component_pj=grouped,
                   skipped_macs={r: counters.get(f"skip_{r}", 0) for r in spec.SKIP_REASONS},
                   samples=counters.get("samples", 0), cycles=counters.get("cycles", 0),
                   profile=model.name)

    def __str__(self):
        return (f"{self.energy_pj / 1e6:.3f} uJ for {self.samples:,} samples "
                f"({self.pj_per_sample / 1e3:.1f} nJ each), dense {self.dense_energy_pj / 1e6:.3f}"
                f" uJ: {100 * self.saved_fraction:.1f} % saved (profile {self.profile})")


class Network:
    """A trained network: its layer widths, integer weights and input scaling, and the run
    that made it. Made by `train` or `load_checkpoint`; predicts on `device`.

    layers:   widths, input first (layers[0] features, layers[-1] outputs >= classes)
    weights:  one int16 Q1.14 matrix (outputs, inputs) per layer
    scaling:  the data.Scaling applied to every raw sample before it reaches the device
    settings: the TrainConfig's fields (a dict)
    result:   the run's full result (what `ember train --json` writes), or None for a network
              loaded from a checkpoint
    device:   the Device predict and evaluate use (None: give one with `use`)
    """

    def __init__(self, layers, weights, scaling, settings, device=None, result=None,
                 checkpoint=None, trainer=None):
        self.layers, self.weights, self.scaling = list(layers), weights, scaling
        self.settings, self.device, self.result = settings, device, result
        self._checkpoint, self._trainer = checkpoint, trainer

    def __repr__(self):
        return (f"<ember.Network {'-'.join(map(str, self.layers))}, {self.scaling.kind} "
                f"scaling, on {getattr(self.device, 'backend', 'no device')}>")

    @property
    def test_accuracy(self):
        """Accuracy on the test split at the end of training (a fraction)."""
        return self._history()[-1]["test_accuracy"]

    @property
    def history(self):
        """Per-epoch accuracies and energy (pJ), as in the result JSON."""
        return self._history()

    def _history(self):
        return (self.result or self._checkpoint)["history"]

    @property
    def energy(self):
        """The EnergyReport of the training run."""
        if self.result is not None:
            r = self.result
            return EnergyReport(energy_pj=r["energy_pj"], dense_energy_pj=r["dense_energy_pj"],
                                saved_pj=r["saved_pj"], saved_fraction=r["saved_fraction"],
                                by_component_pj=dict(r["energy_breakdown"]),
                                skipped_macs=dict(r["skipped"]),
                                samples=r["counters"]["samples"],
                                cycles=r["counters"]["cycles"], profile=r["profile"])
        c = self._checkpoint
        if c["build"] not in spec.BUILDS:
            raise ConfigError(f"checkpoint {c.get('path')} was trained on build '{c['build']}',"
                              f" whose energy costs this ember does not know")
        return EnergyReport.from_counters(c["train_counters"], c["dense_energy_pj"],
                                          self.settings["profile"], spec.BUILDS[c["build"]])

    def use(self, device):
        """Predict and evaluate on `device` from now on; returns self."""
        self.device = device
        return self

    def _load_onto_device(self):
        if self.device is None:
            raise ConfigError("the network has no device; call use(ember.open_device(...))")
        # configure checks the network against the device's build before writing anything
        self.device.configure(self.layers)
        self.device.load_weights(self.weights)

    def _check_features(self, x):
        x = data.check_samples(x, "samples")
        if x.shape[1] != self.layers[0]:
            raise ConfigError(f"network {'-'.join(map(str, self.layers))} takes "
                              f"{self.layers[0]} features; the samples have {x.shape[1]}")
        return x

    def predict(self, x):
        """Predicted classes (int64, one per sample) of raw samples x (samples, features), in
        the data set's own units: scaled as the training split was, then run on the device."""
        inputs = self.scaling.apply(self._check_features(x))
        self._load_onto_device()
        return np.asarray(self.device.infer_all(inputs), dtype=np.int64)

    def evaluate(self, x, y=None):
        """Accuracy (a fraction) on raw samples x with labels y, or on a Dataset's test split
        (which must have been scaled with this network's scaling)."""
        if isinstance(x, data.Dataset):
            ds = x
            if ds.scaling is None or ds.scaling.to_dict() != self.scaling.to_dict():
                raise ConfigError(f"data set {ds.name} was scaled otherwise than the network's "
                                  f"training split; pass raw samples: evaluate(X, y)")
            if ds.features != self.layers[0]:
                self._check_features(ds.x_test)
            self._load_onto_device()
            return float((self.device.infer_all(ds.x_test) == ds.y_test).mean())
        if y is None:
            raise ConfigError("evaluate(X, y): raw samples need their labels y")
        y = np.asarray(y)
        if len(y) != len(x):
            raise ConfigError(f"{len(x)} samples but {len(y)} labels")
        return float((self.predict(x) == y).mean())

    def save(self, path):
        """Write the network as an Ember checkpoint (what `ember train --checkpoint` writes;
        ember predict, ember export and ember train --resume read it)."""
        if self._trainer is not None:
            self._trainer.save(path)
        else:
            doc = {k: v for k, v in self._checkpoint.items()
                   if k not in ("format", "version", "path")}
            save_checkpoint(path, doc)


def _config(config, preset, settings, ds):
    if config is None:
        config = make_config(preset, **settings)
    elif settings or preset != "baseline":
        config = dataclasses.replace(config, **settings).check()
    if not isinstance(config, TrainConfig):
        raise ConfigError(f"config {config!r} is not an ember.TrainConfig")
    if ds.scaling is not None and "scaling" in settings and settings["scaling"] != \
            ds.scaling.kind:
        raise ConfigError(f"data set {ds.name} was loaded with {ds.scaling.kind} scaling; "
                          f"load it with scaling='{settings['scaling']}' instead")
    kind = ds.scaling.kind if ds.scaling is not None else config.scaling
    return dataclasses.replace(config, dataset=ds.name, scaling=kind)


def train(device, dataset, config=None, *, preset="baseline", hidden=None, progress=False,
          checkpoint=None, resident="auto", **settings):
    """Train a network on `device` and return it as a Network (still on that device).

    dataset:   a Dataset from load_dataset
    config:    a TrainConfig; or preset (a name of policies.PRESETS) plus settings, the
               TrainConfig fields: epochs, batch_size (samples), seed, lr_shift, smd, slu,
               psg, ssprop_keep, zero_skip, profile, layers, ...
    hidden:    hidden widths, e.g. (64, 32); the input width and output width come from the
               data set unless layers= says otherwise (default hidden (32,))
    progress:  print per-epoch lines and a progress bar to stderr
    checkpoint: a path to write a resumable checkpoint to after every epoch
    resident:  "auto" (default), "on" or "off": keep the data set in the device's resident
               data memory and train each epoch with one command, or stream every batch
               (the same weights and counters; only the link bytes differ)
    The input scaling is the data set's (load_dataset(scaling=...)); a scaling= setting
    that differs from it is refused. Every setting, width and memory is checked against the
    device's build before training.
    """
    if not isinstance(device, Device):
        raise ConfigError(f"device {device!r} is not an ember device; open one with "
                          f"ember.open_device()")
    if not isinstance(dataset, data.Dataset):
        raise ConfigError(f"dataset {dataset!r} is not an ember Dataset; load one with "
                          f"ember.load_dataset()")
    cfg = _config(config, preset, settings, dataset).for_data(dataset, hidden)
    trainer = Trainer(device, dataset, cfg, progress=progress, checkpoint=checkpoint,
                      notes={"preset": preset} if config is None else {}, resident=resident)
    result = trainer.run()
    weights = trainer.final[1]
    return Network(cfg.layers, weights, dataset.scaling, result["settings"], device, result,
                   trainer=trainer)


def load_checkpoint(path, device=None):
    """A Network from a checkpoint written by `Network.save` or `ember train --checkpoint`;
    it predicts on `device` (or on one given later with `use`). ConfigError names what is
    wrong with a file that is not a whole checkpoint, or that holds no input scaling."""
    doc = _read_checkpoint(path)
    if doc["input_scaling"] is None:
        raise ConfigError(f"checkpoint {path} was written by ember 0.1 for a data set of one's "
                          f"own and holds no input scaling; resume it (ember train --resume) "
                          f"to write one that does")
    golden.check_weights(doc["settings"]["layers"], doc["weights"])
    return Network(doc["settings"]["layers"], doc["weights"], doc["input_scaling"],
                   doc["settings"], device, checkpoint=doc)
