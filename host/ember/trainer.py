"""The host trainer: streams mini-batches to a Device with the per-batch policies, evaluates by
on-device inference, and reports accuracy and energy per epoch.

Per batch: SMD decides whether the batch is sent at all (a dropped batch is drawn, counted and
never sent, and still advances the schedule); SLU picks the layer-update mask; the epoch's
schedule gives the learning-rate shift, PSG step and ssProp keep ratio.
"""

import time

import numpy as np

from . import energy, golden, spec
from .policies import (STREAM_INIT, STREAM_LFSR, STREAM_SHUFFLE, STREAM_SMD, LayerMaskPolicy,
                       epoch_settings, rng, with_batch)


def dense_counters(layers, build, batch):
    """The counters of one dense baseline step of `batch` samples (SGD, every layer, no
    skipping). With zero skipping off they do not depend on the data."""
    m = golden.GoldenModel(build)
    m.configure(layers)
    x = np.zeros((batch, layers[0]), dtype=np.int64)
    m.train_batch(x, np.zeros(batch, dtype=np.int64))
    # the dense baseline writes every weight it updates (no write enable on unchanged ones)
    m.counters["weight_writes"] = sum(k * n for k, n in zip(layers[:-1], layers[1:]))
    return m.counters


def add_counters(total, part):
    for k, v in part.items():
        total[k] = total.get(k, 0) + v
    return total


class Trainer:
    """Runs one TrainConfig on one Device and data set."""

    def __init__(self, device, ds, cfg, progress=True):
        self.device, self.ds, self.cfg = device, ds, cfg
        self.progress = progress
        info = device.identify()
        self.build = spec.BUILDS.get(info["build"], spec.DEFAULT_BUILD)
        layers = list(cfg.layers)
        if layers[0] != ds.features:
            raise spec.ConfigError(f"network input width {layers[0]} does not match the data "
                                   f"set's {ds.features} features")
        if layers[-1] < ds.classes:
            raise spec.ConfigError(f"network output width {layers[-1]} is smaller than the "
                                   f"data set's {ds.classes} classes")
        spec.check_network(layers, self.build, cfg.batch_size)
        self.layers = layers
        self.energy = energy.EnergyModel(cfg.profile, self.build)

    def run(self):
        cfg, dev, ds = self.cfg, self.device, self.ds
        start = time.perf_counter()
        dev.configure(self.layers)
        dev.load_weights(golden.init_weights(self.layers, [cfg.seed, STREAM_INIT]))
        dev.clear_counters()
        shuffle = rng(cfg.seed, STREAM_SHUFFLE)
        smd = rng(cfg.seed, STREAM_SMD)
        lfsr = rng(cfg.seed, STREAM_LFSR)
        slu = LayerMaskPolicy(cfg, len(self.layers) - 1)
        dense_per_sample = golden.dense_macs_per_sample(self.layers)
        train_counters = dict.fromkeys(spec.COUNTERS, 0)
        train_counters["skip_smd"] = 0
        eval_counters = dict.fromkeys(spec.COUNTERS, 0)
        dense_energy = 0.0
        dense_cache = {}
        history = []
        n = len(ds.x_train)
        for epoch in range(cfg.epochs):
            base = epoch_settings(cfg, epoch)
            order = shuffle.permutation(n)
            starts = range(0, n, cfg.batch_size)
            bar = _progress(starts, epoch, cfg.epochs, self.progress)
            correct = seen = dropped = 0
            for i in bar:
                idx = order[i:i + cfg.batch_size]
                b = len(idx)
                if b not in dense_cache:
                    dense_cache[b] = self.energy.total(dense_counters(self.layers, self.build, b))
                dense_energy += dense_cache[b]
                if cfg.smd > 0 and smd.random() < cfg.smd:
                    dropped += 1
                    train_counters["skip_smd"] += b * dense_per_sample
                    continue
                settings = with_batch(base, slu.next_mask(), int(lfsr.integers(1, 1 << 16)))
                correct += dev.train_batch(ds.x_train[idx], ds.y_train[idx], settings)
                seen += b
            add_counters(train_counters, dev.take_counters())
            test_acc = float((dev.infer_all(ds.x_test) == ds.y_test).mean())
            add_counters(eval_counters, dev.take_counters())
            spent = self.energy.total(train_counters)
            history.append({
                "epoch": epoch + 1,
                "train_accuracy": correct / seen if seen else None,
                "test_accuracy": test_acc,
                "batches_dropped": dropped,
                "energy_pj": spent,
                "dense_energy_pj": dense_energy,
                "keep_q8": base.keep_q8, "lr_shift": base.lr_shift,
                "psg_step_shift": base.psg_step_shift,
            })
            if self.progress:
                _log(history[-1])
        weights = dev.read_weights()
        spent = self.energy.total(train_counters)
        last = history[-1]
        return {
            "backend": dev.backend,
            "build": dev.identify(),
            "settings": cfg.to_dict(),
            "epochs": cfg.epochs,
            "train_accuracy": last["train_accuracy"],
            "test_accuracy": last["test_accuracy"],
            "counters": train_counters,
            "eval_counters": eval_counters,
            "profile": self.energy.name,
            "energy_pj": spent,
            "energy_breakdown": self.energy.grouped(train_counters),
            "dense_energy_pj": dense_energy,
            "saved_pj": dense_energy - spent,
            "saved_fraction": 1.0 - spent / dense_energy if dense_energy else 0.0,
            "skipped": {r: train_counters[f"skip_{r}"] for r in spec.SKIP_REASONS},
            "macs": {k: train_counters[k] for k in ("mac_forward", "mac_input_grad",
                                                   "mac_weight_grad", "mac_weight_grad_low")},
            "dense_macs": dense_per_sample * n * cfg.epochs,
            "history": history,
            "weights_sha256": golden.weights_sha256(weights),
            "wall_s": time.perf_counter() - start,
        }


def _progress(it, epoch, epochs, enabled):
    if not enabled:
        return it
    try:
        from tqdm import tqdm
    except ImportError:        # tqdm is a declared dependency; a bare environment still trains
        return it
    return tqdm(it, desc=f"epoch {epoch + 1}/{epochs}", unit="batch", leave=False)


def _log(h):
    import sys
    tr = "   -  " if h["train_accuracy"] is None else f"{100 * h['train_accuracy']:5.1f}%"
    print(f"epoch {h['epoch']:3d}  train {tr}  test {100 * h['test_accuracy']:5.1f}%  "
          f"energy {h['energy_pj'] / 1e6:9.2f} uJ  ({100 * (1 - h['energy_pj'] / h['dense_energy_pj']):4.1f}% saved)"
          f"  dropped {h['batches_dropped']}", file=sys.stderr)
