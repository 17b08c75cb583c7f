"""Federated training without the orchestration: how the training data is split across devices,
how one device trains its share of a round, and how the devices' weights are combined.

`ember.fleet` runs these on Ray actors; nothing here needs Ray, so the arithmetic is tested
(and usable) on its own.

Splits (`split_shards`)
-----------------------
iid        the training set in a seeded random order, cut into N shards of near-equal size;
dirichlet  label-skewed shards: for every class, the fractions of its samples that go to the
           N devices are drawn from Dirichlet(alpha, ..., alpha); small alpha gives each device
           few classes, large alpha approaches iid.
Each shard keeps its samples in the data set's order, so one shard of one device is exactly
the data set a plain run trains on.

Rounds (`LocalRun`)
-------------------
Every device trains `epochs` passes over its own shard, exactly as `Trainer` does over the
whole training set: the same per-epoch schedule (learning-rate shift, PSG step, ssProp keep
ratio) and per-batch policies (shuffle, SMD, SLU, LFSR seeds). The run's stream of T batches
(epochs x batches per epoch of its shard) is cut into `rounds` consecutive rounds; round r
holds batches floor(r T / R) .. floor((r + 1) T / R) - 1. With R equal to the epochs, a round
is one epoch.

Device k draws its policy streams from numpy Generators seeded [seed, stream, k]; device 0
uses [seed, stream], the streams of a plain run, so a one-device fleet with one round per
epoch is that plain run.

Combining (`combine`; the rounding rules are in docs/numerics.md, section 13)
------------------------------------------------------------------------------
mean  the integer average of the devices' weights, weighted by their shard sizes, rounded to
      nearest with ties away from zero (the rule of golden.round_shift);
sign  a majority vote of the signs of the round's weight changes: where the devices' changes
      agree in sign by a strict majority, the weight moves in that direction by the mean
      magnitude (same rounding) of the changes of the devices in the majority; on a tie it
      keeps its value. It fits PSG, whose updates are sign steps already.
Both take the devices in device order, never in the order they finished.
"""

import math

import numpy as np

from . import golden, spec
from .data import Dataset
from .policies import (STREAM_LFSR, STREAM_SHUFFLE, STREAM_SLU, STREAM_SMD, STREAM_SPLIT,
                       LayerMaskPolicy, epoch_settings, rng, with_batch)
from .schedule import draw_order
from .spec import ConfigError

SPLITS = ("iid", "dirichlet")
COMBINES = ("mean", "sign")


# --- Splits ---------------------------------------------------------------------------------------

def split_shards(y, devices, split="iid", alpha=0.5, seed=0):
    """Indices into the training set, one sorted int64 array per device.

    y: the training labels; devices: N >= 1; split: 'iid' or 'dirichlet'; alpha > 0 the
    Dirichlet concentration. Raises ConfigError when a device would get no sample.
    """
    y = np.asarray(y)
    n = len(y)
    if not isinstance(devices, (int, np.integer)) or devices < 1:
        raise ConfigError(f"a fleet needs at least 1 device; got {devices!r}")
    if devices > n:
        raise ConfigError(f"{devices} devices for {n} training samples: every device needs at "
                          f"least one sample")
    if split not in SPLITS:
        raise ConfigError(f"split '{split}' is not one of {', '.join(SPLITS)}")
    gen = rng(seed, STREAM_SPLIT)
    if devices == 1:
        return [np.arange(n, dtype=np.int64)]
    if split == "iid":
        parts = np.array_split(gen.permutation(n), devices)
    else:
        if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha > 0):
            raise ConfigError(f"Dirichlet alpha {alpha!r} must be a positive number")
        parts = [[] for _ in range(devices)]
        for c in np.unique(y):
            members = np.flatnonzero(y == c)
            members = members[gen.permutation(len(members))]
            fractions = gen.dirichlet(np.full(devices, float(alpha)))
            # cut points from the cumulative fractions: every sample of the class goes to
            # exactly one device
            cuts = np.round(np.cumsum(fractions)[:-1] * len(members)).astype(np.int64)
            for k, chunk in enumerate(np.split(members, cuts)):
                parts[k].append(chunk)
        parts = [np.concatenate(p) for p in parts]
    shards = [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
    empty = [k for k, s in enumerate(shards) if len(s) == 0]
    if empty:
        raise ConfigError(f"the {split} split (alpha {alpha}) left device(s) "
                          f"{', '.join(map(str, empty))} without a sample; raise alpha or use "
                          f"fewer devices")
    return shards


def shard_dataset(ds, indices, device):
    """The Dataset one device trains on: its shard of the training set, the whole test set."""
    return Dataset(f"{ds.name}[{device}]", ds.x_train[indices], ds.y_train[indices],
                   ds.x_test, ds.y_test, ds.classes)


def label_counts(y, shards, classes):
    """Samples of every class on every device: an (N, classes) int array (what non-IID means
    for a split)."""
    return np.stack([np.bincount(np.asarray(y)[s], minlength=classes) for s in shards])


# --- Combining ------------------------------------------------------------------------------------

def _divide_nearest(total, count):
    """total / count for int64 arrays and positive integer counts (or arrays of them), rounded to nearest with ties
    away from zero (golden.round_shift's rule, for any divisor)."""
    total = np.asarray(total, dtype=np.int64)
    q = (2 * np.abs(total) + count) // (2 * count)
    return np.where(total < 0, -q, q)


def average_weights(weights, samples):
    """Integer weighted mean of several devices' weights.

    weights: per device, a list of int16 matrices (one per layer); samples: per device, its
    weight (shard size), positive integers. Returns int16 matrices: per weight,
    round(sum_k samples_k * W_k / sum_k samples_k), ties away from zero.
    """
    if not weights:
        raise ConfigError("nothing to average: no device returned weights")
    samples = [int(s) for s in samples]
    if len(samples) != len(weights) or any(s < 1 for s in samples):
        raise ConfigError(f"sample counts {samples} must be one positive integer per device")
    total = sum(samples)
    out = []
    for layer in range(len(weights[0])):
        acc = np.zeros(np.shape(weights[0][layer]), dtype=np.int64)
        for w, s in zip(weights, samples):
            acc += s * np.asarray(w[layer], dtype=np.int64)
        out.append(_divide_nearest(acc, total).astype(np.int16))
    return out


def sign_vote(previous, weights):
    """Combine by a majority vote of the signs of each device's change from `previous`.

    Per weight: votes = sum_k sign(W_k - P); where votes != 0 the weight becomes
    P + sign(votes) * m, m the mean of |W_k - P| over the devices whose change has the sign of
    the vote (rounded to nearest, ties away from zero), saturated to int16; where votes == 0
    (a tie, or no device changed it) it stays P.
    """
    if not weights:
        raise ConfigError("nothing to vote on: no device returned weights")
    out = []
    for layer, p in enumerate(previous):
        p = np.asarray(p, dtype=np.int64)
        deltas = np.stack([np.asarray(w[layer], dtype=np.int64) - p for w in weights])
        signs = np.sign(deltas)
        vote = np.sign(signs.sum(axis=0))
        agree = (signs == vote) & (vote != 0)
        majority = np.maximum(agree.sum(axis=0), 1)
        step = _divide_nearest(np.where(agree, np.abs(deltas), 0).sum(axis=0), majority)
        out.append(golden.saturate(p + vote * step, spec.WEIGHT_BITS).astype(np.int16))
    return out


def combine(kind, previous, weights, samples):
    """The fleet's new weights from the devices' weights (in device order) by rule `kind`."""
    if kind == "mean":
        return average_weights(weights, samples)
    if kind == "sign":
        return sign_vote(previous, weights)
    raise ConfigError(f"combine rule '{kind}' is not one of {', '.join(COMBINES)}")


# --- One device's share of the rounds -----------------------------------------------------------

def device_rng(seed, stream, device):
    """The Generator of one policy stream of one device of a fleet (device 0: the plain run's)."""
    if device == 0:
        return rng(seed, stream)
    return np.random.default_rng([seed, stream, device])


class LocalRun:
    """One device's training over the rounds of a fleet run: its shard, its policy streams
    and where it stands in its stream of batches.

    trainer:  a `Trainer` built for this device and shard (its checks, build and energy model
              are used; its `run` is not);
    device:   the device's index in the fleet (it seeds the policy streams);
    rounds:   how many rounds the run's batches are cut into.
    """

    def __init__(self, trainer, device, rounds):
        cfg, ds = trainer.cfg, trainer.ds
        self.trainer, self.cfg, self.ds, self.index = trainer, cfg, ds, device
        self.samples = len(ds.x_train)
        self.batches_per_epoch = -(-self.samples // cfg.batch_size)
        self.total_batches = self.batches_per_epoch * cfg.epochs
        if not 1 <= rounds <= self.total_batches:
            raise ConfigError(f"{rounds} rounds for device {device}, whose {self.samples} "
                              f"samples make {self.total_batches} batches in {cfg.epochs} "
                              f"epochs of batch {cfg.batch_size}: a round needs at least one "
                              f"batch of every device")
        self.rounds = rounds
        self.shuffle = device_rng(cfg.seed, STREAM_SHUFFLE, device)
        self.smd = device_rng(cfg.seed, STREAM_SMD, device)
        self.lfsr = device_rng(cfg.seed, STREAM_LFSR, device)
        self.slu = LayerMaskPolicy(cfg, len(trainer.layers) - 1)
        self.slu.rng = device_rng(cfg.seed, STREAM_SLU, device)
        self.position = 0            # the next batch of the run's stream
        self.order = None            # the shuffle of the epoch `position` is in
        self.dense_per_sample = golden.dense_macs_per_sample(trainer.layers)
        self._dense_cache = {}

    def round_batches(self, r):
        """The batch numbers [first, stop) of round r (0-based)."""
        if not 0 <= r < self.rounds:
            raise ConfigError(f"round {r} is outside 0..{self.rounds - 1}")
        t, n = self.total_batches, self.rounds
        return r * t // n, (r + 1) * t // n

    def _dense_energy(self, b):
        from .trainer import dense_counters
        if b not in self._dense_cache:
            t = self.trainer
            self._dense_cache[b] = t.energy.total(dense_counters(t.layers, t.build, b))
        return self._dense_cache[b]

    def _batches(self, r):
        """Yield (epoch, sample indices, settings or None for an SMD drop) for every batch of
        round r, drawing from the policy streams exactly as Trainer.run does."""
        first, stop = self.round_batches(r)
        if self.position != first:
            raise ConfigError(f"device {self.index} stands at batch {self.position}; round {r} "
                              f"starts at batch {first}")
        cfg = self.cfg
        for p in range(first, stop):
            epoch, within = divmod(p, self.batches_per_epoch)
            if within == 0:
                _, self.order = draw_order(self.shuffle, self.samples)
            idx = self.order[within * cfg.batch_size:(within + 1) * cfg.batch_size]
            self.position = p + 1
            if cfg.smd > 0 and self.smd.random() < cfg.smd:
                yield epoch, idx, None
                continue
            settings = with_batch(epoch_settings(cfg, epoch), self.slu.next_mask(),
                                  int(self.lfsr.integers(1, 1 << 16)))
            yield epoch, idx, settings

    def train_round(self, device, r):
        """Train round r's batches on `device` (which holds the weights to start from).
        Returns {correct, seen, trained, dropped, skip_smd, dense_energy_pj, last_epoch}:
        samples trained, batches trained and dropped, ..."""
        out = {"correct": 0, "seen": 0, "trained": 0, "dropped": 0, "skip_smd": 0,
               "dense_energy_pj": 0.0, "last_epoch": None}
        ds = self.ds
        for epoch, idx, settings in self._batches(r):
            b = len(idx)
            out["dense_energy_pj"] += self._dense_energy(b)
            out["last_epoch"] = epoch
            if settings is None:
                out["dropped"] += 1
                out["skip_smd"] += b * self.dense_per_sample
                continue
            out["correct"] += int(device.train_batch(ds.x_train[idx], ds.y_train[idx], settings))
            out["seen"] += b
            out["trained"] += 1
        return out

    def skip_round(self, r):
        """Draw round r's policy values without training: a device that missed the round goes
        on at the next one exactly where it would have stood."""
        for _ in self._batches(r):
            pass

    def state(self):
        """Everything that changes from round to round, as JSON-able values."""
        return {"position": self.position,
                "order": None if self.order is None else self.order.tolist(),
                "shuffle": self.shuffle.bit_generator.state,
                "smd": self.smd.bit_generator.state, "lfsr": self.lfsr.bit_generator.state,
                "slu": self.slu.state()}

    def restore(self, state):
        """Go on from a `state()`."""
        self.position = int(state["position"])
        self.order = None if state["order"] is None else np.asarray(state["order"],
                                                                    dtype=np.int64)
        for name in ("shuffle", "smd", "lfsr"):
            getattr(self, name).bit_generator.state = state[name]
        self.slu.restore(state["slu"])
