"""One epoch's schedule: the order the samples are visited in, which mini-batches SMD drops,
and each kept batch's SLU mask and ssProp LFSR seed.

The trainer draws an epoch's whole schedule before its first batch (`draw_epoch`), from the
same seeded streams as before (policies.rng), and then either streams the batches it names
to the device or, with the data resident on the device, sends the schedule itself
(`EpochSchedule.words`) and lets the engine walk it. Both give the same batches in the same
order with the same settings, so the same weights and event counters.

The order is a keyed permutation the device can make itself from ORDER_KEY_BITS of key,
so an epoch's order costs 4 link bytes instead of a list of every sample index
(`epoch_order`; its gateware twin is the resident data unit's order generator):

- the sample count n fits in 2h bits (h = order_half_bits(n), at least 1);
- a 2h-bit counter x runs 0, 1, ..., 4**h - 1 and a 4-round Feistel network maps each x
  to y (a bijection of the 2h-bit numbers whatever the key); the y below n, in the order
  they come, are the epoch's order;
- a round maps (L, R) to (R, L ^ f(R) ^ k_i) with f(R) = (R <<< 1 & R <<< 2) ^ R <<< 3
  (rotations of h bits: an AND and XORs, SIMON's round function) and round key
  k_i = bits 8i..8i+h-1 of the key.

4**h < 4n for n >= 2, so an order of n samples takes fewer than 4n counter steps
(`order_steps`; 4 for n = 1).
"""

from dataclasses import dataclass, replace

import numpy as np

from .spec import (ORDER_KEY_BITS, ORDER_MAX_SAMPLES, ORDER_ROUND_KEY_BITS, ORDER_ROUNDS,
                   SCHEDULE_DROP_BIT, SCHEDULE_MASK_LSB, SCHEDULE_SEED_BITS, ConfigError,
                   StepSettings)


def order_half_bits(n):
    """h: the bits of each Feistel half for an order of `n` samples (4**h >= n)."""
    if not 1 <= n <= ORDER_MAX_SAMPLES:
        raise ConfigError(f"an epoch order covers 1..{ORDER_MAX_SAMPLES} samples; got {n}")
    return max(1, -(-max(0, n - 1).bit_length() // 2))


def _rotl(v, s, h):
    s %= h
    mask = (1 << h) - 1
    return ((v << s) | (v >> (h - s))) & mask if s else v


def order_round_function(r, h):
    """f of one Feistel round on an h-bit half."""
    return (_rotl(r, 1, h) & _rotl(r, 2, h)) ^ _rotl(r, 3, h)


def order_permute(x, key, h):
    """The Feistel network: 2h-bit x -> 2h-bit y under `key` (a bijection for every key); x
    an int or an integer array."""
    mask = (1 << h) - 1
    left, right = x >> h, x & mask
    for i in range(ORDER_ROUNDS):
        k = (key >> (ORDER_ROUND_KEY_BITS * i)) & mask
        left, right = right, left ^ order_round_function(right, h) ^ k
    return (left << h) | right


def epoch_order(key, n):
    """The order an epoch visits samples 0..n-1 in under `key`: a permutation of range(n),
    as an int64 array."""
    if not 0 <= key < 1 << ORDER_KEY_BITS:
        raise ConfigError(f"order key {key} is outside 0..{(1 << ORDER_KEY_BITS) - 1}")
    h = order_half_bits(n)
    ys = order_permute(np.arange(1 << (2 * h), dtype=np.int64), key, h)
    return ys[ys < n]


def order_steps(n):
    """The counter steps (candidates) one order of n samples takes: 4**h."""
    return 1 << (2 * order_half_bits(n))


@dataclass(frozen=True)
class EpochSchedule:
    """What one epoch does, batch by batch.

    key:        the order key (epoch_order(key, samples))
    samples:    training samples in the epoch
    batch_size: samples per mini-batch; the last batch has the remainder
    settings:   the StepSettings every batch shares (learning rate, PSG, ssProp keep, ...)
    drops:      per batch, True if SMD drops it (it is never trained, and still counted)
    masks:      per batch, the SLU update mask (one bool per layer; None for a dropped batch)
    seeds:      per batch, the ssProp LFSR seed (0 for a dropped batch)
    """
    key: int
    samples: int
    batch_size: int
    settings: StepSettings
    drops: tuple
    masks: tuple
    seeds: tuple

    def batch_sizes(self):
        return [min(self.batch_size, self.samples - i)
                for i in range(0, self.samples, self.batch_size)]

    def batches(self):
        """(sample indices, dropped, settings or None) of each batch, in order."""
        order = epoch_order(self.key, self.samples)
        for i, start in enumerate(range(0, self.samples, self.batch_size)):
            idx = order[start:start + self.batch_size]
            if self.drops[i]:
                yield idx, True, None
            else:
                yield idx, False, replace(self.settings, update_mask=self.masks[i],
                                          lfsr_seed=self.seeds[i])

    def words(self):
        """One schedule word per batch (SCHEDULE_*): what the device walks."""
        out = []
        for drop, mask, seed in zip(self.drops, self.masks, self.seeds):
            if drop:
                out.append(1 << SCHEDULE_DROP_BIT)
            else:
                bits = sum(1 << l for l, on in enumerate(mask) if on)
                out.append(seed | bits << SCHEDULE_MASK_LSB)
        return out

    @classmethod
    def from_words(cls, words, key, samples, batch_size, settings, layers):
        """The schedule `words` describe (the inverse of `words`, for `layers` layers)."""
        drops = tuple(bool(w >> SCHEDULE_DROP_BIT & 1) for w in words)
        masks = tuple(None if d else tuple(bool(w >> (SCHEDULE_MASK_LSB + l) & 1)
                                           for l in range(layers))
                      for d, w in zip(drops, words))
        seeds = tuple(0 if d else w & ((1 << SCHEDULE_SEED_BITS) - 1)
                      for d, w in zip(drops, words))
        return cls(key, samples, batch_size, settings, drops, masks, seeds)


def draw_order(shuffle, samples):
    """(key, order) of one epoch: the key drawn from the run's shuffle stream (a Generator)
    and epoch_order under it. The trainer, the fleet's devices and the float reference all
    visit an epoch's samples in this order."""
    key = int(shuffle.integers(0, 1 << ORDER_KEY_BITS))
    return key, epoch_order(key, samples)


def draw_epoch(cfg, settings, samples, shuffle, smd, slu, lfsr):
    """Draw one epoch's schedule from the run's streams (policies.rng Generators and the
    LayerMaskPolicy `slu`). A dropped batch draws no mask and no seed, so the streams advance
    as they would batch by batch."""
    key, _ = draw_order(shuffle, samples)
    drops, masks, seeds = [], [], []
    for _ in range(0, samples, cfg.batch_size):
        drop = bool(cfg.smd > 0 and smd.random() < cfg.smd)
        drops.append(drop)
        masks.append(None if drop else slu.next_mask())
        seeds.append(0 if drop else int(lfsr.integers(1, 1 << SCHEDULE_SEED_BITS)))
    return EpochSchedule(key, samples, cfg.batch_size, settings, tuple(drops), tuple(masks),
                         tuple(seeds))
