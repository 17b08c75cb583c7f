"""Training settings, presets and the per-epoch / per-batch policies that turn them into
device step settings: learning-rate and PSG-step schedules, the ssProp keep schedule, the SLU
layer-mask policy and stochastic mini-batch dropping.

Every random choice comes from a numpy Generator seeded from the run's seed and a stream
number, so a run is reproducible and each policy's stream is independent of the others.
"""

import math
from dataclasses import asdict, dataclass, field, fields, replace

import numpy as np

from . import data, spec
from .spec import ConfigError, StepSettings

SLU_POLICIES = ("all", "random", "cyclic")
KEEP_SCHEDULES = ("constant", "interleave", "linear", "cosine", "bar")
SSPROP_VARIANTS = ("topk", "random")

# RNG stream numbers (the second word of each policy's seed); STREAM_SPLIT deals a fleet's
# training data to its devices (ember.federated)
STREAM_SHUFFLE, STREAM_SMD, STREAM_SLU, STREAM_LFSR, STREAM_INIT, STREAM_SPLIT = range(6)


@dataclass
class TrainConfig:
    """Everything that defines a training run. Field names are the CLI's option names.

    layers None means "from the data set": its feature count, DEFAULT_HIDDEN, its class count
    (`for_data`); 64-32-10 for the digits. scaling is the input scaling fitted on the
    training split (data.SCALINGS; "global" only for resuming version 1 checkpoints)."""
    layers: tuple | None = None
    epochs: int = 20
    batch_size: int = 32
    seed: int = 0
    dataset: str = "digits"
    scaling: str = "minmax"
    profile: str | None = None                # None: the build's (energy.profile_for)
    # baseline SGD
    lr_shift: int = 12
    lr_milestones: tuple = (0.5, 0.75)       # +1 to lr_shift at each fraction of the epochs
    # stochastic mini-batch dropping
    smd: float = 0.0                          # probability of dropping a batch
    # selective layer update
    slu: str = "all"
    slu_prob: float = 0.5                     # P(a non-output layer is updated) for 'random'
    # predictive sign gradient
    psg: bool = False
    psg_tau: int = 0
    psg_relative: bool = False
    psg_step: int = 8                         # sign step = 2**psg_step weight LSBs at first
    psg_step_milestones: tuple = (0.25, 0.5, 0.65, 0.8)   # -1 to psg_step at each fraction
    # ssProp
    ssprop_keep: float = 1.0                  # keep ratio of sparse epochs (1.0 = off)
    ssprop_schedule: str = "interleave"
    ssprop_keep_start: float = 0.95           # for linear / cosine / bar
    ssprop_warmup: int = 1                    # dense epochs first
    ssprop_variant: str = "topk"
    # zero skipping
    zero_skip: bool = False

    def check(self):
        """Raise ConfigError naming the first setting that is out of range; returns self."""
        data.check_scaling_kind(self.scaling, legacy=True)
        if self.epochs < 1:
            raise ConfigError(f"epochs {self.epochs} must be at least 1")
        if not 0.0 <= self.smd < 1.0:
            raise ConfigError(f"SMD drop probability {self.smd} is outside [0, 1)")
        if self.slu not in SLU_POLICIES:
            raise ConfigError(f"SLU policy '{self.slu}' is not one of {SLU_POLICIES}")
        if not 0.0 <= self.slu_prob <= 1.0:
            raise ConfigError(f"slu_prob {self.slu_prob} is outside [0, 1]")
        for name in ("ssprop_keep", "ssprop_keep_start"):
            v = getattr(self, name)
            if not 0.0 < v <= 1.0:
                raise ConfigError(f"{name} {v} is outside (0, 1]")
        if self.ssprop_schedule not in KEEP_SCHEDULES:
            raise ConfigError(f"ssProp schedule '{self.ssprop_schedule}' is not one of "
                              f"{KEEP_SCHEDULES}")
        if self.ssprop_variant not in SSPROP_VARIANTS:
            raise ConfigError(f"ssProp variant '{self.ssprop_variant}' is not one of "
                              f"{SSPROP_VARIANTS}")
        for name in ("lr_milestones", "psg_step_milestones"):
            for m in getattr(self, name):
                if not 0.0 <= m <= 1.0:
                    raise ConfigError(f"{name} value {m} is outside [0, 1]")
        StepSettings(lr_shift=self.lr_shift, psg_step_shift=self.psg_step,
                     psg_tau=self.psg_tau, psg_relative=self.psg_relative).check(1)
        return self

    def for_data(self, ds, hidden=None):
        """This config with the network's ends taken from data set `ds` when layers is None:
        (ds.features, *hidden, ds.classes), hidden defaulting to DEFAULT_HIDDEN."""
        if self.layers is not None:
            if hidden is not None and tuple(self.layers[1:-1]) != tuple(hidden):
                raise ConfigError(f"layers {'-'.join(map(str, self.layers))} and hidden widths "
                                  f"{','.join(map(str, hidden))} disagree; give one of them")
            return self
        return replace(self, layers=network_for(ds, hidden))

    def needs(self):
        """The optional engine units (spec.FEATURES) some batch of this run may use."""
        sparse = self.ssprop_keep < 1.0
        used = {"zero_skip": self.zero_skip, "slu": self.slu != "all", "psg": self.psg,
                "ssprop": sparse, "ssprop_random": sparse and self.ssprop_variant == "random"}
        return tuple(name for name in spec.FEATURES if used.get(name))

    def to_dict(self):
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


#: hidden widths of a network whose ends come from the data set
DEFAULT_HIDDEN = (32,)


def network_for(ds, hidden=None):
    """Layer widths for data set `ds`: its features, the hidden widths, its classes."""
    hidden = DEFAULT_HIDDEN if hidden is None else tuple(hidden)
    return (ds.features, *hidden, ds.classes)


PRESETS = {
    "baseline": {},
    "smd": {"smd": 0.5},
    "slu": {"slu": "random", "slu_prob": 0.5},
    "psg": {"psg": True},
    "ssprop": {"ssprop_keep": 0.2, "ssprop_schedule": "interleave"},
    "zero": {"zero_skip": True},
    "e2train": {"smd": 0.5, "slu": "random", "slu_prob": 0.5, "psg": True},
    "all": {"smd": 0.5, "slu": "random", "slu_prob": 0.5, "psg": True,
            "ssprop_keep": 0.2, "ssprop_schedule": "interleave", "zero_skip": True},
}


def make_config(preset="baseline", **overrides):
    """A TrainConfig from a named preset, then `overrides` (None values are ignored)."""
    if preset not in PRESETS:
        raise ConfigError(f"preset '{preset}' is not one of {', '.join(PRESETS)}")
    values = dict(PRESETS[preset])
    names = {f.name for f in fields(TrainConfig)}
    for k, v in overrides.items():
        if v is None:
            continue
        if k not in names:
            raise ConfigError(f"unknown setting '{k}'")
        values[k] = tuple(v) if isinstance(v, list) else v
    return TrainConfig(**values).check()


def rng(seed, stream):
    """The Generator of one policy stream of a run."""
    return np.random.default_rng([seed, stream])


def milestones_passed(epoch, epochs, milestones):
    return sum(1 for m in milestones if epoch >= math.ceil(m * epochs))


def keep_ratio(cfg, epoch):
    """ssProp keep ratio for an epoch (1.0 means a dense epoch)."""
    if cfg.ssprop_keep >= 1.0 or epoch < cfg.ssprop_warmup:
        return 1.0
    s = cfg.ssprop_schedule
    i, n = epoch - cfg.ssprop_warmup, max(1, cfg.epochs - cfg.ssprop_warmup)
    if s == "constant":
        return cfg.ssprop_keep
    if s == "interleave":          # dense and sparse epochs alternate, sparse first
        return cfg.ssprop_keep if i % 2 == 0 else 1.0
    hi, lo = cfg.ssprop_keep_start, cfg.ssprop_keep
    frac = i / max(1, n - 1)
    if s == "linear":
        return hi + (lo - hi) * frac
    if s == "cosine":
        return lo + (hi - lo) * 0.5 * (1 + math.cos(math.pi * frac))
    return hi if frac < 0.5 else lo            # bar: two levels


def keep_q8(ratio):
    """The keep ratio as the device's 8-bit fraction (256 = dense)."""
    return spec.KEEP_ONE if ratio >= 1.0 else max(1, min(spec.KEEP_ONE - 1, round(ratio * 256)))


def epoch_settings(cfg, epoch):
    """The StepSettings shared by every batch of an epoch (masks and seeds come per batch)."""
    return StepSettings(
        lr_shift=min(cfg.lr_shift + milestones_passed(epoch, cfg.epochs, cfg.lr_milestones),
                     spec.UPDATE_SHIFT_MAX),
        zero_skip=cfg.zero_skip,
        psg=cfg.psg,
        psg_relative=cfg.psg_relative,
        psg_tau=cfg.psg_tau,
        psg_step_shift=max(0, cfg.psg_step - milestones_passed(epoch, cfg.epochs,
                                                                cfg.psg_step_milestones)),
        keep_q8=keep_q8(keep_ratio(cfg, epoch)),
        ssprop_random=cfg.ssprop_variant == "random",
    )


class LayerMaskPolicy:
    """SLU: which layers update on each batch.

    all:    every layer, every batch (no SLU).
    random: the output layer always; every other layer independently with slu_prob.
    cyclic: the output layer always; the other layers take turns, one per batch.
    """

    def __init__(self, cfg, n_layers):
        self.cfg, self.n = cfg, n_layers
        self.rng = rng(cfg.seed, STREAM_SLU)
        self.count = 0

    def next_mask(self):
        n, kind = self.n, self.cfg.slu
        self.count += 1
        if kind == "all" or n == 1:
            return tuple([True] * n)
        if kind == "random":
            lower = self.rng.random(n - 1) < self.cfg.slu_prob
            return tuple(bool(b) for b in lower) + (True,)
        turn = (self.count - 1) % (n - 1)
        return tuple(i == turn for i in range(n - 1)) + (True,)

    def state(self):
        return {"rng": self.rng.bit_generator.state, "count": self.count}

    def restore(self, state):
        self.rng.bit_generator.state = state["rng"]
        self.count = state["count"]


def with_batch(settings, mask, lfsr_seed):
    return replace(settings, update_mask=mask, lfsr_seed=lfsr_seed)
