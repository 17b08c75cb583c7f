"""The host trainer: streams mini-batches to a Device with the per-batch policies, evaluates by
on-device inference, and reports accuracy and energy per epoch.

Per batch: SMD decides whether the batch is sent at all (a dropped batch is drawn, counted and
never sent, and still advances the schedule); SLU picks the layer-update mask; the epoch's
schedule gives the learning-rate shift, PSG step and ssProp keep ratio.

Checkpoints
-----------
With ``checkpoint=PATH`` the trainer writes, after every epoch, everything a run needs to go on
from there; ``resume=load_checkpoint(PATH)`` goes on from it. A run interrupted after epoch e
and resumed ends with the same weights, counters (link bytes included), energy and history as
one that ran straight through, and writing checkpoints changes none of them.

A checkpoint is one JSON object (format ``"ember-checkpoint"``, ``"version"`` 2)::

    format, version     "ember-checkpoint", 2
    epoch               epochs completed (the run goes on at epoch + 1)
    settings            the TrainConfig, as in the result JSON (layers resolved)
    input_scaling       the per-feature input scaling fitted on the training split
                        (data.Scaling.to_dict: kind, offset, scale, base), applied to every
                        sample the network sees, at training and at inference
    build, backend      the device's build name (must match on resume) and backend (informative)
    data_sha256         SHA-256 of the quantized split data set (must match on resume)
    weights             integer weights read back from the device: one list per layer of N rows
                        of K Q1.14 ints (layer 0 is the input side)
    weights_sha256      golden.weights_sha256 of `weights`, checked on load
    history             the per-epoch history so far
    train_counters, eval_counters, dense_energy_pj
                        the run's accumulated counters and dense-baseline energy
    rng                 bit_generator.state of the shuffle, smd and lfsr Generators, and
                        LayerMaskPolicy.state() as slu
    link_seq            sequence number of the frame that cleared the device's counters at the
                        end of the epoch (null for a device without a link)
    notes               free-form labels from the caller (the CLI stores the preset name)

Version 1 checkpoints (ember 0.1) hold no input_scaling: their data were scaled by one range
for all features. They load with settings.scaling "global" (data.LEGACY_SCALING), which
refits that range on the same training split (data_sha256 proves the data are the same), or
"minmax" for the digits, whose fixed pixel range both scalings use.

Why link_seq: link byte counters include SLIP escapes of each response's sequence number and
CRC, so they depend on where the link's sequence number stands. After the epoch's counters are
read and cleared, reading the weights back costs link bytes and frames; the trainer then clears
the counters again with the same sequence number as the epoch's clear, which leaves the device
and the link exactly as they were without the checkpoint. A resume loads the weights, repeats
the last evaluation (so the device's batch descriptors are as the run left them) and clears the
same way, so both runs go on from identical device states.
"""

import copy
import hashlib
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace

import numpy as np

from . import data, energy, golden, spec
from .device import build_of
from .policies import (STREAM_INIT, STREAM_LFSR, STREAM_SHUFFLE, STREAM_SMD, LayerMaskPolicy,
                       epoch_settings, rng)
from .schedule import draw_epoch
from .spec import ConfigError

CHECKPOINT_FORMAT = "ember-checkpoint"
CHECKPOINT_VERSION = 2
#: versions load_checkpoint reads (1: before input_scaling was stored)
CHECKPOINT_VERSIONS = (1, 2)
_CHECKPOINT_KEYS = ("epoch", "settings", "build", "data_sha256", "weights", "weights_sha256",
                    "history", "train_counters", "eval_counters", "dense_energy_pj", "rng",
                    "link_seq")


def dense_counters(layers, build, batch, resident=False):
    """The counters of one dense baseline step of `batch` samples (SGD, every layer, no
    skipping). With zero skipping off they do not depend on the data. `resident`: the run
    trains from the device's data memory, so the dense step reads its samples from there too
    (`data_reads`: each sample's words, as the gather does)."""
    m = golden.GoldenModel(build)
    m.configure(layers)
    x = np.zeros((batch, layers[0]), dtype=np.int64)
    m.train_batch(x, np.zeros(batch, dtype=np.int64))
    # the dense baseline writes every weight it updates (no write enable on unchanged ones)
    m.counters["weight_writes"] = sum(k * n for k, n in zip(layers[:-1], layers[1:]))
    if resident:
        m.counters["data_reads"] = batch * spec.sample_data_words(layers[0])
    return m.counters


def dense_run_counters(layers, build, samples, batch_size, epochs, resident=False):
    """The dense baseline's counters over a whole run: every batch of every epoch (the
    trainer's batches: `samples` in steps of `batch_size`, the last one short); `resident`
    as for dense_counters."""
    total = {}
    sizes = [min(batch_size, samples - i) for i in range(0, samples, batch_size)]
    for b in set(sizes):
        c = dense_counters(layers, build, b, resident)
        for k, v in c.items():
            total[k] = total.get(k, 0) + v * sizes.count(b) * epochs
    return total


def check_fit(cfg, ds, build):
    """Raise ConfigError unless the run `cfg` (layers resolved) on data set `ds` fits `build`:
    the data set's width, the network's ends, every width and memory, the optional units.
    Touches no device, so the CLI calls it before it opens one."""
    layers = list(cfg.layers)
    if ds.features > build.max_width:
        raise ConfigError(f"data set {ds.name} has {ds.features} features; build "
                          f"'{build.name}' takes at most {build.max_width} inputs per sample")
    if layers[0] != ds.features:
        raise ConfigError(f"network input width {layers[0]} does not match the data "
                          f"set's {ds.features} features")
    if layers[-1] < ds.classes:
        raise ConfigError(f"network output width {layers[-1]} is smaller than the "
                          f"data set's {ds.classes} classes")
    spec.check_features(cfg.needs(), build)
    spec.check_network(layers, build, cfg.batch_size)
    return layers


#: --resident: where the training data lives during a run
RESIDENT_MODES = ("auto", "on", "off")


def resident_plan(mode, ds, layers, build):
    """(training split resident, test split resident) for a run in --resident `mode`:
    "off" streams every batch; "on" needs the build's resident data unit and room for the
    training split (ConfigError naming what is missing, before anything is trained); "auto"
    keeps what fits and streams the rest. The test split is resident when it fits beside the
    training split, else evaluation streams."""
    if mode not in RESIDENT_MODES:
        raise ConfigError(f"--resident {mode!r} is not one of {', '.join(RESIDENT_MODES)}")
    if mode == "off":
        return False, False
    has_unit = "resident" in build.features

    per_sample = spec.sample_data_bytes(layers[0])

    def fits(samples):
        return samples * per_sample <= build.data_bytes and samples <= build.data_samples

    n_train, n_test = len(ds.x_train), len(ds.x_test)
    if mode == "on" and not has_unit:
        raise ConfigError(f"--resident on: build '{build.name}' has no resident data memory "
                          f"(its units: {', '.join(build.features)}); use --resident auto or "
                          "off to stream the batches")
    if mode == "on" and not fits(n_train):
        raise ConfigError(f"--resident on: the training split needs {n_train * per_sample:,} "
                          f"bytes and {n_train:,} labels ({n_train:,} samples x {per_sample} "
                          f"bytes); build '{build.name}' holds {build.data_bytes:,} bytes and "
                          f"{build.data_samples:,} labels of resident data; use --resident "
                          "off to stream the batches")
    train = has_unit and fits(n_train)
    return train, train and fits(n_train + n_test)


def add_counters(total, part):
    for k, v in part.items():
        total[k] = total.get(k, 0) + v
    return total


def data_sha256(ds):
    """SHA-256 of a data set's quantized train/test split (what the device is fed)."""
    h = hashlib.sha256()
    for a in (ds.x_train, ds.y_train, ds.x_test, ds.y_test):
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def save_checkpoint(path, checkpoint):
    """Write a checkpoint dict atomically: a temporary file next to `path`, then os.replace,
    so `path` always holds a complete checkpoint (the previous one until the new is whole)."""
    doc = dict(checkpoint)
    doc["weights"] = [np.asarray(w).tolist() for w in checkpoint["weights"]]
    if isinstance(doc.get("input_scaling"), data.Scaling):   # None: a Dataset made without one
        doc["input_scaling"] = doc["input_scaling"].to_dict()
    doc = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, **doc}
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_checkpoint_json(path):
    """The JSON document of checkpoint file `path` (a single device's or a fleet's); raises
    ConfigError if the file is missing or not JSON."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"checkpoint {path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"checkpoint {path} is not readable JSON ({e})") from None


def load_checkpoint(path):
    """Read and check a checkpoint written by `save_checkpoint`; weights come back as int16
    arrays. Raises ConfigError naming the file and what is wrong with it."""
    doc = read_checkpoint_json(path)
    if not isinstance(doc, dict) or doc.get("format") != CHECKPOINT_FORMAT:
        raise ConfigError(f"{path} is not an Ember checkpoint (no \"format\": "
                          f"\"{CHECKPOINT_FORMAT}\")")
    if doc.get("version") not in CHECKPOINT_VERSIONS:
        raise ConfigError(f"checkpoint {path} has format version {doc.get('version')!r}; this "
                          f"ember reads versions {', '.join(map(str, CHECKPOINT_VERSIONS))}")
    keys = _CHECKPOINT_KEYS + (("input_scaling",) if doc["version"] >= 2 else ())
    missing = [k for k in keys if k not in doc]
    if missing:
        raise ConfigError(f"checkpoint {path} lacks {', '.join(missing)}")
    try:
        weights = [np.asarray(w, dtype=np.int64) for w in doc["weights"]]
    except (TypeError, ValueError) as e:
        raise ConfigError(f"checkpoint {path}: weights are not integer matrices ({e})") from None
    for i, w in enumerate(weights):
        if w.ndim != 2 or w.size and (w.min() < -(1 << 15) or w.max() >= 1 << 15):
            raise ConfigError(f"checkpoint {path}: layer {i} weights are not an int16 matrix "
                              f"(shape {w.shape})")
    doc["weights"] = [w.astype(np.int16) for w in weights]
    if golden.weights_sha256(doc["weights"]) != doc["weights_sha256"]:
        raise ConfigError(f"checkpoint {path}: the weights do not match their weights_sha256 "
                          f"{doc['weights_sha256']} (the file was changed or damaged)")
    layers = [int(weights[0].shape[1])] + [int(w.shape[0]) for w in weights] if weights else []
    settings = doc["settings"] if isinstance(doc["settings"], dict) else {}
    if settings.get("layers") != layers:
        raise ConfigError(f"checkpoint {path}: its weights make network {layers}; its settings "
                          f"say layers {settings.get('layers')!r}")
    if doc["version"] == 1:
        # ember 0.1 scaled every feature by one range; the digits by their fixed pixel range,
        # which is what minmax means for them now
        digits = settings.get("dataset") in (None, "digits")
        settings["scaling"] = "minmax" if digits else data.LEGACY_SCALING
        doc["input_scaling"] = data.load_digits().scaling.to_dict() if digits else None
    if doc["input_scaling"] is not None:
        scaling = data.Scaling.from_dict(doc["input_scaling"], f"checkpoint {path}")
        if scaling.features != layers[0]:
            raise ConfigError(f"checkpoint {path}: its input scaling has {scaling.features} "
                              f"features; its network takes {layers[0]} inputs")
        doc["input_scaling"] = scaling
    doc["path"] = str(path)
    return doc


def _link(device):
    """The device's link if it has one (EngineDevice: the model, sim and board backends)."""
    link = getattr(device, "link", None)
    return link if link is not None and isinstance(getattr(link, "seq", None), int) else None


def _clear_counters_as(device, seq):
    """Clear the device's counters with a frame of sequence number `seq`: the response, and so
    the link bytes counted after the clear, are then the same as those of an earlier clear
    with that number. The caller has read from the device since that clear, so the device
    does not take this one for a duplicate (docs/protocol.md)."""
    link = _link(device)
    if link is not None and seq is not None:
        link.seq = seq
    device.clear_counters()


@dataclass
class _RunState:
    """What changes from epoch to epoch: the part of a run a checkpoint holds."""
    shuffle: np.random.Generator
    smd: np.random.Generator
    lfsr: np.random.Generator
    slu: LayerMaskPolicy
    epoch: int = 0                  # epochs completed
    history: list = field(default_factory=list)
    train_counters: dict = field(default_factory=dict)
    eval_counters: dict = field(default_factory=dict)
    dense_energy: float = 0.0
    link_seq: int | None = None     # seq of the clear that ended the last epoch


class Trainer:
    """Runs one TrainConfig on one Device and data set.

    checkpoint: a path to write a checkpoint to after every epoch (see the module docstring).
    resume:     a checkpoint from `load_checkpoint` to go on from; it must have been written
                with the same settings, build and data set (checked here, before the device
                is touched).
    notes:      a JSON-able dict stored in checkpoints as they are (e.g. the preset name).
    resident:   "auto", "on" or "off" (RESIDENT_MODES, resident_plan): upload the data into
                the device's resident data memory once and train each epoch with one
                command (train_epoch), or stream every batch. The weights and event
                counters are the same either way; only the link bytes differ.
    """

    def __init__(self, device, ds, cfg, progress=True, checkpoint=None, resume=None,
                 notes=None, resident="auto"):
        info = device.identify()
        self.build = build_of(info)
        self.build_name = info["build"]
        cfg = cfg.for_data(ds)
        if cfg.profile is None:         # the build's own: its board's, else horowitz45
            cfg = replace(cfg, profile=energy.profile_for(self.build))
        self.device, self.ds, self.cfg = device, ds, cfg
        self.progress = progress
        self.checkpoint, self.resume, self.notes = checkpoint, resume, dict(notes or {})
        # every width, memory and unit any batch of the run may use, before anything is trained
        self.layers = check_fit(cfg, ds, self.build)
        self.resident = resident_plan(resident, ds, self.layers, self.build)
        self.upload_link_bytes = 0      # the resident splits' upload (not in the counters)
        self.final = None           # (state, weights) once run() has finished
        self.energy = energy.EnergyModel(cfg.profile, self.build)
        self.data_sha256 = data_sha256(ds)
        if resume is not None:
            self._check_resume(resume)

    def _check_resume(self, ckpt):
        where = f"checkpoint {ckpt.get('path', '')}".rstrip()
        settings = self.cfg.to_dict()
        diff = [f"{k} {settings.get(k)!r} (checkpoint: {ckpt['settings'].get(k)!r})"
                for k in sorted(set(settings) | set(ckpt["settings"]))
                if settings.get(k) != ckpt["settings"].get(k)]
        if diff:
            raise ConfigError(f"{where} was written with other settings: {', '.join(diff)}")
        if ckpt["build"] != self.build_name:
            raise ConfigError(f"{where} was written on build '{ckpt['build']}'; this device is "
                              f"build '{self.build_name}'")
        if ckpt["data_sha256"] != self.data_sha256:
            raise ConfigError(f"{where} was trained on other data than data set "
                              f"'{self.cfg.dataset}' holds now (data_sha256 "
                              f"{ckpt['data_sha256'][:12]}... vs {self.data_sha256[:12]}...)")
        if not 1 <= ckpt["epoch"] <= self.cfg.epochs or len(ckpt["history"]) != ckpt["epoch"]:
            raise ConfigError(f"{where} holds epoch {ckpt['epoch']} with "
                              f"{len(ckpt['history'])} history entries; a run of "
                              f"{self.cfg.epochs} epochs resumes from epoch 1..{self.cfg.epochs}")
        golden.check_weights(self.layers, ckpt["weights"])

    def _fresh_state(self):
        cfg, dev = self.cfg, self.device
        dev.configure(self.layers)
        dev.load_weights(golden.init_weights(self.layers, [cfg.seed, STREAM_INIT]))
        dev.clear_counters()
        self._upload()
        train_counters = dict.fromkeys(spec.COUNTERS, 0)
        train_counters["skip_smd"] = 0
        return _RunState(shuffle=rng(cfg.seed, STREAM_SHUFFLE), smd=rng(cfg.seed, STREAM_SMD),
                         lfsr=rng(cfg.seed, STREAM_LFSR),
                         slu=LayerMaskPolicy(cfg, len(self.layers) - 1),
                         train_counters=train_counters,
                         eval_counters=dict.fromkeys(spec.COUNTERS, 0))

    def _resumed_state(self, ckpt):
        """Put the device where the checkpointed run left it: weights loaded, the last
        evaluation repeated (so the device holds what it held then), counters cleared by a
        frame with the same sequence number as that run's last clear."""
        cfg, dev = self.cfg, self.device
        dev.configure(self.layers)
        dev.load_weights(ckpt["weights"])
        test_acc = float((dev.infer_all(self.ds.x_test) == self.ds.y_test).mean())
        weights = dev.read_weights()
        if golden.weights_sha256(weights) != ckpt["weights_sha256"]:
            raise ConfigError(f"the device holds weights {golden.weights_sha256(weights)[:12]}"
                              f"... after loading checkpoint weights "
                              f"{ckpt['weights_sha256'][:12]}...")
        if test_acc != ckpt["history"][-1]["test_accuracy"]:
            raise ConfigError(f"the checkpoint's weights give test accuracy {test_acc} on this "
                              f"device; the checkpoint recorded "
                              f"{ckpt['history'][-1]['test_accuracy']}")
        self._upload()
        state = _RunState(shuffle=rng(cfg.seed, STREAM_SHUFFLE), smd=rng(cfg.seed, STREAM_SMD),
                          lfsr=rng(cfg.seed, STREAM_LFSR),
                          slu=LayerMaskPolicy(cfg, len(self.layers) - 1),
                          epoch=ckpt["epoch"], history=[dict(h) for h in ckpt["history"]],
                          train_counters=dict(ckpt["train_counters"]),
                          eval_counters=dict(ckpt["eval_counters"]),
                          dense_energy=float(ckpt["dense_energy_pj"]),
                          link_seq=ckpt["link_seq"])
        for name in ("shuffle", "smd", "lfsr"):
            getattr(state, name).bit_generator.state = ckpt["rng"][name]
        state.slu.restore(ckpt["rng"]["slu"])
        if self.resident[0] and 0 < state.epoch < cfg.epochs:
            # the run resumed sent this epoch's schedule while its last epoch ran: here, with
            # the upload (its link bytes not counted), into the half it went to there
            dev.preload_schedule(self._draw_ahead(state, state.epoch - 1, len(self.ds.x_train)),
                                 state.epoch % 2)
        _clear_counters_as(dev, ckpt["link_seq"])
        return state

    def _upload(self):
        """Put the resident splits on the device (resident_plan) and clear the counters: the
        upload's link bytes are reported apart (upload_link_bytes), so a run's counters are
        the same streaming or resident, and a resumed run's the same as one that ran
        straight through."""
        train, test = self.resident
        if not train:
            return
        ds = self.ds
        self.device.load_data(ds.x_train, ds.y_train, *((ds.x_test, ds.y_test) if test else ()))
        # the programs the epochs and evaluations run, with the upload (PSG's settings are
        # the run's, the same every epoch)
        self.device.prepare_epochs(self.cfg.batch_size, self.cfg.psg and self.cfg.psg_relative)
        c = self.device.take_counters()
        self.upload_link_bytes = c["link_rx_bytes"] + c["link_tx_bytes"]

    def _write_checkpoint(self, state):
        dev = self.device
        weights = dev.read_weights()
        # reading the weights cost link bytes after the epoch's clear: clear again as then
        _clear_counters_as(dev, state.link_seq)
        save_checkpoint(self.checkpoint, self._checkpoint(state, weights))

    def save(self, path):
        """Write the finished run's checkpoint to `path` (what --checkpoint writes after the
        last epoch), from what run() read back; the device is not touched."""
        if self.final is None:
            raise ConfigError("the run has not finished; call run() before save()")
        save_checkpoint(path, self._checkpoint(*self.final))

    def _checkpoint(self, state, weights):
        return {
            "epoch": state.epoch,
            "settings": self.cfg.to_dict(),
            "build": self.build_name,
            "backend": self.device.backend,
            "data_sha256": self.data_sha256,
            "weights": weights,
            "weights_sha256": golden.weights_sha256(weights),
            "history": state.history,
            "train_counters": state.train_counters,
            "eval_counters": state.eval_counters,
            "dense_energy_pj": state.dense_energy,
            "rng": {"shuffle": state.shuffle.bit_generator.state,
                    "smd": state.smd.bit_generator.state,
                    "lfsr": state.lfsr.bit_generator.state,
                    "slu": state.slu.state()},
            "link_seq": state.link_seq,
            "notes": self.notes,
            "input_scaling": self.ds.scaling,
        }

    def _stream_epoch(self, sched, epoch):
        """Send the schedule's kept batches one by one; returns the samples they got right."""
        ds, correct = self.ds, 0
        bar = _progress(sched.batches(), epoch, self.cfg.epochs, self.progress,
                        len(sched.drops))
        for idx, drop, settings in bar:
            if not drop:
                correct += self.device.train_batch(ds.x_train[idx], ds.y_train[idx], settings)
        return correct

    def _draw_ahead(self, s, epoch, n):
        """The next epoch's schedule, drawn from copies of the run's streams (which stay as
        they are, so a checkpoint and a resumed run see them as without it), for the device
        to receive while this epoch runs; None after the last epoch."""
        if epoch + 1 >= self.cfg.epochs:
            return None
        streams = copy.deepcopy((s.shuffle, s.smd, s.slu, s.lfsr))
        return draw_epoch(self.cfg, epoch_settings(self.cfg, epoch + 1), n, *streams)

    def run(self):
        cfg, dev, ds = self.cfg, self.device, self.ds
        start = time.perf_counter()
        if self.resume is not None:
            s = self._resumed_state(self.resume)
            if self.progress:
                print(f"resuming from {self.resume.get('path', 'a checkpoint')} after epoch "
                      f"{s.epoch}/{cfg.epochs}", file=sys.stderr)
        else:
            s = self._fresh_state()
        dense_per_sample = golden.dense_macs_per_sample(self.layers)
        dense_cache = {}
        n = len(ds.x_train)
        for epoch in range(s.epoch, cfg.epochs):
            base = epoch_settings(cfg, epoch)
            sched = draw_epoch(cfg, base, n, s.shuffle, s.smd, s.slu, s.lfsr)
            for b, drop in zip(sched.batch_sizes(), sched.drops):
                if b not in dense_cache:
                    dense_cache[b] = self.energy.total(
                        dense_counters(self.layers, self.build, b, self.resident[0]))
                s.dense_energy += dense_cache[b]
                s.train_counters["skip_smd"] += b * dense_per_sample if drop else 0
            dropped = sum(sched.drops)
            seen = n - sum(b for b, d in zip(sched.batch_sizes(), sched.drops) if d)
            correct = dev.train_epoch(sched, self._draw_ahead(s, epoch, n)) \
                if self.resident[0] else self._stream_epoch(sched, epoch)
            add_counters(s.train_counters, dev.take_counters())
            if self.resident[1]:
                test_acc = dev.evaluate_resident() / len(ds.x_test)
            else:
                test_acc = float((dev.infer_all(ds.x_test) == ds.y_test).mean())
            # take_counters, noting the clear's sequence number for _clear_counters_as
            add_counters(s.eval_counters, dev.read_counters())
            link = _link(dev)
            s.link_seq = link.seq if link is not None else None
            dev.clear_counters()
            grouped = self.energy.grouped(s.train_counters)
            s.history.append({
                "epoch": epoch + 1,
                "train_accuracy": correct / seen if seen else None,
                "test_accuracy": test_acc,
                "batches_dropped": dropped,
                "energy_pj": sum(grouped.values()),
                "dense_energy_pj": s.dense_energy,
                # as the run's saved_fraction: both sides without link and clock energy
                "saved_fraction": energy.saved(grouped, s.dense_energy)[1],
                "keep_q8": base.keep_q8, "lr_shift": base.lr_shift,
                "psg_step_shift": base.psg_step_shift,
            })
            s.epoch = epoch + 1
            if self.progress:
                _log(s.history[-1])
            if self.checkpoint:
                self._write_checkpoint(s)
        weights = dev.read_weights()
        wall_s = time.perf_counter() - start
        self.final = (s, weights)
        train_counters, dense_energy, history = s.train_counters, s.dense_energy, s.history
        grouped = self.energy.grouped(train_counters)
        saved_pj, saved_fraction = energy.saved(grouped, dense_energy)
        dense_run = dense_run_counters(self.layers, self.build, n, cfg.batch_size, cfg.epochs,
                                       self.resident[0])
        models = [self.energy] + [energy.EnergyModel(name, self.build) for name in
                                  energy.profiles_for(self.build, cfg.profile)[1:]]
        by_profile = {m.name: energy.report(m, train_counters, dense_run) for m in models}
        last = history[-1]
        return {
            "backend": self.device.backend,
            "build": dev.identify(),
            "settings": cfg.to_dict(),
            "input_scaling": ds.scaling.to_dict() if ds.scaling is not None else None,
            "epochs": cfg.epochs,
            "train_accuracy": last["train_accuracy"],
            "test_accuracy": last["test_accuracy"],
            "counters": train_counters,
            "eval_counters": s.eval_counters,
            "profile": self.energy.name,
            "energy_pj": sum(grouped.values()),
            "energy_breakdown": grouped,
            "dense_energy_pj": dense_energy,
            # link and clock energy are in the run's counters only (energy.saved)
            "saved_pj": saved_pj,
            "saved_fraction": saved_fraction,
            "energy_by_profile": by_profile,
            "skipped": {r: train_counters[f"skip_{r}"] for r in spec.SKIP_REASONS},
            "macs": {k: train_counters[k] for k in ("mac_forward", "mac_input_grad",
                                                   "mac_weight_grad", "mac_weight_grad_low")},
            "dense_macs": dense_per_sample * n * cfg.epochs,
            "history": history,
            "weights_sha256": golden.weights_sha256(weights),
            "wall_s": wall_s,
            # where the data lived: each split resident on the device or streamed, and the
            # link bytes of the resident splits' upload (before the first epoch's counters)
            "resident": {"train": self.resident[0], "test": self.resident[1],
                         "upload_link_bytes": self.upload_link_bytes},
            # simulated engine cycles (the `cycles` counter: cycles a command ran) per wall
            # second of the run; 0 on the model backend, whose cycle counters stay zero
            "sim_cycles_per_s": (train_counters["cycles"] + s.eval_counters["cycles"]) / wall_s,
            **(link.resend_counts() if (link := _link(dev)) is not None else {}),
        }


def _progress(it, epoch, epochs, enabled, total=None):
    if not enabled:
        return it
    try:
        from tqdm import tqdm
    except ImportError:        # tqdm is a declared dependency; a bare environment still trains
        return it
    # disable=None: no bar when stderr is not a terminal (logs, CI)
    return tqdm(it, desc=f"epoch {epoch + 1}/{epochs}", unit="batch", leave=False, disable=None,
                total=total)


def _log(h):
    tr = "   -  " if h["train_accuracy"] is None else f"{100 * h['train_accuracy']:5.1f}%"
    print(f"epoch {h['epoch']:3d}  train {tr}  test {100 * h['test_accuracy']:5.1f}%  "
          f"energy {h['energy_pj'] / 1e6:9.2f} uJ  ({100 * h['saved_fraction']:4.1f}% saved)"
          f"  dropped {h['batches_dropped']}", file=sys.stderr)
