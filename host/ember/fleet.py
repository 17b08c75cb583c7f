"""Many boards: one network trained by a fleet of devices, each a Ray actor.

    from ember import data, fleet, policies
    ds = data.load_digits()
    cfg = policies.make_config("e2train", epochs=20)
    result = fleet.Fleet(fleet.boards_from(count=4), ds, cfg,
                         fleet.FleetConfig(split="dirichlet", alpha=0.5)).run()

or ``ember train --boards 4 --split dirichlet --alpha 0.5`` (docs/fleet.md).

How a run goes
--------------
The training set is split into one shard per device (`ember.federated.split_shards`). Every
device is a Ray actor (`DeviceActor`) that opens its own Device (model, sim or board backend,
any mix) and holds its shard. Each round the coordinator sends the current integer weights to
every device, each trains its share of the round's batches with its own policy streams
(`ember.federated.LocalRun`), and returns its weights and counters. The coordinator combines
the weights of the devices that answered, in device order (`ember.federated.combine`), checks
the test accuracy of the result on the golden model (the specification of every backend's
arithmetic, so the figure is the one every device would give), and writes a checkpoint.

Faults
------
A device whose actor dies (its process killed, its port closed, any error), that cannot be
opened within `open_timeout` seconds, or whose training has not answered within
`round_timeout` seconds is dropped from the round: its actor is killed, the
round is combined from the others, and the round's record names it with the reason. At the
next round a new actor opens the device again, draws the missed round's policy values without
training (so its stream of batches is where it would have been) and starts from the current
weights. A round that no device finishes leaves the weights as they were.

Checkpoints
-----------
With ``checkpoint=PATH`` the coordinator writes after every round (atomically, as
`trainer.save_checkpoint`) one JSON object, format ``"ember-fleet-checkpoint"``, version 1:
round (rounds completed), settings, fleet, boards, build, data_sha256, weights,
weights_sha256, history, devices (per device: its LocalRun state, the round that state starts,
its accumulated counters and energy), notes. ``resume=load_checkpoint(PATH)`` goes on after
that round and ends with the weights, history and counters of a run that was never stopped.

Ray
---
If Ray is not initialized, `Fleet.run` starts a local instance in-process (``ray.init()``) and
shuts it down at the end; ``FleetConfig(ray_address=...)`` joins an existing cluster instead.
Ray is an optional extra: ``pip install 'ember-train[fleet]'``.
"""

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np

try:
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError
except ImportError as e:       # pragma: no cover - depends on the environment
    raise ImportError("ember.fleet needs Ray, an optional extra of ember: "
                      "pip install 'ember-train[fleet]' (or pip install 'ray>=2.9')") from e

from . import energy, golden, spec
from .device import BACKENDS, build_info, open_device
from .federated import (COMBINES, SPLITS, LocalRun, combine, label_counts, shard_dataset,
                        split_shards)
from .policies import STREAM_INIT
from .spec import ConfigError
from .trainer import Trainer, add_counters, data_sha256, read_checkpoint_json, save_checkpoint

FLEET_CHECKPOINT_FORMAT = "ember-fleet-checkpoint"
FLEET_CHECKPOINT_VERSION = 1
_CHECKPOINT_KEYS = ("round", "settings", "fleet", "boards", "build", "data_sha256", "weights",
                    "weights_sha256", "history", "devices")


# --- What the fleet is made of -------------------------------------------------------------------

@dataclass(frozen=True)
class Board:
    """One device of a fleet: how its actor opens it.

    backend: 'model', 'sim' or 'board'; options: keyword arguments of `open_device` (port,
    baud, simulator, uart, ...); build: the engine build name. `factory`, if given, is a
    picklable callable returning an open Device, used instead (custom devices, tests).
    """
    backend: str = "model"
    options: tuple = ()                  # (name, value) pairs: hashable and picklable
    build: str = spec.DEFAULT_BUILD.name
    factory: object = None

    def open(self):
        """Open the device (in the actor's process)."""
        if self.factory is not None:
            return self.factory()
        return open_device(self.backend, build=self.build, **dict(self.options))

    @property
    def label(self):
        """A short name for reports: the backend, and the port of a board."""
        port = dict(self.options).get("port")
        return f"{self.backend}:{port}" if port else self.backend


def boards_from(count=None, ports=None, backend="model", build=spec.DEFAULT_BUILD.name,
                baud=None, simulator="verilator", uart=False):
    """The boards of `--boards N` and `--ports A,B,...`.

    ports: entries 'model' and 'sim' name those backends; any other entry is a serial port
    name or pyserial URL of a real board. count alone gives N boards of `backend`; with ports
    it must equal their number.
    """
    if ports:
        entries = [p.strip() for p in (ports.split(",") if isinstance(ports, str) else ports)]
        if any(not p for p in entries):
            raise ConfigError(f"--ports {ports!r} has an empty entry")
        if count is not None and count != len(entries):
            raise ConfigError(f"--boards {count} but --ports names {len(entries)} devices")
    else:
        if count is None or count < 1:
            raise ConfigError(f"a fleet needs at least one board; got --boards {count}")
        if backend not in BACKENDS:
            raise ConfigError(f"backend '{backend}' is not one of {', '.join(BACKENDS)}")
        if backend == "board":
            raise ConfigError("boards of the board backend are named by --ports PORT,PORT,...")
        entries = [backend] * count
    boards = []
    for entry in entries:
        if entry == "model":
            boards.append(Board("model", (), build))
        elif entry == "sim":
            boards.append(Board("sim", (("simulator", simulator), ("uart", uart)), build))
        else:
            boards.append(Board("board", (("port", entry), ("baud", baud)), build))
    return boards


@dataclass
class FleetConfig:
    """How the fleet trains (the TrainConfig says what each device trains).

    rounds:        rounds the run's batches are cut into (None: one round per epoch);
    combine:       'mean' (integer weighted average) or 'sign' (sign majority vote);
    split:         'iid' or 'dirichlet' (label-skewed, concentration `alpha`);
    round_timeout: seconds a round's training may take before the devices still training are
                   dropped;
    open_timeout:  seconds a device's actor may take to open it (a simulator's first start
                   builds the gateware);
    ray_address:   an existing Ray cluster to join (None: a local Ray, started in-process).
    """
    rounds: int | None = None
    combine: str = "mean"
    split: str = "iid"
    alpha: float = 0.5
    round_timeout: float = 600.0
    open_timeout: float = 900.0
    ray_address: str | None = None

    def check(self, cfg):
        if self.combine not in COMBINES:
            raise ConfigError(f"combine rule '{self.combine}' is not one of "
                              f"{', '.join(COMBINES)}")
        if self.split not in SPLITS:
            raise ConfigError(f"split '{self.split}' is not one of {', '.join(SPLITS)}")
        if not self.alpha > 0:
            raise ConfigError(f"Dirichlet alpha {self.alpha} must be positive")
        if self.rounds is not None and self.rounds < 1:
            raise ConfigError(f"rounds {self.rounds} must be at least 1")
        for name in ("round_timeout", "open_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name.replace('_', ' ')} {getattr(self, name)} s must be "
                                  f"positive")
        return self

    def rounds_for(self, cfg):
        return cfg.epochs if self.rounds is None else self.rounds

    def to_dict(self, cfg):
        """The settings that decide the result (the timeout and the cluster do not)."""
        return {"rounds": self.rounds_for(cfg), "combine": self.combine, "split": self.split,
                "alpha": float(self.alpha)}


class DeviceFailure(RuntimeError):
    """A device's error on its way from its actor to the coordinator: the original
    exception's type and message (its class may not unpickle in the coordinator)."""


# --- The actor ----------------------------------------------------------------------------------

class DeviceActor:
    """One device and its shard, in its own Ray actor process.

    It opens the device, checks the settings against its build (as `Trainer` does), configures
    the network, and if it is a device rejoining (or a resumed run), restores its LocalRun
    state and draws the rounds it missed.
    """

    def __init__(self, board, index, ds, shard, cfg, rounds, state=None, state_round=0,
                 start_round=0):
        self.index = index
        self.device = board.open()
        try:
            self.trainer = Trainer(self.device, shard_dataset(ds, shard, index), cfg,
                                   progress=False)
            self.local = LocalRun(self.trainer, index, rounds)
            if state is not None:
                self.local.restore(state)
            for r in range(state_round, start_round):
                self.local.skip_round(r)
            self.device.configure(self.trainer.layers)
            self.device.clear_counters()
        except BaseException:
            self.device.close()
            raise

    def identify(self):
        """The device's identify() answer plus its backend and the actor's process id."""
        return {**self.device.identify(), "backend": self.device.backend, "pid": os.getpid()}

    def run_round(self, r, weights):
        """Load `weights`, train round r's batches, and return the weights, the round's
        counters and energy, and the LocalRun state after the round."""
        start = time.perf_counter()
        try:
            self.device.load_weights(weights)
            out = self.local.train_round(self.device, r)
            out["weights"] = self.device.read_weights()
            counters = self.device.take_counters()
        except Exception as e:
            raise DeviceFailure(f"{type(e).__name__}: {e}") from None
        counters["skip_smd"] = out.pop("skip_smd")
        out["counters"] = counters
        out["energy_pj"] = self.trainer.energy.total(counters)
        out["state"] = self.local.state()
        out["wall_s"] = time.perf_counter() - start
        return out

    def close(self):
        """Close the device (the simulator process ends, the port is released)."""
        self.device.close()


# --- Checkpoints ----------------------------------------------------------------------------------

def load_checkpoint(path):
    """Read and check a fleet checkpoint; weights come back as int16 arrays. Raises
    ConfigError naming the file and what is wrong with it."""
    doc = read_checkpoint_json(path)
    if not isinstance(doc, dict) or doc.get("format") != FLEET_CHECKPOINT_FORMAT:
        raise ConfigError(f"{path} is not an Ember fleet checkpoint (no \"format\": "
                          f"\"{FLEET_CHECKPOINT_FORMAT}\")")
    if doc.get("version") != FLEET_CHECKPOINT_VERSION:
        raise ConfigError(f"fleet checkpoint {path} has version {doc.get('version')!r}; this "
                          f"ember reads version {FLEET_CHECKPOINT_VERSION}")
    missing = [k for k in _CHECKPOINT_KEYS if k not in doc]
    if missing:
        raise ConfigError(f"fleet checkpoint {path} lacks {', '.join(missing)}")
    doc["weights"] = [np.asarray(w, dtype=np.int16) for w in doc["weights"]]
    if golden.weights_sha256(doc["weights"]) != doc["weights_sha256"]:
        raise ConfigError(f"fleet checkpoint {path}: the weights do not match their "
                          f"weights_sha256 (the file was changed or damaged)")
    doc["path"] = str(path)
    return doc


def _save(path, doc):
    """Write atomically, as trainer.save_checkpoint does (which lets our format tag win)."""
    save_checkpoint(path, {**doc, "format": FLEET_CHECKPOINT_FORMAT,
                           "version": FLEET_CHECKPOINT_VERSION})


# --- The coordinator ------------------------------------------------------------------------------

def evaluate(layers, build, weights, x, y):
    """Test accuracy of integer weights on the golden model (bit-exact with every backend)."""
    m = golden.GoldenModel(build)
    m.configure(layers)
    m.load_weights(weights)
    step = build.max_batch
    predicted = np.concatenate([m.infer(x[i:i + step]) for i in range(0, len(x), step)])
    return float((predicted == y).mean())


@dataclass
class _Member:
    """The coordinator's view of one device."""
    board: Board
    shard: np.ndarray
    actor: object = None
    state: dict | None = None          # LocalRun state at the start of round `state_round`
    state_round: int = 0
    counters: dict = field(default_factory=dict)
    energy_pj: float = 0.0
    dense_energy_pj: float = 0.0
    rounds_missed: list = field(default_factory=list)
    info: dict | None = None


class Fleet:
    """Runs one TrainConfig on a fleet of devices (see the module docstring).

    boards:     Board specs (`boards_from`), one per device, in device order;
    ds:         the data set (its training set is split over the devices);
    cfg:        the TrainConfig every device trains with (seeds differ per device);
    fleet:      a FleetConfig;
    checkpoint: a path to write a checkpoint to after every round;
    resume:     a checkpoint from `load_checkpoint` to go on from (same settings, boards and
                data, checked before any device is opened);
    actor_options: extra Ray actor options (e.g. resources that pin a board to its host);
    on_round:   called as on_round(r, actors) once round r's work is sent (fault tests).
    """

    def __init__(self, boards, ds, cfg, fleet=None, progress=True, checkpoint=None,
                 resume=None, notes=None, build=None, actor_options=None, on_round=None):
        cfg = cfg.for_data(ds)          # the network's ends from the data unless cfg says
        self.boards, self.ds, self.cfg = list(boards), ds, cfg
        self.fleet = (fleet or FleetConfig()).check(cfg)
        if not self.boards:
            raise ConfigError("a fleet needs at least one board")
        self.build = spec.BUILDS[build] if isinstance(build, str) else \
            (build or spec.BUILDS[self.boards[0].build])
        self.layers = spec.check_network(list(cfg.layers), self.build, cfg.batch_size)
        if self.layers[0] != ds.features:
            raise ConfigError(f"network input width {self.layers[0]} does not match the data "
                              f"set's {ds.features} features")
        self.rounds = self.fleet.rounds_for(cfg)
        self.progress, self.checkpoint, self.resume = progress, checkpoint, resume
        self.notes = dict(notes or {})
        self.actor_options = {"num_cpus": 0, "max_restarts": 0, **(actor_options or {})}
        self.on_round = on_round
        self.data_sha256 = data_sha256(ds)
        self.shards = split_shards(ds.y_train, len(self.boards), self.fleet.split,
                                   self.fleet.alpha, cfg.seed)
        # every device's shard must give every round a batch: checked here, not in round 0
        for k, s in enumerate(self.shards):
            total = -(-len(s) // cfg.batch_size) * cfg.epochs
            if self.rounds > total:
                raise ConfigError(f"{self.rounds} rounds, but device {k}'s {len(s)} samples "
                                  f"make only {total} batches in {cfg.epochs} epochs of batch "
                                  f"{cfg.batch_size}: every round needs a batch of every "
                                  f"device")
        if resume is not None:
            self._check_resume(resume)

    # settings a checkpoint must agree with
    def _identity(self):
        return {"settings": self.cfg.to_dict(), "fleet": self.fleet.to_dict(self.cfg),
                "boards": [b.label for b in self.boards], "build": self.build.name,
                "data_sha256": self.data_sha256}

    def _check_resume(self, ckpt):
        where = f"checkpoint {ckpt.get('path', '')}".rstrip()
        diff = [f"{k} {v!r} (checkpoint: {ckpt[k]!r})" for k, v in self._identity().items()
                if ckpt[k] != v]
        if diff:
            raise ConfigError(f"{where} was written by another fleet run: {'; '.join(diff)}")
        if not 1 <= ckpt["round"] <= self.rounds or len(ckpt["history"]) != ckpt["round"]:
            raise ConfigError(f"{where} holds round {ckpt['round']} with "
                              f"{len(ckpt['history'])} history entries; this run has "
                              f"{self.rounds} rounds")
        golden.check_weights(self.layers, ckpt["weights"])

    def _log(self, text):
        if self.progress:
            print(text, file=sys.stderr, flush=True)

    def _start_actor(self, k, member, r):
        remote = ray.remote(DeviceActor).options(**self.actor_options)
        member.actor = remote.remote(member.board, k, self.ds, member.shard, self.cfg,
                                     self.rounds, member.state, member.state_round, r)

    def _drop(self, member):
        if member.actor is not None:
            try:
                ray.kill(member.actor, no_restart=True)
            except Exception:      # already gone: nothing to release
                pass
            member.actor = None

    def _close(self, members):
        refs = [m.actor.close.remote() for m in members if m.actor is not None]
        try:
            ray.get(refs, timeout=60)
        except RayError:
            pass               # a device that cannot close cleanly is killed below anyway
        for m in members:
            self._drop(m)

    def run(self):
        """Train every round; returns the result (see docs/fleet.md for its keys)."""
        started_ray = False
        if not ray.is_initialized():
            options = {"include_dashboard": False, "log_to_driver": False}
            if self.fleet.ray_address:
                try:
                    ray.init(address=self.fleet.ray_address, **options)
                except (ConnectionError, RuntimeError, ValueError) as e:
                    raise ConfigError(f"cannot join the Ray cluster at "
                                      f"{self.fleet.ray_address}: {e}") from None
            else:
                # the fleet's objects are weights of a few KiB: a small object store
                ray.init(object_store_memory=256 << 20, **options)
            started_ray = True
        try:
            return self._run()
        finally:
            if started_ray:
                ray.shutdown()

    def _run(self):
        cfg, ds = self.cfg, self.ds
        start = time.perf_counter()
        members = [_Member(b, s) for b, s in zip(self.boards, self.shards)]
        for m in members:
            m.counters = dict.fromkeys(spec.COUNTERS, 0)
            m.counters["skip_smd"] = 0
        if self.resume is not None:
            ck = self.resume
            first, weights = ck["round"], [np.asarray(w, dtype=np.int16) for w in ck["weights"]]
            history = [dict(h) for h in ck["history"]]
            for m, saved in zip(members, ck["devices"]):
                m.state, m.state_round = saved["state"], saved["state_round"]
                m.counters = dict(saved["counters"])
                m.energy_pj, m.dense_energy_pj = saved["energy_pj"], saved["dense_energy_pj"]
                m.rounds_missed = list(saved["rounds_missed"])
            self._log(f"resuming from {ck.get('path', 'a checkpoint')} after round "
                      f"{first}/{self.rounds}")
        else:
            first, history = 0, []
            weights = golden.init_weights(self.layers, [cfg.seed, STREAM_INIT])
        try:
            for r in range(first, self.rounds):
                weights = self._round(r, members, weights, history)
                if self.checkpoint:
                    self._write_checkpoint(r + 1, members, weights, history)
        finally:
            self._close(members)
        return self._result(members, weights, history, time.perf_counter() - start)

    def _round(self, r, members, weights, history):
        """One round: send, wait (at most round_timeout), drop who failed, combine, check."""
        t0 = time.perf_counter()
        results, missing = {}, {}
        # (re)open devices first: a simulator's start or a board's reset is not training time
        opening = {}
        for k, m in enumerate(members):
            if m.actor is None:
                self._start_actor(k, m, r)
                opening[k] = m.actor.identify.remote()
        if opening:
            ray.wait(list(opening.values()), num_returns=len(opening),
                     timeout=self.fleet.open_timeout)
        for k, ref in opening.items():
            try:
                members[k].info = ray.get(ref, timeout=0)
            except GetTimeoutError:
                missing[k] = f"did not open within {self.fleet.open_timeout:g} s"
            except RayError as e:
                missing[k] = f"could not open ({_reason(e)})"
        refs = {k: m.actor.run_round.remote(r, weights) for k, m in enumerate(members)
                if k not in missing}
        if self.on_round is not None:
            self.on_round(r, [m.actor for m in members])
        ray.wait(list(refs.values()), num_returns=len(refs), timeout=self.fleet.round_timeout)
        for k, ref in refs.items():       # device order, whatever order they finished in
            try:
                results[k] = ray.get(ref, timeout=0)
            except GetTimeoutError:
                missing[k] = f"no answer within {self.fleet.round_timeout:g} s"
            except RayActorError as e:
                missing[k] = f"actor died ({_reason(e)})"
            except RayTaskError as e:
                missing[k] = f"device failed ({_reason(e)})"
            except RayError as e:                  # whatever else Ray reports: not an answer
                missing[k] = f"lost ({_reason(e)})"
        missing = dict(sorted(missing.items()))
        for k in missing:
            self._drop(members[k])
            members[k].rounds_missed.append(r)
        present = sorted(results)
        if not present and r == 0 and self.resume is None:
            raise ConfigError("no device of the fleet finished round 1: " + "; ".join(
                f"device {k} ({members[k].board.label}): {why}" for k, why in missing.items()))
        if present:
            weights = combine(self.fleet.combine, weights,
                              [results[k]["weights"] for k in present],
                              [len(members[k].shard) for k in present])
        accuracy = evaluate(self.layers, self.build, weights, self.ds.x_test, self.ds.y_test)
        link = {}
        for k in present:
            res, m = results[k], members[k]
            add_counters(m.counters, res["counters"])
            m.energy_pj += res["energy_pj"]
            m.dense_energy_pj += res["dense_energy_pj"]
            m.state, m.state_round = res["state"], r + 1
            link[k] = res["counters"]["link_rx_bytes"] + res["counters"]["link_tx_bytes"]
        seen = sum(results[k]["seen"] for k in present)
        entry = {
            "round": r + 1,
            "test_accuracy": accuracy,
            "train_accuracy": sum(results[k]["correct"] for k in present) / seen if seen
            else None,
            "devices": present,
            "missing": {str(k): why for k, why in sorted(missing.items())},
            "samples_seen": {str(k): results[k]["seen"] for k in present},
            "batches_trained": {str(k): results[k]["trained"] for k in present},
            "batches_dropped": {str(k): results[k]["dropped"] for k in present},
            "energy_pj": {str(k): results[k]["energy_pj"] for k in present},
            "link_bytes": {str(k): v for k, v in link.items()},
            "weights_sha256": golden.weights_sha256(weights),
            "wall_s": time.perf_counter() - t0,
        }
        history.append(entry)
        gone = f"  missing {', '.join(f'{k} ({w})' for k, w in missing.items())}" \
            if missing else ""
        self._log(f"round {r + 1:3d}/{self.rounds}  test {100 * accuracy:5.1f}%  devices "
                  f"{len(present)}/{len(members)}  link {sum(link.values()):,} B  "
                  f"{entry['wall_s']:.1f} s{gone}")
        return weights

    def _write_checkpoint(self, rounds_done, members, weights, history):
        doc = {**self._identity(), "round": rounds_done, "weights": weights,
               "weights_sha256": golden.weights_sha256(weights), "history": history,
               "devices": [{"state": m.state, "state_round": m.state_round,
                            "counters": m.counters, "energy_pj": m.energy_pj,
                            "dense_energy_pj": m.dense_energy_pj,
                            "rounds_missed": m.rounds_missed} for m in members],
               "notes": self.notes}
        _save(self.checkpoint, doc)

    def _result(self, members, weights, history, wall):
        cfg = self.cfg
        total = dict.fromkeys(members[0].counters, 0)
        for m in members:
            add_counters(total, m.counters)
        spent = sum(m.energy_pj for m in members)
        dense = sum(m.dense_energy_pj for m in members)
        counts = label_counts(self.ds.y_train, self.shards, self.ds.classes)
        last = history[-1]
        return {
            "backend": "fleet",
            "boards": [m.board.label for m in members],
            "build": build_info(self.build),
            "settings": cfg.to_dict(),
            "fleet": self.fleet.to_dict(cfg),
            "epochs": cfg.epochs,
            "rounds": self.rounds,
            "test_accuracy": last["test_accuracy"],
            "train_accuracy": last["train_accuracy"],
            "counters": total,
            "profile": energy.EnergyModel(cfg.profile, self.build).name,
            "energy_pj": spent,
            "dense_energy_pj": dense,
            "saved_fraction": 1.0 - spent / dense if dense else 0.0,
            "devices": [{"board": m.board.label, "samples": int(len(m.shard)),
                         "build": (m.info or {}).get("build"),
                         "label_counts": counts[k].tolist(), "energy_pj": m.energy_pj,
                         "dense_energy_pj": m.dense_energy_pj, "counters": m.counters,
                         "rounds_missed": m.rounds_missed} for k, m in enumerate(members)],
            "link_bytes_per_round": [sum(h["link_bytes"].values()) for h in history],
            "history": history,
            "weights_sha256": golden.weights_sha256(weights),
            "wall_s": wall,
        }


def _reason(error):
    """What went wrong, in a line, for the round's report: the exception the actor's
    constructor or its device raised ("ConfigError: cannot open port ..."), else Ray's own
    first line (the process died)."""
    cause = getattr(error, "cause", None)
    if isinstance(cause, DeviceFailure):
        text = str(cause)
    elif cause is not None and not isinstance(cause, RayError):
        text = f"{type(cause).__name__}: {cause}"
    else:
        text = str(getattr(error, "error_msg", None) or error)
        lines = text.splitlines()
        frames = [i for i, line in enumerate(lines) if line.strip().startswith("File \"")]
        if frames:        # a traceback: the exception line follows the last frame
            after = [line for line in lines[frames[-1] + 1:]
                     if line and not line[0].isspace()]
            text = "\n".join(after) or text
    first = next((line.strip() for line in text.splitlines() if line.strip()),
                 type(error).__name__)
    return first[:300]


def summary(result):
    """A readable end-of-run report of a fleet run."""
    s, f = result["settings"], result["fleet"]
    lines = [f"Ember fleet of {len(result['boards'])} ({', '.join(result['boards'])}), "
             f"network {'-'.join(map(str, s['layers']))}, {result['epochs']} epochs in "
             f"{result['rounds']} rounds, combine {f['combine']}, split {f['split']}"
             + (f" (alpha {f['alpha']:g})" if f["split"] == "dirichlet" else "")
             + f", seed {s['seed']}",
             f"  test accuracy   {100 * result['test_accuracy']:6.2f} %",
             f"  energy spent    {result['energy_pj'] / 1e6:10.3f} uJ  (dense baseline "
             f"{result['dense_energy_pj'] / 1e6:.3f} uJ, saved "
             f"{100 * result['saved_fraction']:.1f} %)"]
    for k, d in enumerate(result["devices"]):
        missed = f", missed rounds {', '.join(str(r + 1) for r in d['rounds_missed'])}" \
            if d["rounds_missed"] else ""
        lines.append(f"    device {k} {d['board']:<10s} {d['samples']:5d} samples  "
                     f"{d['energy_pj'] / 1e6:10.3f} uJ{missed}")
    per_round = result["link_bytes_per_round"]
    lines.append(f"  link bytes      {sum(per_round):,} ({sum(per_round) / len(per_round):,.0f} "
                 f"per round)")
    lines.append(f"  weights sha256  {result['weights_sha256']}")
    lines.append(f"  wall time       {result['wall_s']:.1f} s")
    return "\n".join(lines)


def cmd_train(args):
    """`ember train --boards N` / `--ports A,B,...`: the CLI's fleet run (ember.cli parses)."""
    from . import cli, data
    from .policies import make_config
    overrides = {k: getattr(args, k) for k in cli.CONFIG_OPTIONS}
    checkpoint = load_checkpoint(args.resume) if args.resume else None
    if checkpoint is not None:
        cfg = cli.resume_config(checkpoint, args.preset, overrides)
        preset = args.preset or (checkpoint.get("notes") or {}).get("preset")
    else:
        preset = args.preset or "baseline"
        cfg = make_config(preset, **overrides)
    for option in ("plot", "reference"):
        if getattr(args, option):
            raise ConfigError(f"--{option} is for a single device; the fleet figures and plot "
                              f"come from python -m ember.bench --fleet")
    for path, option in ((args.json, "--json"), (args.checkpoint, "--checkpoint")):
        cli._check_output(path, option)
    ds = data.load(cfg.dataset, split_seed=0, scaling=cfg.scaling)
    cfg = cfg.for_data(ds, args.hidden)
    boards = boards_from(args.boards, args.ports, args.backend, args.build, args.baud,
                         args.simulator, args.uart)
    settings = FleetConfig(
        rounds=args.rounds, combine=args.combine or "mean", split=args.split or "iid",
        alpha=0.5 if args.alpha is None else args.alpha,
        round_timeout=600.0 if args.round_timeout is None else args.round_timeout,
        ray_address=args.ray_address)
    result = Fleet(boards, ds, cfg, settings, progress=not args.quiet,
                   checkpoint=args.checkpoint, resume=checkpoint, notes={"preset": preset},
                   build=args.build).run()
    print(summary(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2, sort_keys=True)
    return 0
