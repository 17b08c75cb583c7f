"""The virtual engine: EngineCore's bus map and LinkBridge's frame handling in Python, computing
with the golden model. It is the `model` backend's device: the host drives it with the same
bytes, addresses and commands as the gateware, so the model, sim and board backends share one
code path and count the same events (link bytes included).
"""

from dataclasses import replace

import numpy as np

from . import dataflow, protocol, spec
from .golden import GoldenModel
from .schedule import EpochSchedule
from .spec import ConfigError, StepSettings

_STATUS = spec.LINK_STATUS
# region numbers (the address bits above REGION_BITS) and the small regions' ends, from the map
_REGION = {name: base >> spec.REGION_BITS for name, (base, _) in spec.ADDRESS_MAP.items()}
_REGS_END = sum(spec.ADDRESS_MAP["regs"])
_COUNTERS_BASE, _COUNTERS_WORDS = spec.ADDRESS_MAP["counters"]
_COUNTERS_END = _COUNTERS_BASE + _COUNTERS_WORDS


class BusError(Exception):
    def __init__(self, status):
        super().__init__(status)
        self.status = status


class VirtualEngine:
    """Bus-level model of EngineCore for one build (see hw/ember_hw/engine.py)."""

    def __init__(self, build=spec.DEFAULT_BUILD):
        self.build = build
        P = build.lanes
        self.model = GoldenModel(build)
        # engine v2 (dataflow "samples"): one weight after another, the activations in its
        # sample-interleaved byte layout, and the program memory (regmap, ember.dataflow)
        self.v2 = build.dataflow == "samples"
        self.program = np.zeros(build.program_words, dtype=np.int64)
        self.weights = (np.zeros(build.weight_words * P, dtype=np.int64) if self.v2 else
                        np.zeros((build.weight_words, P), dtype=np.int64))
        self.labels = np.zeros(build.max_batch, dtype=np.int64)
        self.predictions = np.zeros(build.max_batch, dtype=np.int64)
        self.acts = np.zeros(build.act_bytes, dtype=np.int64)
        # resident data (feature "resident", docs/protocol.md section 11)
        self.resident = "resident" in build.features
        self.data = np.zeros(build.data_bytes, dtype=np.int64)
        self.data_labels = np.zeros(build.data_samples, dtype=np.int64)
        self.schedule = np.zeros(build.data_samples, dtype=np.int64)
        self.test_correct = 0
        # the registers as the gateware's register bank holds them (ember_hw.regbank): a write
        # outside a setting's or field's lo..hi is refused, a left-out unit's settings constant
        self.settings_table = build.settings()
        self.fields = build.descriptor_fields()
        self.regs = {name: s.init for name, s in self.settings_table.items()}
        self.layer = [{f: s.init for f, s in self.fields.items()}
                      for _ in range(build.max_layers)]
        self.correct = 0
        self.rejected = 0                   # REJECTED: 1 + the COMMAND_CHECKS index, or 0
        self.labels_written = 0             # bit w: label word w written at this class count
        self.link_rx = self.link_tx = 0
        self.link_state = protocol.LinkState()
        self.ro = spec.read_only_values(build)
        self._by_offset = {off: (name, mode) for name, (off, mode) in spec.REGISTERS.items()}

    # ---- bus
    def read(self, addr):
        region, off = addr >> spec.REGION_BITS, addr & ((1 << spec.REGION_BITS) - 1)
        P = self.build.lanes
        if region == _REGION["regs"] and off < _REGS_END:
            if off in self._by_offset:
                name, mode = self._by_offset[off]
                if mode == "ro":
                    # a command runs to its end before the next frame arrives (the model has
                    # no clock): never busy, never stopped (STOPPED 0), nothing for an abort
                    # or the watchdog to stop
                    return {"status": 0, "correct": self.correct, "rejected": self.rejected,
                            "stopped": 0, "test_correct": self.test_correct,
                            }.get(name, self.ro.get(name))
                return 0 if mode == "wo" else self.regs[name]
            layer, field = self._layer_field(off)
            return self.layer[layer][field]
        if region == _REGION["counters"] and off < _COUNTERS_END:
            idx = (off - _COUNTERS_BASE) >> 1
            if idx >= len(spec.COUNTERS):
                raise BusError("out_of_range")
            value = self.counters()[spec.COUNTERS[idx]]
            return (value >> 32) if off & 1 else value & 0xFFFFFFFF
        if region == _REGION["weights"]:
            if self.v2:
                if 2 * off >= len(self.weights):
                    raise BusError("out_of_range")
                lo, hi = self.weights[2 * off], self.weights[2 * off + 1]
                return int(lo & 0xFFFF) | (int(hi & 0xFFFF) << 16)
            word, pair = divmod(off * 2, P)
            if word >= self.build.weight_words:
                raise BusError("out_of_range")
            lo, hi = self.weights[word, pair], self.weights[word, pair + 1]
            return int(lo & 0xFFFF) | (int(hi & 0xFFFF) << 16)
        if region == _REGION["program"] and self.v2:
            if off >= len(self.program):
                raise BusError("out_of_range")
            return int(self.program[off])
        if region == _REGION["acts"]:
            raise BusError("out_of_range" if off >= (self.build.act_bytes + 3) // 4
                           else "bad_value")
        if region in self._resident_regions():
            # write only, like the input batch
            raise BusError("out_of_range" if off >= self._resident_regions()[region]
                           else "bad_value")
        if region in (_REGION["labels"], _REGION["predictions"]):
            if off >= (self.build.max_batch + 1) // 2:
                raise BusError("out_of_range")
            mem = self.labels if region == _REGION["labels"] else self.predictions
            return int(mem[2 * off] & 0xFFFF) | (int(mem[2 * off + 1] & 0xFFFF) << 16)
        raise BusError("out_of_range")

    def write(self, addr, value):
        region, off = addr >> spec.REGION_BITS, addr & ((1 << spec.REGION_BITS) - 1)
        P = self.build.lanes
        if region == _REGION["regs"] and off < _REGS_END:
            if off in self._by_offset:
                name, mode = self._by_offset[off]
                if mode == "ro":
                    return                      # the gateware acknowledges and ignores
                if mode == "wo":
                    return self._control(value)
                setting = self.settings_table[name]
                if setting.feature is not None and setting.feature not in self.build.features:
                    return                      # no register: answered and dropped
                if not setting.contains(value):
                    raise BusError("bad_value")
                if name == "layers":
                    self.labels_written = 0     # the class count may change
                shape = self._data_shape()
                self.regs[name] = value
                self._keep_data_if(shape)
                return
            layer, field = self._layer_field(off)
            if not self.fields[field].contains(value):
                raise BusError("bad_value")
            if field == "outputs" and layer == self.regs["layers"] - 1:
                self.labels_written = 0
            shape = self._data_shape()
            self.layer[layer][field] = value
            self._keep_data_if(shape)
            return
        if region == _REGION["counters"] and off < _COUNTERS_END:
            raise BusError("out_of_range")
        if region == _REGION["weights"]:
            if self.v2:
                if 2 * off >= len(self.weights):
                    raise BusError("out_of_range")
                self.weights[2 * off] = _s16(value & 0xFFFF)
                self.weights[2 * off + 1] = _s16(value >> 16)
                return
            word, pair = divmod(off * 2, P)
            if word >= self.build.weight_words:
                raise BusError("out_of_range")
            self.weights[word, pair] = _s16(value & 0xFFFF)
            self.weights[word, pair + 1] = _s16(value >> 16)
            return
        if region == _REGION["program"] and self.v2:
            if off >= len(self.program):
                raise BusError("out_of_range")
            self.program[off] = value
            return
        if region == _REGION["acts"]:
            if off >= (self.build.act_bytes + 3) // 4:
                raise BusError("out_of_range")
            batch, k0 = self.regs["batch"], self.layer[0]["inputs"]
            if self.v2:
                # the input words of the sample blocks; a byte of a lane past the batch is
                # dropped (and not counted), like a byte past the batch in v1
                for i in range(4):
                    byte = 4 * off + i
                    if byte < min(self.build.sample_blocks(batch) * k0,
                                  self.build.act_bytes // P) * P:
                        word, lane = divmod(byte, P)
                        if (word // k0) * P + lane < batch:
                            self.acts[byte] = (value >> (8 * i)) & 0xFF
                return
            limit = batch * k0
            for i in range(4):
                if 4 * off + i < limit:
                    self.acts[4 * off + i] = (value >> (8 * i)) & 0xFF
            return
        if region == _REGION["labels"]:
            if off >= (self.build.max_batch + 1) // 2:
                raise BusError("out_of_range")
            low, high = value & 0xFFFF, value >> 16
            if max(low, high) >= self.classes():
                raise BusError("bad_value")
            self.labels[2 * off], self.labels[2 * off + 1] = low, high
            self.labels_written |= 1 << off
            return
        if region == _REGION["predictions"]:
            raise BusError("out_of_range" if off >= (self.build.max_batch + 1) // 2
                           else "bad_value")
        if region in self._resident_regions():
            if off >= self._resident_regions()[region]:
                raise BusError("out_of_range")
            return self._write_resident(region, off, value)
        raise BusError("out_of_range")

    # ---- resident data
    def _resident_regions(self):
        """The resident data regions of this build: region number -> words (none without
        the unit, so their addresses are out of range)."""
        if not self.resident:
            return {}
        b = self.build
        return {_REGION["schedule"]: b.data_samples, _REGION["data"]: (b.data_bytes + 3) // 4,
                _REGION["data_labels"]: (b.data_samples + 1) // 2}

    def _write_resident(self, region, off, value):
        if region == _REGION["schedule"]:
            self.schedule[off] = value
        elif region == _REGION["data"]:
            for i in range(4):
                if 4 * off + i < len(self.data):
                    self.data[4 * off + i] = (value >> (8 * i)) & 0xFF
        else:
            # a label the network cannot output is refused, as in the labels region
            low, high = value & 0xFFFF, value >> 16
            if max(low, high) >= self.classes():
                raise BusError("bad_value")
            self.data_labels[2 * off] = low
            if 2 * off + 1 < len(self.data_labels):
                self.data_labels[2 * off + 1] = high

    def _data_shape(self):
        """What the resident splits were written for: the input width and the class count."""
        return (self.layer[0]["inputs"], self.classes())

    def _keep_data_if(self, shape):
        """A write that changed the input width or the class count unloads the splits (their
        bytes and labels were checked for the old ones): train_samples and test_samples
        become 0, so an EPOCH or EVALUATE is refused ("data") until they are loaded again."""
        if self.resident and self._data_shape() != shape:
            self.regs["train_samples"] = self.regs["test_samples"] = 0

    def _layer_field(self, off):
        rel = off - spec.LAYER_BASE
        layer, field = divmod(rel, spec.LAYER_STRIDE)
        if rel < 0 or layer >= self.build.max_layers or field >= len(spec.LAYER_FIELDS):
            raise BusError("out_of_range")
        return layer, spec.LAYER_FIELDS[field]

    def classes(self):
        """The class count labels are checked against: the last layer's outputs (0 while no
        layer is configured)."""
        n = self.regs["layers"]
        return self.layer[n - 1]["outputs"] if n else 0

    def counters(self):
        c = dict(self.model.counters)
        c["link_rx_bytes"] += self.link_rx
        c["link_tx_bytes"] += self.link_tx
        return c

    # ---- commands
    def _network(self):
        n = self.regs["layers"]
        desc = self.layer[:n]
        layers = [desc[0]["inputs"]] + [d["outputs"] for d in desc]
        return layers, desc

    def _control(self, value):
        if value & spec.CONTROL_ABORT:
            return                              # no command is running: nothing to stop
        resident = value & (spec.CONTROL_EPOCH | spec.CONTROL_EVALUATE)
        # without TRAIN and INFER; a build without the unit ignores the bits (as unknown bits)
        if resident and self.resident and not value & (spec.CONTROL_TRAIN | spec.CONTROL_INFER):
            return self._resident_command(value)
        command = value & (spec.CONTROL_TRAIN | spec.CONTROL_INFER)
        train = bool(value & spec.CONTROL_TRAIN)
        if command:
            # checked before anything happens: a refused command changes nothing (its
            # counter clear included), as in the engine's register bank
            self._verdict(spec.check_command(self.build, self.regs, self.layer, train,
                                             self.labels_written)
                          or self._program_fault(train, self.regs["batch"]), value)
        elif value & spec.CONTROL_CLEAR_COUNTERS:
            self._verdict(None, value)
        if command and self.v2:
            return self._run_program(bool(value & spec.CONTROL_TRAIN))
        if command:
            layers, desc = self._network()
            P = self.build.lanes
            self.model.configure(layers, [d["shift"] for d in desc])
            mats = []
            for d in desc:
                n, k = d["outputs"], d["inputs"]
                blocks = self.build.blocks(n)
                mem = self.weights[d["weight_base"]:d["weight_base"] + blocks * k]
                mats.append(mem.reshape(blocks, k, P).transpose(0, 2, 1)
                            .reshape(blocks * P, k)[:n].astype(np.int16))
            self.model.weights = mats
            batch = self.regs["batch"]
            x = self.acts[:batch * layers[0]].reshape(batch, layers[0])
            if value & spec.CONTROL_TRAIN:
                self.correct = self.model.train_batch(x, self.labels[:batch], self._settings())
                for d, w in zip(desc, self.model.weights):
                    n, k = w.shape
                    blocks = self.build.blocks(n)
                    lanes = np.zeros((blocks * P, k), dtype=np.int64)
                    lanes[:n] = w
                    self.weights[d["weight_base"]:d["weight_base"] + blocks * k] = \
                        lanes.reshape(blocks, P, k).transpose(0, 2, 1).reshape(-1, P)
            else:
                self.predictions[:batch] = self.model.infer(x)

    def _program_fault(self, train, batch):
        """Engine v2: "program" unless the program memory holds, at the command's first word
        (0 for TRAIN and EPOCH, INFER_PROGRAM for INFER and EVALUATE), the program the host
        compiles for the network in the descriptors (ember.dataflow) with a capacity of
        `batch` or more; None on v1. The model runs no other program (the engine runs any
        that its program check passes)."""
        if not self.v2:
            return None
        layers, desc = self._network()
        entry = 0 if train else self.regs.get("infer_program", 0)
        shifts = [d["shift"] for d in desc]
        settings = self._settings()
        try:
            phases = dataflow.decode([int(w) for w in self.program[entry:]])
            level = dataflow.SAMPLE_LEVEL[phases[0].kind]
            capacity = min(phases[0].bounds[level] * self.build.lanes, self.build.max_batch)
            expect = (dataflow.train_program(layers, self.build, capacity, shifts,
                                             settings.psg and settings.psg_relative)
                      if train else dataflow.infer_program(layers, self.build, capacity, shifts))
        except (ConfigError, IndexError, KeyError):
            return "program"
        return None if phases == expect and capacity >= batch else "program"

    def _run_program(self, train):
        """Engine v2: run the command (its program checked by _program_fault) with the
        golden model."""
        layers, _ = self._network()
        batch = self.regs["batch"]
        settings = self._settings()
        wbase = self._load_model()
        P, K = self.build.lanes, layers[0]
        S = self.build.sample_blocks(batch)
        x = self.acts[:S * K * P].reshape(S, K, P).transpose(0, 2, 1).reshape(S * P, K)[:batch]
        if train:
            self.correct = self.model.train_batch(x, self.labels[:batch], settings)
            self._store_weights(wbase)
        else:
            self.predictions[:batch] = self.model.infer(x)

    def _verdict(self, failed, value):
        """A command's check: refused (REJECTED, bad_value) before anything happens, its
        counter clear included, as in the engine's register bank; else the clear is done."""
        self.rejected = 0 if failed is None else 1 + list(spec.COMMAND_CHECKS).index(failed)
        if failed is not None:
            raise BusError("bad_value")
        if value & spec.CONTROL_CLEAR_COUNTERS:
            self.model.clear_counters()
            self.link_rx = self.link_tx = 0

    def _load_model(self):
        """Engine v2: the golden model configured with the descriptors' network and the
        weight memory's weights (ember.dataflow.layout); returns the layers' weight bases."""
        layers, desc = self._network()
        self.model.configure(layers, [d["shift"] for d in desc])
        wbase, _, _ = dataflow.layout(layers, self.build, 1)    # no base depends on the batch
        self.model.weights = [self.weights[b:b + n * k].reshape(n, k).astype(np.int16)
                              for b, k, n in zip(wbase, layers[:-1], layers[1:])]
        return wbase

    def _store_weights(self, wbase):
        for b, w in zip(wbase, self.model.weights):
            self.weights[b:b + w.size] = w.reshape(-1)

    def _resident_command(self, value):
        """EPOCH and/or EVALUATE: checked as a command (spec.check_resident), then the epoch's
        batches with the golden model as train commands of those batches would run them,
        then the test split in batches of max_batch as infer commands would."""
        epoch, evaluate = bool(value & spec.CONTROL_EPOCH), bool(value & spec.CONTROL_EVALUATE)
        failed = spec.check_resident(self.build, self.regs, self.layer, epoch, evaluate)
        # the programs it runs: the train program for the batch, the infer program for
        # max_batch (the evaluation's batches)
        if failed is None and epoch:
            failed = self._program_fault(True, self.regs["batch"])
        if failed is None and evaluate:
            failed = self._program_fault(False, self.build.max_batch)
        self._verdict(failed, value)
        layers, _ = self._network()
        wbase = self._load_model()
        K, n_train = layers[0], self.regs["train_samples"]
        # each sample padded to a whole word (spec.sample_data_bytes)
        stride = spec.sample_data_bytes(K)
        x = self.data[:(n_train + self.regs["test_samples"]) * stride].reshape(-1, stride)[:, :K]
        # the gather reads each sample's words once per batch it is in (data_reads)
        sample_words = spec.sample_data_words(K)
        if epoch:
            batch = self.regs["batch"]
            # the schedule half's words, wrapping at the region's end
            first = self.regs["schedule_half"] * spec.schedule_half_words(self.build)
            words = [int(self.schedule[(first + b) % self.build.data_samples])
                     for b in range(-(-n_train // batch))]
            sched = EpochSchedule.from_words(words, self.regs["epoch_key"], n_train, batch,
                                             self._settings(), len(layers) - 1)
            self.correct = 0
            for idx, dropped, settings in sched.batches():
                if not dropped:
                    # the device does not trust the schedule: an LFSR cannot start at 0
                    settings = replace(settings, lfsr_seed=settings.lfsr_seed or 1)
                    self.model.counters["data_reads"] += len(idx) * sample_words
                    self.correct += self.model.train_batch(x[idx], self.data_labels[idx],
                                                           settings)
            self._store_weights(wbase)
        if evaluate:
            self.test_correct, step = 0, self.build.max_batch
            for i in range(n_train, len(x), step):
                batch_x = x[i:min(i + step, len(x))]
                self.model.counters["data_reads"] += len(batch_x) * sample_words
                predictions = self.model.infer(batch_x)
                self.predictions[:len(batch_x)] = predictions
                self.test_correct += int((predictions == self.data_labels[i:i + len(batch_x)])
                                         .sum())

    def _settings(self):
        r = self.regs
        n = r["layers"]
        flags = {name: bool(r["flags"] >> i & 1) for i, name in enumerate(spec.FLAG_BITS)}
        return StepSettings(update_mask=tuple(bool(r["update_mask"] >> i & 1) for i in range(n)),
                            lr_shift=r["lr_shift"], psg_tau=r["psg_tau"],
                            psg_step_shift=r["psg_step_shift"], keep_q8=r["keep_q8"],
                            lfsr_seed=r["lfsr_seed"], **flags)

    # ---- link frames (LinkBridge semantics, docs/protocol.md)
    def handle_frame(self, payload, bad_escape=False):
        """One request payload (unframed, CRC included) -> the response payload; `bad_escape`:
        the frame held a bad escape (protocol.ReceivedFrame)."""
        return protocol.execute_request(payload, self, self.link_state, bad_escape)


def _s16(v):
    v &= 0xFFFF
    return v - 0x10000 if v & 0x8000 else v


class VirtualPort:
    """A pyserial-like port whose other end is a VirtualEngine: bytes written are framed,
    executed and answered at once; the answer waits to be read. Frames are delimited, checked
    and answered as LinkBridge does (protocol.FrameReceiver, protocol.execute_request): every
    non-empty frame gets exactly one response, an overlong or badly escaped one included.
    Link bytes are counted the way LinkBridge counts them (every wire byte, at the moment it
    crosses).

    Bytes are taken as the simulated board's byte port takes them: all of them, in order, each
    frame's after the previous frame's answer. (A board's UART drops the bytes that arrive
    while the bridge checks, executes or answers a frame; the host never sends any then.)"""

    def __init__(self, engine):
        self.engine = engine
        self._receiver = protocol.FrameReceiver()
        self._out = bytearray()
        self.timeout = 0
        # the rate the engine's build says its board top runs at (a Link sizes its timeout
        # from it); nothing here is timed by it
        self.baudrate = engine.build.baud

    def write(self, data):
        data = bytes(data)
        start = 0
        # bytes up to and including each END are counted before that frame executes
        while start < len(data):
            end = data.find(bytes([protocol.END]), start)
            stop = len(data) if end < 0 else end + 1
            chunk = data[start:stop]
            self.engine.link_rx += len(chunk)
            for frame in self._receiver.feed(chunk):
                response = protocol.slip_encode(
                    self.engine.handle_frame(frame.payload, frame.bad_escape))
                self.engine.link_tx += len(response)
                self._out += response
            start = stop
        return len(data)

    @property
    def in_waiting(self):
        return len(self._out)

    def read(self, n=1):
        out = bytes(self._out[:n])
        del self._out[:n]
        return out

    def reset_input_buffer(self):
        self._out.clear()

    def close(self):
        pass
