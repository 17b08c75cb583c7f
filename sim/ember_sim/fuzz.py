"""Link fuzzer: the model backend and the simulated board get the same damaged, malformed and
hostile byte streams and must answer them byte for byte alike, without hangs and without
changing any state a rejected frame must not change.

    python -m ember_sim.fuzz --frames N --json PATH [--seed S]
        [--simulator verilator|icarus|none] [--build sim|tiny] [--check-every K]

Each *unit* is one fuzz class's byte stream (one or a few request frames, see CLASSES),
followed by a clean probe frame (a READ of the ``id`` register): the probe's answer closes the
unit, so a board that loses a frame or stops answering is noticed at once. The stream goes to
the model backend's port (ember.virtual.VirtualPort) and to the simulated board's socket
(ember.device.open_sim, the byte-stream port), and the two answers are compared as bytes.
A probe answer that does not arrive within HANG_BOUND_S of *simulated* time (the sim
backend's SimulationClock; a simulator that stops advancing counts too) is a hang.

Every `check_every` units, and at the end, the state is read back from both (every register and
layer descriptor, every counter but the link byte and cycle counters, the weights, labels and
predictions) and compared with what it was before: any change is a corruption (units change
registers only to restore them within the unit). Then one clean training step runs on both
and on a clean model device that never saw a fuzz frame: different weights or correct
counts are a corruption too.

After every state check, an *abort unit* (issue 15): a CONTROL train and, behind it, a few
reads of STATUS or of counters (0 to ABORT_DELAY_READS, to land the abort at different points
of the step) and an abort, to each device on its own. Their answers may differ by design: the model has no
clock, so its step has ended before the abort arrives, while the board is mid-step. So each
device is checked against the rules instead: every frame answered, the abort `ok`, the step
`aborted` with its weights as they were, or `ok` with a clean device's update (an abort after
its first weight write lets it finish); then the weights are put back, the counters
cleared, and a clean step must give a clean device's weights on every device.

With ``--simulator none`` only the model runs: no answers are compared, but exceptions out of
the model's port, missing answers and corruptions are still found.

The JSON report holds ``frames`` (fuzz request frames sent, probes and state reads not
counted), ``frames_per_class``, ``units_per_class``, ``statuses_per_class`` (the model's
answers by status), ``hangs``, ``mismatches`` (count, per class and the first examples: class,
request, model and board answers in hex), ``corruptions`` (count and examples),
``exceptions`` (raised out of the model's port), ``aborts`` (abort units, and per device the
steps they stopped and the steps that ran to their end), ``seed``, ``build``, ``simulator``
and ``wall_s``. The exit code is 1 if any of hangs, mismatches, corruptions or exceptions is
non-zero.
"""

import argparse
import json
import random
import sys
import time

import numpy as np

from ember import golden, protocol, regmap, spec
from ember.protocol import END, ESC, ESC_END, ESC_ESC, seal, slip_encode
from ember.spec import ConfigError, StepSettings

#: Simulated seconds a unit's probe answer may take before the unit counts as a hang: a unit
#: is at most a few thousand bytes, some ten thousand cycles; no command runs in one.
HANG_BOUND_S = 0.01
#: Wall seconds the simulated board may go without advancing its time while the fuzzer
#: waits for an answer (SimulationClock.stall_s): it does so only when it has nothing to do.
STALL_S = 30.0
#: Examples kept in the report.
EXAMPLES = 10
#: Reads (of STATUS or of counters) between an abort unit's train command and its abort: at
#: most this many.
ABORT_DELAY_READS = 12
#: The network the fuzzed devices hold (fits every build), and its batch.
NETWORK = (10, 7, 6, 4)
BATCH = 4

READ, WRITE = spec.LINK_COMMANDS["read"], spec.LINK_COMMANDS["write"]
_HEADER = protocol.REQUEST_HEADER_BYTES


# --- The state a unit may read and write -------------------------------------------------------
class Registers:
    """Addresses and current values of what a unit's frames may touch harmlessly: every
    register and layer descriptor field (read), and the read-write ones among them, with
    their current values (written back unchanged, or changed and restored within a unit)."""

    def __init__(self, build, values):
        self.build = build
        self.values = dict(values)              # address -> current word (every readable reg)
        self.settings = [regmap.reg(name) for name, (_, mode) in spec.REGISTERS.items()
                         if mode == "rw"]
        self.fields = [regmap.layer_field(l, f) for l in range(build.max_layers)
                       for f in spec.LAYER_FIELDS]
        self.writable = self.settings + self.fields
        self.readable = sorted(self.values)
        self.read_only = [regmap.reg(name) for name, (_, mode) in spec.REGISTERS.items()
                          if mode == "ro"]

    @staticmethod
    def addresses(build):
        """Every register address a state read covers: REGISTERS but CONTROL (write only),
        and every field of every layer descriptor."""
        regs = [regmap.reg(name) for name, (_, mode) in spec.REGISTERS.items() if mode != "wo"]
        return regs + [regmap.layer_field(l, f) for l in range(build.max_layers)
                       for f in spec.LAYER_FIELDS]


def _request(cmd, seq, addr, count, words=()):
    """A sealed request payload with any field values (for malformed frames)."""
    body = bytes([cmd & 0xFF, seq & 0xFF]) + (addr & 0xFFFFFF).to_bytes(3, "little") + \
        (count & 0xFFFF).to_bytes(2, "little") + \
        b"".join((w & 0xFFFFFFFF).to_bytes(4, "little") for w in words)
    return seal(body)


def _run_of(rng, addresses, longest=4):
    """A run of consecutive addresses out of `addresses` (sorted), 1..`longest` long."""
    start = rng.randrange(len(addresses))
    run = [addresses[start]]
    while len(run) < longest and start + len(run) < len(addresses) and \
            addresses[start + len(run)] == run[-1] + 1 and rng.random() < 0.6:
        run.append(addresses[start + len(run)])
    return run


def harmless_payload(rng, regs, seq=None):
    """A good request that changes nothing if executed: a READ of registers, or a WRITE of
    read-write registers with the values they hold."""
    seq = rng.randrange(256) if seq is None else seq
    if rng.random() < 0.5:
        run = _run_of(rng, regs.readable)
        return _request(READ, seq, run[0], len(run))
    run = _run_of(rng, sorted(regs.writable))
    return _request(WRITE, seq, run[0], len(run), [regs.values[a] for a in run])


def _frame_count(stream):
    """Request frames in a byte stream as the wire delimits them: runs of bytes between ENDs
    other than a lone ESC (which delivers no byte)."""
    return sum(1 for part in bytes(stream).split(bytes([END])) if part and part != bytes([ESC]))


# --- The classes ---------------------------------------------------------------------------------
def _bit_flips(rng, regs):
    wire = bytearray(slip_encode(harmless_payload(rng, regs)))
    for _ in range(rng.choice([1, 1, 2, 3])):
        wire[rng.randrange(1, len(wire) - 1)] ^= 1 << rng.randrange(8)
    return bytes(wire)


def _truncations(rng, regs):
    wire = slip_encode(harmless_payload(rng, regs))
    cut = wire[:rng.randrange(2, len(wire) - 1)]
    # ended by an END, or by the next frame's leading END (the probe's)
    return cut + (bytes([END]) if rng.random() < 0.5 else b"")


def _bad_crcs(rng, regs):
    payload = bytearray(harmless_payload(rng, regs))
    payload[-1 - rng.randrange(2)] ^= rng.randrange(1, 256)
    return slip_encode(payload)


def _stray_end_esc(rng, regs):
    if rng.random() < 0.3:
        return bytes(rng.choice([END, ESC, END, ESC, ESC_END, ESC_ESC])
                     for _ in range(rng.randrange(1, 8)))
    wire = bytearray(slip_encode(harmless_payload(rng, regs)))
    for _ in range(rng.randrange(1, 4)):
        wire.insert(rng.randrange(1, len(wire)), rng.choice([END, ESC]))
    return bytes(wire)


def _escaped(payload, bad_at, bad_byte):
    """`payload` SLIP-framed, with its byte at `bad_at` (which must be `bad_byte`) sent as
    ESC `bad_byte`: a bad escape whose kept byte the CRC covers."""
    parts = [slip_encode(payload[:bad_at])[:-1], bytes([ESC, bad_byte]),
             slip_encode(payload[bad_at + 1:])[1:]]
    return b"".join(parts)


def _bad_escapes(rng, regs):
    codes = [b for b in range(256) if b not in (END, ESC_END, ESC_ESC)]
    bad_byte = rng.choice(codes + [ESC] * 8)
    body = bytearray(harmless_payload(rng, regs)[:-2])
    at = rng.randrange(len(body) + 1)
    if rng.random() < 0.5 and at < len(body):
        body[at] = bad_byte                     # replaces a byte: the length stays right
    else:
        body.insert(at, bad_byte)               # one byte more: the length is wrong, too
    crc = protocol.crc16(body)
    if rng.random() < 0.25:                     # and a wrong CRC besides
        crc ^= rng.randrange(1, 1 << 16)
    return _escaped(bytes(body) + crc.to_bytes(2, "little"), at, bad_byte)


def _oversize(rng, regs):
    kind = rng.randrange(4)
    extra = rng.randrange(1, 300)
    if kind == 0:                               # a full WRITE with words beyond its count
        words = [regs.values[regs.settings[0]]] * (spec.LINK_MAX_WORDS + extra // 4 + 1)
        return slip_encode(_request(WRITE, rng.randrange(256), regs.settings[0],
                                    spec.LINK_MAX_WORDS, words))
    if kind == 1:                               # a READ header then bytes, good CRC
        body = _request(READ, rng.randrange(256), regs.readable[0], 1)[:-2] + \
            bytes(rng.randrange(256) for _ in range(protocol.MAX_REQUEST_BYTES + extra))
        return slip_encode(seal(body))
    if kind == 2:                               # exactly one byte too long
        body = bytes(rng.randrange(256) for _ in range(protocol.MAX_REQUEST_BYTES - 1))
        return slip_encode(seal(bytes([WRITE]) + body[1:]))
    # line noise without END, longer than any request even if every other byte is an ESC,
    # ended by the probe's END
    return bytes(rng.choice([rng.randrange(256), ESC]) for _ in
                 range(2 * protocol.MAX_REQUEST_BYTES + extra)).replace(bytes([END]), b"\x00")


def _bad_counts(rng, regs):
    seq, addr = rng.randrange(256), rng.choice(regs.readable)
    count = rng.choice([0, spec.LINK_MAX_WORDS + 1, 0xFFFF, rng.randrange(257, 0x10000),
                        1, 2, 3])
    cmd = rng.choice([READ, WRITE])
    if count in (1, 2, 3):                      # a legal count with the wrong data
        n_words = rng.choice([count - 1, count + 1]) if cmd == WRITE else rng.randrange(1, 4)
    else:
        n_words = rng.choice([0, 1, 2]) if cmd == WRITE else rng.choice([0, 0, 1])
    words = [regs.values.get(addr + i, 0) for i in range(n_words)]
    return slip_encode(_request(cmd, seq, addr, count, words))


def _unknown_commands(rng, regs):
    cmd = rng.choice([c for c in range(256) if c not in spec.LINK_COMMANDS.values()])
    count = rng.choice([1, 2, 0, rng.randrange(0x10000)])
    words = [rng.getrandbits(32) for _ in range(rng.choice([0, count % 8]))]
    return slip_encode(_request(cmd, rng.randrange(256), rng.choice(regs.readable), count, words))


def _duplicates(rng, regs):
    seq = rng.randrange(256)
    first = harmless_payload(rng, regs, seq)
    while first[0] != WRITE:
        first = harmless_payload(rng, regs, seq)
    kind = rng.randrange(4)
    if kind == 0:                               # a plain retry
        return slip_encode(first) * 2
    if kind == 1:                               # the same seq with other values: not executed
        addr = int.from_bytes(first[2:5], "little")
        other = _request(WRITE, seq, addr, 1, [rng.getrandbits(32)])
        return slip_encode(first) + slip_encode(other)
    if kind == 2:                               # rejected frames in between keep the memory
        bad = bytearray(first)
        bad[-1] ^= 0x5A
        return slip_encode(first) + slip_encode(bad) + slip_encode(first[:6]) + \
            slip_encode(first)
    # an executed READ in between forgets it; a failing WRITE is run (and fails) again
    failing = _request(WRITE, seq, spec.ADDRESS_MAP["counters"][0], 1, [0])
    return slip_encode(first) + slip_encode(_request(READ, seq, regs.readable[0], 1)) + \
        slip_encode(first) + slip_encode(failing) * 2


def _out_of_range_targets(build):
    """(address, what) of words that refuse or ignore a write or a read, from the map."""
    regs_end = sum(spec.ADDRESS_MAP["regs"])
    mapped = set(Registers.addresses(build)) | {regmap.reg("control")}
    counters_base, _ = spec.ADDRESS_MAP["counters"]
    unmapped_regs = [a for a in range(0, spec.LAYER_BASE + spec.LAYER_STRIDE *
                                      (build.max_layers + 1)) if a not in mapped]
    return {
        "unmapped_reg": unmapped_regs + [regs_end - 1],
        "past_counters": [counters_base + 2 * len(spec.COUNTERS) + i for i in range(3)],
        # reads stay below the cycle counters, which only a board counts (the model's are 0)
        # (the link byte counters included: the model counts every wire byte as the bridge)
        "counters": [counters_base + i for i in range(0, 2 * spec.COUNTERS.index(
            spec.CYCLE_COUNTERS[0]) - 2, 5)] + [regmap.counter("link_rx_bytes")] * 4,
        "cycle_counters": [regmap.counter(name) for name in spec.CYCLE_COUNTERS],
        "past_weights": [regmap.region("weights") + build.weight_words * build.lanes // 2 + i
                         for i in range(2)],
        "acts": [regmap.region("acts"), regmap.region("acts") + build.act_bytes // 4 - 1],
        "past_acts": [regmap.region("acts") + (build.act_bytes + 3) // 4],
        "past_labels": [regmap.region("labels") + (build.max_batch + 1) // 2],
        "predictions": [regmap.region("predictions")],
        "past_predictions": [regmap.region("predictions") + (build.max_batch + 1) // 2],
        "no_region": [n << spec.REGION_BITS for n in range(5, 16)] + [(1 << 24) - 1],
    }


def _read_only_out_of_range(rng, regs):
    targets = _out_of_range_targets(regs.build)
    seq = rng.randrange(256)
    kind = rng.choice(["ro_write"] * 3 + ["control_other_bits"] + sorted(targets))
    if kind == "ro_write":                      # acknowledged and ignored
        addr = rng.choice(regs.read_only)
        return slip_encode(_request(WRITE, seq, addr, 1, [rng.getrandbits(32)]))
    if kind == "control_other_bits":            # CONTROL without a command or clear bit
        command_bits = spec.CONTROL_TRAIN | spec.CONTROL_INFER | spec.CONTROL_CLEAR_COUNTERS
        value = rng.getrandbits(32) & ~command_bits
        return slip_encode(_request(WRITE, seq, regmap.reg("control"), 1, [value]))
    addr = rng.choice(targets[kind])
    count = rng.choice([1, 1, 2, 3])
    # an in-range write of the activations would change them: only reads there (bad_value);
    # the read-only memories mostly get writes (out_of_range, bad_value)
    cmd = READ if kind == "acts" else WRITE if kind == "cycle_counters" else \
        WRITE if kind in ("counters", "predictions") and rng.random() < 0.7 else \
        rng.choice([READ, WRITE])
    words = [rng.getrandbits(32) for _ in range(count)] if cmd == WRITE else []
    return slip_encode(_request(cmd, seq, addr, count, words))


def _edge_value(rng, setting):
    """A value at or just past an edge of a Setting's range or its register, or anything."""
    bits = setting.bits
    return rng.choice([setting.lo, setting.hi, setting.lo - 1, setting.hi + 1, 1 << bits,
                       (1 << bits) | setting.lo, 0xFFFFFFFF, 0x80000001, 0,
                       rng.getrandbits(32), rng.getrandbits(bits + 1)]) & 0xFFFFFFFF


def _register_values(rng, regs):
    """A valid-CRC write of a random value to a read-write setting or descriptor field, a read
    of it, and a write of its value back (so the unit leaves the state as it found it)."""
    table = regs.build.settings()
    fields = regs.build.descriptor_fields()
    addr = rng.choice(regs.writable)
    if addr in regs.settings:
        name = next(n for n, (off, _) in spec.REGISTERS.items() if regmap.reg(n) == addr)
        setting = table[name]
    else:
        setting = fields[spec.LAYER_FIELDS[(addr - spec.LAYER_BASE) % spec.LAYER_STRIDE]]
    value = _edge_value(rng, setting)
    seq = rng.randrange(256)
    return (slip_encode(_request(WRITE, seq, addr, 1, [value]))
            + slip_encode(_request(READ, seq + 1, addr, 1))
            + slip_encode(_request(WRITE, seq + 2, addr, 1, [regs.values[addr]])))


def _hostile_commands(rng, regs):
    """A valid-CRC write of a random value to a setting or descriptor field, then (if the
    engine's command check will refuse it: spec.check_command on the registers as they will
    be) a CONTROL train or infer, a read of REJECTED, and the old value written back. A
    command that passed would train or infer: the unit leaves those out, so that it leaves the
    state as it found it. (Needs a build with the command_check unit.)"""
    table = regs.build.settings()
    fields = regs.build.descriptor_fields()
    names = {regmap.reg(n): n for n, (_, mode) in spec.REGISTERS.items() if mode == "rw"}
    for _ in range(20):
        addr = rng.choice(regs.writable)
        if addr in names:
            setting = table[names[addr]]
            if setting.feature is not None and setting.feature not in regs.build.features:
                continue                        # no register: the write is dropped
        else:
            setting = fields[spec.LAYER_FIELDS[(addr - spec.LAYER_BASE) % spec.LAYER_STRIDE]]
        value = _edge_value(rng, setting)
        after = dict(regs.values)
        if setting.contains(value):
            after[addr] = value
        settings = {n: after[a] for a, n in names.items()}
        layers = [{f: after[regmap.layer_field(l, f)] for f in spec.LAYER_FIELDS}
                  for l in range(regs.build.max_layers)]
        command = rng.choice([spec.CONTROL_TRAIN, spec.CONTROL_INFER])
        # labels_written all ones: a refusal for anything before "labels" in the order
        failed = spec.check_command(regs.build, settings, layers, True, (1 << 64) - 1)
        if failed is not None:
            break
    else:
        return _register_values(rng, regs)
    seq = rng.randrange(256)
    return (slip_encode(_request(WRITE, seq, addr, 1, [value]))
            + slip_encode(_request(WRITE, seq + 1, regmap.reg("control"), 1, [command]))
            + slip_encode(_request(READ, seq + 2, regmap.reg("rejected"), 1))
            + slip_encode(_request(WRITE, seq + 3, addr, 1, [regs.values[addr]])))


def _empty_and_short(rng, regs):
    parts = []
    for _ in range(rng.randrange(1, 4)):
        kind = rng.randrange(3)
        if kind == 0:
            parts.append(bytes([END]) * rng.randrange(1, 4))
        elif kind == 1:
            parts.append(bytes([END, ESC, END]))
        else:
            short = harmless_payload(rng, regs)[:rng.randrange(1, _HEADER + 2)]
            parts.append(slip_encode(short))
    return b"".join(parts)


def _trailing_bytes(rng, regs):
    tail = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 24)))
    return slip_encode(harmless_payload(rng, regs)) + tail


def _line_noise(rng, regs):
    return bytes(rng.choice([rng.randrange(256), END, ESC]) for _ in range(rng.randrange(1, 64)))


#: Fuzz class -> generator(rng, Registers) -> byte stream. Every class leaves the state as
#: it was when answered as docs/protocol.md says.
CLASSES = {
    "bit_flips": _bit_flips,
    "truncations": _truncations,
    "bad_crcs": _bad_crcs,
    "stray_end_esc": _stray_end_esc,
    "bad_escapes": _bad_escapes,
    "oversize_frames": _oversize,
    "bad_counts": _bad_counts,
    "unknown_commands": _unknown_commands,
    "duplicates": _duplicates,
    "read_only_out_of_range": _read_only_out_of_range,
    "register_values": _register_values,
    "hostile_commands": _hostile_commands,
    "empty_and_short_frames": _empty_and_short,
    "trailing_bytes": _trailing_bytes,
    "line_noise": _line_noise,
}


def probe(seq):
    """The frame that closes every unit, and the answer it must get: a READ of ``id``."""
    request = protocol.encode_request("read", seq, regmap.reg("id"), 1)
    answer = slip_encode(seal(bytes([spec.LINK_STATUS["ok"], seq])
                              + spec.ENGINE_ID.to_bytes(protocol.WORD_BYTES, "little")))
    return request, answer


# --- The devices ---------------------------------------------------------------------------------
class ModelTarget:
    """The model backend (ember.device.ModelDevice) with raw access to its port."""

    name = "model"

    def __init__(self, build):
        from ember.device import ModelDevice
        self.dev = ModelDevice(build)

    def exchange(self, data, closing):
        """Write `data`; return (answer bytes, hung): hung if the answer does not end with
        `closing` (the probe's answer). Exceptions out of the port propagate."""
        port = self.dev.link.port
        port.reset_input_buffer()
        port.write(data)
        answer = port.read(port.in_waiting)
        return answer, not answer.endswith(closing)

    def close(self):
        self.dev.close()


class BoardTarget:
    """The simulated board (ember.device.open_sim, byte-stream port) with raw access to its
    socket; answers are awaited on the simulation's clock."""

    def __init__(self, build, simulator):
        from ember.device import open_sim
        self.name = simulator
        self.dev = open_sim(build, simulator)
        self.dev.link.clock.stall_s = STALL_S

    def exchange(self, data, closing, frames=1, bound_s=HANG_BOUND_S):
        """Write `data`; read until the answer holds at least `frames` response frames and
        ends with `closing`, or until `bound_s` simulated seconds have passed. Returns
        (answer bytes, hung): hung if the answer does not end with `closing` by then.

        `frames` (the model's count) keeps an answer inside the unit that happens to equal
        the probe's from closing it early; an answer of fewer frames than the model's but
        with the probe's at its end waits for the bound, then counts as answered."""
        port, clock = self.dev.link.port, self.dev.link.clock
        clock.restart()
        port.write(data)
        deadline = clock() + bound_s
        answer = bytearray()
        # every response frame is END payload END, and no payload holds an END
        while not (answer.endswith(closing) and answer.count(END) >= 2 * frames):
            if clock() >= deadline:
                return bytes(answer), not answer.endswith(closing)
            answer += port.read(max(1, port.in_waiting))
        return bytes(answer), False

    def close(self):
        self.dev.close()


def _runs(addresses):
    """`addresses` as runs of consecutive ones (one READ frame each)."""
    runs = []
    for a in sorted(addresses):
        if runs and a == runs[-1][-1] + 1:
            runs[-1].append(a)
        else:
            runs.append([a])
    return runs


#: The counters a state read covers: all but the link byte counters (the state reads move
#: them) and the cycle counters. Those only a board counts (the model's stay 0), so reading
#: them would send the board's values, escaped where a byte is END or ESC, and make its
#: link_tx_bytes drift from the model's, which the fuzz frames read and compare.
STATE_COUNTERS = tuple(c for c in spec.EXACT_COUNTERS
                       if c not in ("link_rx_bytes", "link_tx_bytes"))
assert spec.COUNTERS[:len(spec.EXACT_COUNTERS)] == spec.EXACT_COUNTERS


def read_state(dev, build):
    """Everything a rejected frame must leave as it was, read through the device's Link:
    registers and descriptors, the STATE_COUNTERS, weights, labels and predictions."""
    link = dev.link
    regs = {}
    for run in _runs(Registers.addresses(build)):
        regs.update(zip(run, link.read_words(run[0], len(run))))
    # REJECTED names the check that refused the last command (hostile_commands changes it on
    # purpose; its value is compared in those units' answers)
    regs.pop(regmap.reg("rejected"))
    words = link.read_words(regmap.region("counters"), 2 * len(spec.EXACT_COUNTERS))
    counters = {name: words[2 * i] | words[2 * i + 1] << 32
                for i, name in enumerate(spec.EXACT_COUNTERS) if name in STATE_COUNTERS}
    halves = (build.max_batch + 1) // 2
    return {"regs": regs, "counters": counters,
            "weights": [w.tolist() for w in dev.read_weights()],
            "labels": link.read_words(regmap.region("labels"), halves),
            "predictions": link.read_words(regmap.region("predictions"), halves)}


def _state_differences(before, after):
    """Names of the parts of a state that differ ("regs[0x000018]", "counters.batches", ...)."""
    out = []
    for part in before:
        a, b = before[part], after[part]
        if isinstance(a, dict):
            out += [f"{part}[{k:#08x}]" if isinstance(k, int) else f"{part}.{k}"
                    for k in a if a[k] != b.get(k)]
        elif a != b:
            out.append(part)
    return out


# --- The run -------------------------------------------------------------------------------------
class Fuzzer:
    """One seeded fuzz run over the model and, unless `simulator` is None, the simulated
    board. `on_unit(cls, data, model_answer, board_answer)`, if given, sees every unit: the
    bytes sent (the probe included) and both answers (board_answer None without a board);
    tests check the answers against the rules."""

    def __init__(self, build, simulator="verilator", seed=0, check_every=25, on_unit=None):
        self.build, self.simulator, self.seed = build, simulator, seed
        self.check_every = check_every
        self.on_unit = on_unit
        self.rng = random.Random(seed)
        self.np_rng = np.random.default_rng(seed)
        self.report = {
            "frames": 0, "units": 0, "frames_per_class": dict.fromkeys(CLASSES, 0),
            "units_per_class": dict.fromkeys(CLASSES, 0),
            "statuses_per_class": {c: {} for c in CLASSES},
            "hangs": 0, "hangs_per_class": {},
            "mismatches": 0, "mismatches_per_class": {}, "mismatch_examples": [],
            "corruptions": 0, "corruption_examples": [],
            "exceptions": 0, "exception_examples": [],
            "state_checks": 0, "training_steps": 0,
            "aborts": {"units": 0, "aborted": {}, "completed": {}},
            "seed": seed, "build": build.name, "simulator": simulator or "none",
        }

    def run(self, frames):
        """Send at least `frames` fuzz request frames; returns the report (a dict)."""
        started = time.monotonic()
        self.model = ModelTarget(self.build)
        self.clean = ModelTarget(self.build)
        self.board = BoardTarget(self.build, self.simulator) if self.simulator else None
        try:
            self._setup()
            since_check = 0
            while self.report["frames"] < frames:
                self._unit()
                since_check += 1
                if since_check == self.check_every:
                    self._check()
                    since_check = 0
                    self._abort_unit()      # after the check: it re-bases the state
            self._check()
        finally:
            for target in (self.model, self.clean, self.board):
                if target is not None:
                    target.close()
        self.report["wall_s"] = round(time.monotonic() - started, 2)
        self.report["mismatches_per_class"] = dict(sorted(
            self.report["mismatches_per_class"].items()))
        return self.report

    @property
    def fuzzed(self):
        return [t for t in (self.model, self.board) if t is not None]

    def _setup(self):
        weights = golden.init_weights(list(NETWORK), self.seed)
        for target in self.fuzzed + [self.clean]:
            target.dev.configure(list(NETWORK))
            target.dev.load_weights(weights)
        self._train()
        self.state = [read_state(t.dev, self.build) for t in self.fuzzed]
        self.regs = Registers(self.build, self.state[0]["regs"])

    def _train(self):
        """One clean training step on every device; the fuzzed ones must end with the clean
        one's weights and correct count."""
        x = self.np_rng.integers(0, 256, size=(BATCH, NETWORK[0]))
        y = self.np_rng.integers(0, NETWORK[-1], size=BATCH)
        settings = StepSettings(lr_shift=int(self.np_rng.integers(6, 11)),
                                zero_skip=bool(self.np_rng.integers(2)))
        self.last_step = (x, y, settings)
        results = []
        for target in [self.clean] + self.fuzzed:
            try:
                correct = target.dev.train_batch(x, y, settings)
            except (ConfigError, protocol.LinkError) as error:
                if target is self.clean:
                    raise
                # a device whose configuration fuzz frames changed may refuse the step
                self._corruption(f"{target.name}: refused a clean training step after "
                                 f"fuzzing ({error})")
                continue
            results.append((target.name, correct, target.dev.read_weights()))
        self.report["training_steps"] += 1
        _, want_correct, want_weights = results[0]
        for name, correct, weights in results[1:]:
            same = correct == want_correct and all(
                np.array_equal(a, b) for a, b in zip(weights, want_weights))
            if not same:
                self._corruption(f"{name}: a clean training step after fuzzing gave other "
                                 f"weights or correct count ({correct}, clean {want_correct}) "
                                 f"than on a clean device")

    def _check(self):
        """Read the state back from every fuzzed device; then a clean training step."""
        self.report["state_checks"] += 1
        now = [read_state(t.dev, self.build) for t in self.fuzzed]
        for target, before, after in zip(self.fuzzed, self.state, now):
            changed = _state_differences(before, after)
            if changed:
                self._corruption(f"{target.name}: fuzz frames changed {', '.join(changed[:8])}")
        if len(now) == 2:
            differ = _state_differences(now[0], now[1])
            if differ:
                self._corruption(f"model and board states differ in {', '.join(differ[:8])}")
        self._train()
        self.state = [read_state(t.dev, self.build) for t in self.fuzzed]
        self.regs = Registers(self.build, self.state[0]["regs"])

    def _abort_unit(self):
        """A train command, 0 to ABORT_DELAY_READS reads, an abort and the probe, to
        each fuzzed device; the rules of the module docstring; then the weights put back, the
        counters cleared and a clean step (_train)."""
        report = self.report
        report["aborts"]["units"] += 1
        x, y, settings = self.last_step
        delay = self.rng.randrange(ABORT_DELAY_READS + 1)
        seq = self.rng.randrange(256)
        status_reg, control = regmap.reg("status"), regmap.reg("control")
        frames = [_request(WRITE, seq, control, 1, [spec.CONTROL_TRAIN])]
        # reads while the step runs: STATUS, or a run of counter words (long answers: they
        # move the abort further into the step)
        counters, n_words = regmap.region("counters"), 2 * len(spec.COUNTERS)
        for i in range(delay):
            addr, count = ((status_reg, 1) if self.rng.random() < 0.5 else
                           (counters, self.rng.randint(1, n_words)))
            frames.append(_request(READ, (seq + 1 + i) & 0xFF, addr, count))
        abort_seq = (seq + 1 + delay) & 0xFF
        frames.append(_request(WRITE, abort_seq, control, 1, [spec.CONTROL_ABORT]))
        probe_request, closing = probe(report["units"] & 0xFF)
        data = b"".join(slip_encode(f) for f in frames) + probe_request
        for target in self.fuzzed:
            before = target.dev.read_weights()
            if target is self.model:
                answer, hung = target.exchange(data, closing)
            else:
                answer, hung = target.exchange(data, closing, len(frames) + 1)
            if hung:
                report["hangs"] += 1
                report["hangs_per_class"]["aborts"] = \
                    report["hangs_per_class"].get("aborts", 0) + 1
                continue
            statuses = {}
            for name, payload in _answer_payloads(answer):
                statuses[payload[1] if len(payload) > 1 else None] = name
            step = statuses.get(seq)
            if len(statuses) != len(frames) or statuses.get(abort_seq) != "ok" or \
                    step not in ("ok", "aborted"):
                self._corruption(f"{target.name}: abort unit answered {statuses} (train seq "
                                 f"{seq}, abort seq {abort_seq})")
                continue
            outcome = "aborted" if step == "aborted" else "completed"
            per_device = report["aborts"][outcome]
            per_device[target.name] = per_device.get(target.name, 0) + 1
            want = before
            if step == "ok":
                model = golden.GoldenModel(self.build)
                model.configure(list(NETWORK))
                model.load_weights(before)
                model.train_batch(x, y, settings)
                want = model.weights
            if not all(np.array_equal(a, b) for a, b in zip(target.dev.read_weights(), want)):
                self._corruption(f"{target.name}: an abort unit's step answered {step} but "
                                 f"left other weights than " +
                                 ("before it" if step == "aborted" else "a clean step's"))
            target.dev.load_weights(before)
        for target in self.fuzzed:
            target.dev.clear_counters()
        self._train()
        self.state = [read_state(t.dev, self.build) for t in self.fuzzed]
        self.regs = Registers(self.build, self.state[0]["regs"])

    def _corruption(self, what):
        self.report["corruptions"] += 1
        if len(self.report["corruption_examples"]) < EXAMPLES:
            self.report["corruption_examples"].append(what)

    def _unit(self):
        report = self.report
        cls = self.rng.choice(sorted(CLASSES))
        stream = CLASSES[cls](self.rng, self.regs)
        probe_request, closing = probe(report["units"] & 0xFF)
        data = stream + probe_request
        n_frames = _frame_count(stream)
        report["units"] += 1
        report["frames"] += n_frames
        report["frames_per_class"][cls] += n_frames
        report["units_per_class"][cls] += 1
        try:
            model_answer, model_hung = self.model.exchange(data, closing)
        except Exception as error:      # the fuzzer's finding, not the transport's handling
            report["exceptions"] += 1
            if len(report["exception_examples"]) < EXAMPLES:
                report["exception_examples"].append(
                    {"class": cls, "request": data.hex(),
                     "exception": f"{type(error).__name__}: {error}"})
            self.model.dev.link.port.reset_input_buffer()
            model_answer, model_hung = b"", True
        board_answer, board_hung = (self.board.exchange(data, closing,
                                                        model_answer.count(END) // 2)
                                    if self.board else (None, False))
        for name, payload in _answer_payloads(model_answer):
            statuses = report["statuses_per_class"][cls]
            statuses[name] = statuses.get(name, 0) + 1
        if model_hung or board_hung:
            report["hangs"] += 1
            report["hangs_per_class"][cls] = report["hangs_per_class"].get(cls, 0) + 1
        if self.board and board_answer != model_answer:
            report["mismatches"] += 1
            per_class = report["mismatches_per_class"]
            per_class[cls] = per_class.get(cls, 0) + 1
            if len(report["mismatch_examples"]) < EXAMPLES:
                report["mismatch_examples"].append(
                    {"class": cls, "request": data.hex(), "model": model_answer.hex(),
                     "board": board_answer.hex()})
        if self.on_unit:
            self.on_unit(cls, data, model_answer, board_answer)


def _answer_payloads(answer):
    """(status name, payload) of every response frame in `answer` but the probe's (last)."""
    payloads = protocol.SlipDecoder(max_payload=1 << 16).feed(answer)[:-1]
    out = []
    for payload in payloads:
        try:
            out.append((protocol.decode_response(payload).status, payload))
        except protocol.FrameError:
            out.append(("malformed", payload))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ember_sim.fuzz", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=2000, help="fuzz frames to send (default 2000)")
    ap.add_argument("--json", required=True, help="where the report goes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--simulator", default="verilator", choices=("verilator", "icarus", "none"),
                    help="simulator of the board the model is compared with; none: model only")
    ap.add_argument("--build", default="tiny", choices=("sim", "tiny"))
    ap.add_argument("--check-every", type=int, default=25,
                    help="units between state checks and clean training steps (default 25)")
    args = ap.parse_args(argv)
    if args.frames < 1 or args.check_every < 1:
        ap.error(f"--frames {args.frames} and --check-every {args.check_every} must be >= 1")
    fuzzer = Fuzzer(spec.BUILDS[args.build], None if args.simulator == "none" else args.simulator,
                    args.seed, args.check_every)
    report = fuzzer.run(args.frames)
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)
    print(f"{report['frames']} frames in {report['units']} units ({report['simulator']}, "
          f"build {report['build']}, seed {report['seed']}): hangs {report['hangs']}, "
          f"mismatches {report['mismatches']}, corruptions {report['corruptions']}, "
          f"exceptions {report['exceptions']}; {report['wall_s']} s")
    bad = report["hangs"] or report["mismatches"] or report["corruptions"] or \
        report["exceptions"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
