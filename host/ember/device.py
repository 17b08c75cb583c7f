"""The Device API: one interface to an Ember engine, whatever runs it.

Backends:
  model  the golden model in-process (`ModelDevice`);
  sim    the gateware in a simulator process behind a loopback socket (host link issue);
  board  a real board over its serial port (host link issue).

Every backend validates its arguments before touching the device, so a rejected call leaves
the device unchanged.
"""

import abc
import time
from dataclasses import replace

import numpy as np

from . import __version__, golden, regmap, spec
from .golden import GoldenModel
from .spec import ConfigError, StepSettings
from .protocol import LinkError

BACKENDS = ("model", "sim", "board")


class CommandStopped(RuntimeError):
    """A train or infer command that the device stopped before its end (docs/protocol.md
    section 10): `status` is "aborted" (an abort; the weights are as they were before the
    command) or "watchdog" (it ran longer than the `watchdog` register allows); `stopped` is
    the STOPPED register's fields (spec.STOP_FIELDS): with weights_changed set, layers below
    `layer` keep their weights from before the command, the layers above it have its update
    and `layer` may have part of it."""

    def __init__(self, message, status, stopped):
        super().__init__(message)
        self.status, self.stopped = status, stopped


class Device(abc.ABC):
    """What every backend provides. Counters are cumulative until `clear_counters`."""

    backend = None

    @abc.abstractmethod
    def identify(self):
        """The build: name, lanes, memory sizes, limits, feature flags, version."""

    @abc.abstractmethod
    def configure(self, layers, shifts=None):
        """Set the network (widths, input first) and optional per-layer forward shifts;
        the weights become zero."""

    @abc.abstractmethod
    def load_weights(self, weights):
        """Replace all weights (int16 Q1.14 matrices, one (N, K) per layer)."""

    @abc.abstractmethod
    def read_weights(self):
        """The weights as int16 matrices, one (N, K) per layer."""

    @abc.abstractmethod
    def train_batch(self, x, y, settings=StepSettings()):
        """Train on one batch; returns how many samples the forward pass got right."""

    @abc.abstractmethod
    def infer(self, x):
        """Predicted class of every sample of a batch (at most identify()['max_batch'])."""

    @abc.abstractmethod
    def read_counters(self):
        """Every event counter of spec.COUNTERS, by name."""

    @abc.abstractmethod
    def clear_counters(self):
        """Set every counter to zero."""

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
        "max_width": build.max_width, "clock_hz": build.clock_hz, "baud": build.baud,
        "dataflow": build.dataflow, "program_words": build.program_words,
        "data_bytes": build.data_bytes, "data_samples": build.data_samples,
        "features": list(build.features), "version": __version__,
    }


def build_of(info):
    """The spec.Build an identify() answer describes (the inverse of build_info)."""
    fields = {f: info[f] for f in ("lanes", "weight_words", "act_bytes", "grad_words",
                                   "scratch_entries", "max_batch", "max_layers", "max_width",
                                   "clock_hz", "baud")}
    fields["dataflow"] = info.get("dataflow", "outputs")
    fields["program_words"] = info.get("program_words", spec.Build.program_words)
    fields["data_bytes"] = info.get("data_bytes", 0)
    fields["data_samples"] = info.get("data_samples", 0)
    return spec.Build(name=info["build"], features=tuple(info["features"]), **fields)


def ModelDevice(build=spec.DEFAULT_BUILD):
    """The golden model as a device: the virtual engine (ember.virtual) behind the same link
    protocol, register map and host code as the sim and board backends. Bit-exact; cycle
    counters stay zero."""
    from .protocol import Link
    from .virtual import VirtualEngine, VirtualPort
    return EngineDevice(Link(VirtualPort(VirtualEngine(build)), timeout=1.0), "model")


class EngineDevice(Device):
    """An engine reached through its bus: the sim and board backends (and the model backend,
    through the virtual engine). `transport` has read_words(addr, count) and
    write_words(addr, words) (ember.protocol.Link over a serial port or a socket).

    Every argument is validated against the build (read from the device's registers) before
    anything is written, so a rejected call leaves the device as it was.
    """

    def __init__(self, transport, backend, closer=None):
        self.link = transport
        self.backend = backend
        self._closer = closer
        regs = {name: transport.read_words(regmap.reg(name), 1)[0]
                for name, (_, mode) in spec.REGISTERS.items() if mode == "ro"
                and name not in ("status", "correct", "rejected")}
        if regs["id"] != spec.ENGINE_ID:
            raise ConfigError(f"the device answered id {regs['id']:#010x}; an Ember engine "
                              f"answers {spec.ENGINE_ID:#010x}")
        if regs["version"] != spec.ENGINE_VERSION:
            raise ConfigError(f"engine version {regs['version']}; this host speaks version "
                              f"{spec.ENGINE_VERSION}")
        known = {b.lanes: b for b in spec.BUILDS.values()}
        name = next((b.name for b in spec.BUILDS.values()
                     if (b.lanes, b.weight_words, b.act_bytes, b.grad_words,
                         b.scratch_entries, b.max_batch, b.max_width, b.feature_mask(),
                         spec.DATAFLOWS.index(b.dataflow), b.baud) ==
                     (regs["lanes"], regs["weight_words"], regs["act_bytes"],
                      regs["grad_words"], regs["scratch_entries"], regs["max_batch"],
                      regs["max_width"], regs["features"], regs["dataflow"], regs["baud"])),
                    f"custom-{regs['lanes']}")
        base = spec.BUILDS.get(name, known.get(regs["lanes"], spec.DEFAULT_BUILD))
        self.build = spec.Build(name=name, lanes=regs["lanes"],
                                weight_words=regs["weight_words"], act_bytes=regs["act_bytes"],
                                grad_words=regs["grad_words"],
                                scratch_entries=regs["scratch_entries"],
                                max_batch=regs["max_batch"], max_layers=regs["max_layers"],
                                max_width=regs["max_width"], clock_hz=base.clock_hz,
                                program_words=base.program_words,
                                baud=regs["baud"], dataflow=spec.DATAFLOWS[regs["dataflow"]],
                                data_bytes=regs["data_bytes"],
                                data_samples=regs["data_samples"],
                                features=tuple(f for i, f in enumerate(spec.FEATURES)
                                               if regs["features"] >> i & 1))
        self.layers = None
        self._batch = None
        self._programs = {}                 # engine v2: command -> (key, end, first word)
        # resident data: the schedule words each half of the schedule region holds (None:
        # not known), and the link bytes that crossed while a command ran (a next epoch's
        # schedule written during an epoch: bench, ember_boards.throughput)
        self._schedules = [None, None]
        self.overlapped_link_bytes = 0
        # INFER_PROGRAM as last written (unknown on a build with the register until then)
        self._infer_program = None if "resident" in self.build.features else 0
        self._resident = None               # (train, test samples) loaded, or None

    def identify(self):
        return build_info(self.build)

    def configure(self, layers, shifts=None):
        layers = spec.check_network(layers, self.build)
        if shifts is not None and (len(shifts) != len(layers) - 1 or
                                   any(not 0 <= s <= 31 for s in shifts)):
            raise ConfigError(f"forward shifts {shifts} must be {len(layers) - 1} values in 0..31")
        self.layers, self.shifts, self._batch, self._programs = layers, shifts, None, {}
        self._resident = None               # the device unloads splits of another shape
        self._write_descriptors(1)
        zeros = [np.zeros((n, k), dtype=np.int16) for k, n in zip(layers, layers[1:])]
        self._write_weights(zeros)

    def _need_config(self):
        if self.layers is None:
            raise ConfigError("the device has no network configured; call configure() first")

    def _write_descriptors(self, batch):
        if batch == self._batch:
            return
        spec.check_network(self.layers, self.build, batch)
        writes = regmap.descriptor_writes(self.layers, self.build, batch, self.shifts)
        self._write_runs(writes)
        self._batch = batch

    def _write_program(self, command, batch, psg_relative=False, beside=False):
        """Engine v2: the program of `command` for this network, compiled for `batch` (it
        runs any batch up to that), in the program memory, written only when it differs from
        what the memory holds there. Compiled and checked here first (ember.dataflow).
        `beside` (resident data: an infer program for EVALUATE): at the end of the program
        memory (INFER_PROGRAM), beside the train program at word 0 when both fit, so that an
        epoch and an evaluation do not rewrite each other's; otherwise every program starts
        at word 0, so that what an epoch writes does not depend on what ran before it."""
        if self.build.dataflow != "samples":
            return
        key = (command, batch, bool(psg_relative) and command == "train")
        from . import dataflow
        shifts = self.shifts or [spec.HIDDEN_SHIFT] * (len(self.layers) - 2) + [spec.OUTPUT_SHIFT]
        if command == "train":
            phases = dataflow.train_program(self.layers, self.build, batch, shifts, key[2])
        else:
            phases = dataflow.infer_program(self.layers, self.build, batch, shifts)
        words = dataflow.encode(phases, self.build)
        base = 0
        if beside:
            base = self.build.program_words - len(words)
            train = self._programs.get("train")
            if train is not None and train[1] > base:
                base = 0                    # no room beside it: the train program goes
        if self._programs.get(command) != (key, base + len(words), base):
            # a write that fails leaves the program memory's contents unknown
            for name, (_, end, start) in list(self._programs.items()):
                if name == command or (start < base + len(words) and base < end):
                    del self._programs[name]
            for at, burst in regmap.program_writes(words):
                self.link.write_words(at + base, burst)
            self._programs[command] = (key, base + len(words), base)
        if command == "infer" and base != self._infer_program:
            self._write_runs([(regmap.reg("infer_program"), base)])
            self._infer_program = base

    def _write_runs(self, writes):
        """(address, value) writes, sent as bursts of consecutive addresses."""
        writes = sorted(writes)
        start, run = None, []
        for addr, value in writes + [(None, None)]:
            if run and addr == start + len(run):
                run.append(value)
                continue
            if run:
                self.link.write_words(start, run)
            start, run = addr, [value]

    def _write_weights(self, weights):
        self._write_runs(list(regmap.pack_weights(weights, self.layers, self.build).items()))

    def load_weights(self, weights):
        self._need_config()
        self._write_weights(golden.check_weights(self.layers, weights))

    def read_weights(self):
        self._need_config()
        return regmap.unpack_weights(self.link.read_words, self.layers, self.build)

    #: seconds a train or infer command may take before its (delayed) answer is given up on
    command_timeout = 60.0

    def _run(self, control, meanwhile=None):
        """Start a command; the engine answers the write when the command has finished. A
        command the engine's own check refuses (bad_value; the host's checks should have
        caught it first) raises ConfigError naming the check (REJECTED); one the device
        stopped raises CommandStopped. Interrupted (Ctrl-C) while the command runs, the host
        aborts it and waits for its answer before it lets the interrupt go on, so the device
        is left idle and, if the command had not yet written a weight, untouched.
        `meanwhile` (a build with the `abort` unit, whose link answers while a command runs):
        called after the command's write is sent and before its answer is awaited, to send
        frames the device takes while it runs (each with the link's own timeout). If it
        raises, the command is aborted first when that was a Ctrl-C, its answer awaited, and
        the exception goes on."""
        timeout = self.link.timeout
        self.link.timeout = max(timeout, self.command_timeout)
        name = next(n for bit, n in ((spec.CONTROL_TRAIN, "train"), (spec.CONTROL_INFER, "infer"),
                                     (spec.CONTROL_EPOCH, "epoch"),
                                     (spec.CONTROL_EVALUATE, "evaluate")) if control & bit)
        try:
            if meanwhile is None:
                self.link.write_words(regmap.reg("control"), [control])
            else:
                posted = self.link.post_write(regmap.reg("control"), control)
                self.link.timeout = timeout
                try:
                    meanwhile()
                except BaseException as e:
                    self._settle(posted, timeout, abort=isinstance(e, KeyboardInterrupt))
                    raise
                self.link.timeout = max(timeout, self.command_timeout)
                self.link.await_write(posted)
        except KeyboardInterrupt:
            if "abort" in self.build.features:
                self.abort()
            raise
        except LinkError as e:
            if e.status in ("aborted", "watchdog"):
                raise self._stopped(name, e.status) from e
            if e.status == "fault":
                raise CommandStopped(
                    f"the {name} command stopped: the device refused its program part way "
                    "(an address outside a memory, an unknown phase kind or a bound of 0); "
                    "layers it had updated keep their update", "fault", {}) from e
            if e.status != "bad_value":
                raise
            check = self.link.read_words(regmap.reg("rejected"), 1)[0]
            names = list(spec.COMMAND_CHECKS)
            why = (f"{names[check - 1]}: {spec.COMMAND_CHECKS[names[check - 1]]}"
                   if 1 <= check <= len(names) else f"REJECTED reads {check}")
            raise ConfigError(f"the device refused the command ({why}); nothing was "
                              "changed on it") from e
        finally:
            self.link.timeout = timeout

    def _settle(self, posted, timeout, abort):
        """After a failure while the posted command ran: abort it if `abort` (and the build
        can), then take its answer, whatever it is, so that no answer stays owed."""
        try:
            if abort and "abort" in self.build.features:
                self.link.write_words(regmap.reg("control"), [spec.CONTROL_ABORT])
            self.link.timeout = max(timeout, self.command_timeout)
            self.link.await_write(posted)
        except LinkError:
            pass

    def abort(self):
        """Stop the command the device is running, if any, and return once it has ended. The
        device answers an abort at once, even mid-command; the command stops before its first
        weight write, or else runs to its end (docs/protocol.md, section 10). STOPPED then says
        whether it stopped; a device that ran no command does nothing. A build without the
        abort unit (the iCEBreaker's) raises ConfigError: it finishes every command it starts."""
        if "abort" not in self.build.features:
            raise ConfigError(f"build '{self.build.name}' has no abort unit (its features: "
                              f"{', '.join(self.build.features)}); its commands run to their end")
        status = regmap.reg("status")
        self.link.write_words(regmap.reg("control"), [spec.CONTROL_ABORT])
        deadline = time.monotonic() + self.command_timeout
        while self.link.read_words(status, 1)[0] & 1:
            if time.monotonic() > deadline:
                raise LinkError(f"the device still runs a command {self.command_timeout:.0f} s "
                                "after an abort", "busy", self.link.seq)

    def _stopped(self, name, status):
        fields = spec.stop_fields(self.link.read_words(regmap.reg("stopped"), 1)[0])
        if status == "aborted":
            left = "it had written no weight: the device's weights are as before it"
        elif not fields["weights_changed"]:
            left = "it had written no weight yet: the device's weights are as before it"
        else:
            layer = fields["layer"]
            left = (f"layers below {layer} keep their weights from before it, the layers "
                    f"above have its update, layer {layer} may have part of it")
        why = "aborted" if status == "aborted" else \
            "stopped by the device's watchdog (it ran longer than the watchdog register allows)"
        return CommandStopped(f"the {name} command was {why}; {left}", status, fields)

    def train_batch(self, x, y, settings=StepSettings()):
        self._need_config()
        x, y = golden.check_batch(self.layers, self.build, x, y)
        settings.check(len(self.layers) - 1, self.build)
        self._write_descriptors(len(x))
        self._write_runs(regmap.settings_writes(settings, len(self.layers) - 1))
        self._write_program("train", len(x), settings.psg and settings.psg_relative)
        for base, words in regmap.batch_writes(x, y, self.build):
            self.link.write_words(base, words)
        self._run(spec.CONTROL_TRAIN)
        return self.link.read_words(regmap.reg("correct"), 1)[0]

    def infer(self, x):
        self._need_config()
        x, _ = golden.check_batch(self.layers, self.build, x)
        self._write_descriptors(len(x))
        self._write_program("infer", len(x))
        for base, words in regmap.batch_writes(x, None, self.build):
            self.link.write_words(base, words)
        self._run(spec.CONTROL_INFER)
        words = self.link.read_words(regmap.region("predictions"), (len(x) + 1) // 2)
        return regmap.unpack_halves(words, len(x))

    # ---- resident data (docs/protocol.md section 11)
    def _need_resident_unit(self):
        if "resident" not in self.build.features:
            raise ConfigError(f"build '{self.build.name}' has no resident data memory (its "
                              f"units: {', '.join(self.build.features)}); train by streaming "
                              "the batches instead (--resident off)")

    def load_data(self, x_train, y_train, x_test=None, y_test=None):
        """Upload a training split (and optionally a test split) into the device's resident
        data memory, once; train_epoch and evaluate_resident then walk them on the device.
        Inputs are UQ2.6 bytes (samples, network inputs), labels class indices. Everything is
        checked before anything is written: a split of another width, labels the network
        cannot output, or splits larger than the memory (the error names the bytes and
        labels needed and the build's) raise ConfigError and leave the device as it was."""
        self._need_config()
        self._need_resident_unit()
        x_train, y_train = golden.check_batch(self.layers, self.build, x_train, y_train,
                                              spec.ORDER_MAX_SAMPLES, "training split")
        if x_test is None:
            x_test, y_test = x_train[:0], y_train[:0]
        else:
            x_test, y_test = golden.check_batch(self.layers, self.build, x_test, y_test,
                                                spec.ORDER_MAX_SAMPLES, "test split")
        samples, width = len(x_train) + len(x_test), spec.sample_data_bytes(self.layers[0])
        b = self.build
        if samples * width > b.data_bytes or samples > b.data_samples:
            raise ConfigError(
                f"the splits need {samples * width:,} bytes and {samples:,} labels "
                f"({len(x_train):,} training + {len(x_test):,} test samples x {width} "
                f"bytes, the inputs padded to a word); build '{b.name}' holds {b.data_bytes:,} bytes and "
                f"{b.data_samples:,} labels of resident data. Stream the batches instead "
                "(--resident off), or load the training split alone")
        # unloaded while the words change, so a failed upload is never taken for data
        self._write_runs([(regmap.reg("train_samples"), 0), (regmap.reg("test_samples"), 0)])
        self._resident = None
        for base, words in regmap.data_writes(np.concatenate([x_train, x_test]),
                                              np.concatenate([y_train, y_test])):
            self.link.write_words(base, words)
        self._write_runs([(regmap.reg("train_samples"), len(x_train)),
                          (regmap.reg("test_samples"), len(x_test))])
        self._resident = (len(x_train), len(x_test))

    def prepare_epochs(self, batch_size, psg_relative=False):
        """Write what train_epoch at `batch_size` and evaluate_resident will run (engine v2:
        the train program for the batch size and the infer program for max_batch, side by
        side), and the descriptors for the batch size, so that an epoch's link bytes are the
        same whichever epoch it is. They would otherwise be written by the first epoch and
        evaluation. Nothing is written on a build without the resident unit."""
        self._need_config()
        if "resident" not in self.build.features:
            return
        self._write_descriptors(batch_size)
        self._write_program("train", batch_size, psg_relative)
        self._write_program("infer", self.build.max_batch, beside=True)

    def _need_data(self, split):
        self._need_config()
        self._need_resident_unit()
        loaded = self._resident or (0, 0)
        if loaded[split == "test"] == 0:
            raise ConfigError(f"no resident {split} split is loaded on the device; call "
                              "load_data() first")
        return loaded

    def train_epoch(self, schedule, next_schedule=None):
        """Train one epoch on the resident training split as `schedule` says
        (ember.schedule.EpochSchedule: the order key, the batch size, each batch's SMD drop,
        SLU mask and LFSR seed, the epoch's settings), in one command. Returns how many of
        the trained samples the forward passes classified correctly. The same weights and
        event counters as training the schedule's batches one by one (train_batch).

        `next_schedule`: the next epoch's, if the caller knows it. Its words go into the
        schedule half this epoch does not read while this epoch runs, so the next
        train_epoch(next_schedule) finds them there and sends only its settings and command:
        the link's time hides behind the engine's. Only where the link answers while a
        command runs (the `abort` unit) and each epoch's batches fit a half
        (spec.schedule_half_words); otherwise the next epoch writes them itself."""
        n_train, _ = self._need_data("training")
        if schedule.samples != n_train:
            raise ConfigError(f"the schedule covers {schedule.samples} samples; the resident "
                              f"training split holds {n_train}")
        n_layers = len(self.layers) - 1
        schedule.settings.check(n_layers, self.build)
        for mask, dropped in zip(schedule.masks, schedule.drops):
            if not dropped:
                replace(schedule.settings, update_mask=mask).check(n_layers, self.build)
        # (the descriptors are prepare_epochs' already: an epoch's link bytes do not depend
        # on what ran before it, and a resumed run's first epoch is the straight run's)
        self._write_descriptors(schedule.batch_size)
        words = schedule.words()
        half = self._schedules.index(words) if words in self._schedules else 0
        self._write_runs(regmap.settings_writes(schedule.settings, n_layers)
                         + [(regmap.reg("epoch_key"), schedule.key),
                            (regmap.reg("schedule_half"), half)])
        # one program for the epoch's batches and its short last one (engine v2)
        self._write_program("train", schedule.batch_size,
                            schedule.settings.psg and schedule.settings.psg_relative)
        if self._schedules[half] != words:
            self._write_schedule(half, words)
        ahead = None if next_schedule is None else next_schedule.words()
        if (ahead is None or ahead in self._schedules or not self._sends_ahead(len(words))
                or not self._sends_ahead(len(ahead))):
            self._run(spec.CONTROL_EPOCH)
        else:
            self._run(spec.CONTROL_EPOCH, meanwhile=lambda: self._write_schedule(
                1 - half, ahead, overlapped=True))
        return self.link.read_words(regmap.reg("correct"), 1)[0]

    def _sends_ahead(self, batches):
        """Whether an epoch of `batches` batches can run while the next one's schedule goes in
        (train_epoch's next_schedule): the link answers while a command runs (the `abort`
        unit) and the schedule fits either half."""
        H = spec.schedule_half_words(self.build)
        return ("abort" in self.build.features and batches <= H
                and H + batches <= self.build.data_samples)

    def preload_schedule(self, schedule, half):
        """Write `schedule`'s words into schedule half `half` now, where train_epoch would have
        sent them during the epoch before (a resumed run: the run it resumes sent its next
        epoch's there, into half epoch % 2), so that train_epoch(schedule) does not send them
        and the epoch's link bytes are the straight run's. Returns False, writing nothing,
        where train_epoch sends no schedule ahead."""
        if not self._sends_ahead(len(schedule.words())):
            return False
        self._write_schedule(half, schedule.words())
        return True

    def _write_schedule(self, half, words, overlapped=False):
        """An epoch's schedule words into the schedule region from half `half` on (wrapping
        at its end), noting what each half then holds."""
        link = self.link
        before = link.tx_bytes + link.rx_bytes - link.kept_answer_bytes
        H = spec.schedule_half_words(self.build)
        spans = len(words) > H
        self._schedules[half] = None
        if spans:
            self._schedules[1 - half] = None
        for base, run in regmap.schedule_writes(words, half * H, self.build.data_samples):
            link.write_words(base, run)
        self._schedules[half] = words
        if overlapped:
            # (the command's own answer, if it came meanwhile, is not the schedule's)
            self.overlapped_link_bytes += (link.tx_bytes + link.rx_bytes
                                           - link.kept_answer_bytes - before)

    def evaluate_resident(self):
        """Infer the resident test split on the device, in batches of max_batch (as
        infer_all), in one command; returns how many samples it classified correctly."""
        self._need_data("test")
        self._write_descriptors(self._batch or self.build.max_batch)
        # the evaluation's batches are max_batch and its remainder: one program for both
        self._write_program("infer", self.build.max_batch, beside=True)
        self._run(spec.CONTROL_EVALUATE)
        return self.link.read_words(regmap.reg("test_correct"), 1)[0]

    def read_counters(self):
        words = self.link.read_words(regmap.region("counters"), 2 * len(spec.COUNTERS))
        return regmap.counters_from_words(words)

    def clear_counters(self):
        self.link.write_words(regmap.reg("control"), [spec.CONTROL_CLEAR_COUNTERS])

    def close(self):
        if self._closer:
            closer, self._closer = self._closer, None
            closer()


def _open_link(url, baud, timeout=None, retries=5):
    import serial
    from .protocol import Link
    try:
        port = serial.serial_for_url(url, baudrate=baud, timeout=0.05)
    except (serial.SerialException, ValueError) as e:
        raise ConfigError(f"cannot open port {url!r}: {e}") from None
    return port, Link(port, retries=retries, timeout=timeout)


def _board_bauds_text():
    return ", ".join(f"{board} {baud}" for board, baud in spec.board_bauds().items())


def open_board(port, baud=None, retries=5, timeout=None):
    """A real board (or anything speaking the link) on a serial port name or pyserial URL.

    baud: the rate to open the port at; by default each rate of Ember's board bitstreams
    (spec.board_bauds(): the boards' builds' Build.baud) in turn, until one answers. The
    board's BAUD register must then read the rate the port was opened at; if it does not,
    or if nothing answers, ConfigError names the rates tried and the builds' rates."""
    tried = [baud] if baud else sorted(set(spec.board_bauds().values()))
    silence = None
    for rate in tried:
        ser, link = _open_link(port, rate, timeout, retries)
        try:
            device = EngineDevice(link, "board", closer=ser.close)
        except LinkError as e:
            ser.close()
            if e.status != "no_response":
                raise
            silence = e
            continue
        except Exception:
            ser.close()
            raise
        if device.build.baud != rate:
            device.close()
            raise ConfigError(f"the board on {port!r} answered at {rate} baud, but its build "
                              f"'{device.build.name}' runs its UART at {device.build.baud} baud "
                              f"(its BAUD register); open it at {device.build.baud}")
        return device
    raise ConfigError(f"no answer from {port!r} at {' or '.join(map(str, tried))} baud; Ember's "
                      f"board bitstreams run at: {_board_bauds_text()} (Build.baud), and a board "
                      f"opened at another rate than its bitstream's does not answer ({silence})")


class SimulationClock:
    """Seconds of simulated time of a simulated board: the clock its Link's timeouts run on.

    The board's bench (ember_sim.benches.board_bench) keeps the simulated time, in ps, as 8
    little-endian bytes at the start of the file `path`. Measured on it, a response timeout
    means "the simulated board has run this long without answering", however slowly the
    machine simulates, so a loaded machine never makes the host send a frame again.

    proc:    the simulator's process (subprocess.Popen); once it has ended, reading the clock
             raises ConfigError naming its exit code and `log`, instead of waiting on.
    stall_s: wall seconds of one wait (``restart()`` begins one) in which the simulated time
             does not advance at all after which the simulator counts as stuck: the clock then
             reads infinity, so the Link gives up waiting as for a lost frame.
    """

    def __init__(self, path, proc=None, log=None, stall_s=300.0):
        self.path, self.proc, self.log, self.stall_s = path, proc, log, stall_s
        self._seen, self._since = None, None
        self.restart()

    def picoseconds(self):
        """The simulated time the bench last wrote (0 before it first did)."""
        try:
            with open(self.path, "rb") as f:
                data = f.read(8)
        except FileNotFoundError:
            return 0
        return int.from_bytes(data, "little") if len(data) == 8 else 0

    def restart(self):
        """Begin a wait: the stall time counts from now."""
        import time
        self._seen, self._since = self.picoseconds(), time.monotonic()

    def __call__(self):
        import time
        if self.proc is not None and self.proc.poll() is not None:
            raise ConfigError(f"the simulated board exited with code {self.proc.returncode} "
                              f"while the host waited for an answer; log {self.log}")
        seen, now = self.picoseconds(), time.monotonic()
        if seen != self._seen:
            self._seen, self._since = seen, now
        elif now - self._since > self.stall_s:
            return float("inf")
        return seen * 1e-12


#: Simulated seconds the sim backend's Link waits for an answer: far beyond any frame's
#: (the longest, at the ULX3S top's 10 cycles per UART bit, takes about 14 ms of its 30 MHz
#: clock); the wall time it takes does not matter (SimulationClock).
SIM_LINK_TIMEOUT_S = 1.0


def open_sim(build=spec.DEFAULT_BUILD, simulator="verilator", uart=False, log=None,
             start_timeout=900.0, top=None):
    """Start the simulated board (ember_sim.board) in its own process and connect to it over
    a loopback socket. Closing the device closes the socket; the simulator then ends, and is
    killed if it does not. `top` ("icebreaker" or "ulx3s") simulates that board's real top
    instead, every byte crossing its UART pins (ember_sim.board_sim). The link's timeouts
    run on the simulation's time (SimulationClock), not on the wall clock."""
    import os
    import signal
    import subprocess
    import sys
    import tempfile
    import time

    if simulator not in ("verilator", "icarus"):
        raise ConfigError(f"simulator '{simulator}' is not 'verilator' or 'icarus'")
    tmp = tempfile.mkdtemp(prefix="ember-sim-")
    port_file = os.path.join(tmp, "port")
    log_path = log or os.path.join(tmp, "board.log")
    progress_file = os.path.join(tmp, "progress")
    name = build.name
    for base in spec.BUILDS.values():
        # a named build on the other engine (spec.with_dataflow): the board makes it
        other = next((d for d in spec.DATAFLOWS if d != base.dataflow), None)
        if name not in spec.BUILDS and other and build == spec.with_dataflow(base, other):
            name = base.name
            cmd_dataflow = ["--dataflow", other]
            break
    else:
        cmd_dataflow = []
    cmd = [sys.executable, "-m", "ember_sim.board", "--simulator", simulator,
           "--build", name, "--port-file", port_file, "--progress-file", progress_file,
           *cmd_dataflow]
    if uart:
        cmd.append("--uart")
    if top:
        cmd += ["--top", top]
    log_file = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)

    def stop():
        try:
            if proc.poll() is None:
                proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            log_file.close()

    def fail(why):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log_file.close()
        with open(log_path) as f:
            tail = "".join(f.readlines()[-25:])
        raise ConfigError(f"the simulated board ({simulator}) {why}; log {log_path}:\n{tail}")

    deadline = time.monotonic() + start_timeout
    while not os.path.exists(port_file):
        if proc.poll() is not None:
            fail(f"exited with code {proc.returncode} before it listened")
        if time.monotonic() > deadline:
            fail(f"did not listen within {start_timeout:.0f} s")
        time.sleep(0.05)
    with open(port_file) as f:
        port = int(f.read())
    ser, link = _open_link(f"socket://127.0.0.1:{port}", build.baud, timeout=SIM_LINK_TIMEOUT_S)
    link.clock = SimulationClock(progress_file, proc, log_path)

    def close():
        ser.close()
        stop()
    try:
        dev = EngineDevice(link, "sim", closer=close)
    except Exception:
        close()
        raise
    dev.simulator, dev.log_path = simulator, log_path
    return dev


def open_device(backend="model", build=None, port=None, simulator="verilator", **options):
    """A Device for a backend name: 'model' (golden model), 'sim' (simulated board) or
    'board' (a real board on `port`)."""
    build = spec.BUILDS[build] if isinstance(build, str) else (build or spec.DEFAULT_BUILD)
    if backend == "model":
        return ModelDevice(build)
    if backend == "sim":
        return open_sim(build, simulator, **options)
    if backend == "board":
        if not port:
            raise ConfigError("the board backend needs a port: --port /dev/ttyUSB1 (or any "
                              "pyserial URL)")
        return open_board(port, **options)
    raise ConfigError(f"backend '{backend}' is not one of {', '.join(BACKENDS)}")
