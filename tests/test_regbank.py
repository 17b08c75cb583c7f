"""The register bank (ember_hw.regbank.RegisterBank) alone in the Amaranth simulator, against its
twin, the model backend's VirtualEngine: every register, descriptor field and counter-window
address answers the same words and errors; widths and ranges come from spec's table (a write
out of range is refused, on both); and the bank's side towards the sequencer (CONTROL
strobes and the command's late answer, busy answers, descriptor loads, the input batch's limit
strobe) keeps its timing."""

import dataclasses

import numpy as np
import pytest

from ember import regmap, spec
from ember.virtual import VirtualEngine
from ember_hw.regbank import RegisterBank
from engine_harness import model_access, run_testbench

SMALL = spec.Build(name="small", lanes=4, weight_words=256, act_bytes=512, grad_words=64,
                   scratch_entries=128, max_batch=8, max_layers=3, max_width=32)
LEAN = dataclasses.replace(SMALL, name="lean", features=("zero_skip", "slu"))
#: engine v2 at SMALL's sizes: its command check asks the shell's program checker
SMALL_V2 = dataclasses.replace(SMALL, name="small-v2", dataflow="samples")
#: engine v2 with every unit and a small resident data memory: 160 input bytes, 20 samples
RESIDENT = dataclasses.replace(SMALL_V2, name="resident", features=spec.FEATURES,
                               data_bytes=160, data_samples=20)
_STATUS_NAME = {v: k for k, v in spec.LINK_STATUS.items()}


class BankDriver:
    """One access at a time on the bank's side of the bus decode, as EngineCore drives it."""

    def __init__(self, ctx, dut, timeout=50):
        self.ctx, self.dut, self.timeout = ctx, dut, timeout

    async def access(self, addr, data=None):
        """The answer: ("ok", word) or (status name, None); and the cycles it took."""
        ctx, dut = self.ctx, self.dut
        ctx.set(dut.sel, 1)
        ctx.set(dut.addr, addr & ((1 << spec.REGION_BITS) - 1))
        ctx.set(dut.write, data is not None)
        ctx.set(dut.w_data, (data or 0) & 0xFFFFFFFF)
        for cycles in range(self.timeout):
            if ctx.get(dut.ack) or ctx.get(dut.err):
                answer = ("ok", ctx.get(dut.data)) if ctx.get(dut.ack) else \
                    (_STATUS_NAME[ctx.get(dut.data) & 0xFF], None)
                await ctx.tick()
                ctx.set(dut.sel, 0)
                ctx.set(dut.write, 0)
                await ctx.tick()            # the engine's registered answer: one idle cycle
                return answer, cycles
            await ctx.tick()
        raise TimeoutError(f"no answer at {addr:#x}")


async def configure(drv, build, layers, batch, label_words=None):
    """Write a network's descriptors and settings as the host does, and mark the batch's label
    words written (the engine's label port)."""
    for addr, value in regmap.descriptor_writes(layers, build, batch):
        answer = (await drv.access(addr, value))[0]
        assert answer[0] == "ok", (hex(addr), value, answer)
    await mark_labels(drv, range((batch + 1) // 2 if label_words is None else label_words))


async def mark_labels(drv, words):
    ctx, dut = drv.ctx, drv.dut
    for w in words:
        ctx.set(dut.label_written, 1)
        ctx.set(dut.label_word, w)
        await ctx.tick()
    ctx.set(dut.label_written, 0)


def register_addresses(build):
    rw = [regmap.reg(n) for n, (_, mode) in spec.REGISTERS.items() if mode == "rw"]
    fields = [regmap.layer_field(layer, f) for layer in range(build.max_layers)
              for f in spec.LAYER_FIELDS]
    return rw, fields


@pytest.mark.parametrize("build", [SMALL, LEAN, RESIDENT], ids=lambda b: b.name)
def test_bank_answers_like_the_model(build):
    """Random 32-bit writes to every setting and descriptor field (the value 0x80000001 of
    issue 15 among them), then reads of every register, field, the gaps between them and the
    counter window's ends: the bank and the model answer the same (on the resident build,
    the splits' counts too, which the writes of widths and LAYERS unload)."""
    dut = RegisterBank(build)
    model = VirtualEngine(build)
    rng = np.random.default_rng(5)
    rw, fields = register_addresses(build)
    writes = [(a, int(v)) for a in rw + fields
              for v in [0x80000001, 0xFFFFFFFF, *rng.integers(0, 1 << 32, 2)]]
    # then, in a shuffled order, values in each range or one past it: most are taken (on the
    # resident build the splits' counts are loaded, and the widths and LAYERS move the input
    # width and the class count, which unloads them)
    ranges = [build.settings()[n] for n, (_, mode) in spec.REGISTERS.items() if mode == "rw"] \
        + [build.descriptor_fields()[f] for _ in range(build.max_layers) for f in spec.LAYER_FIELDS]
    legal = [(a, int(rng.integers(s.lo, min(s.hi + 2, 1 << 32))))
             for _ in range(6) for a, s in zip(rw + fields, ranges)]
    writes += [legal[i] for i in rng.permutation(len(legal))]
    # the registers a write elsewhere may change, read after every write
    watched = [regmap.reg(n) for n in ("train_samples", "test_samples")]
    reads = sorted({regmap.reg(n) for n in spec.REGISTERS} | set(fields)
                   | set(range(0, spec.LAYER_BASE + build.max_layers * spec.LAYER_STRIDE + 2))
                   | {spec.ADDRESS_MAP["counters"][0] + 2 * len(spec.COUNTERS),
                      spec.ADDRESS_MAP["counters"][0] + 0xFFF, 0x2000, 0xFFFFF})
    mismatches = []
    # writes elsewhere that found a split loaded: (it was unloaded, it was kept)
    splits = {True: 0, False: 0}

    def loaded():
        return (model.read(watched[0]), model.read(watched[1])) != (0, 0)

    async def bench(ctx):
        drv = BankDriver(ctx, dut)
        for addr, value in writes:
            was_loaded = loaded() and addr not in watched
            got, _ = await drv.access(addr, value)
            want = model_access(model, addr, value)
            if was_loaded:
                splits[not loaded()] += 1
            if got[0] != want[0]:
                mismatches.append(("write", hex(addr), hex(value), got, want))
            # read back after each write: the value the register kept
            for read in (addr, *watched):
                got, _ = await drv.access(read)
                want = model_access(model, read)
                if got != want:
                    mismatches.append(("read back", hex(addr), hex(value), hex(read), got,
                                       want))
        for addr in reads:
            got, _ = await drv.access(addr)
            want = model_access(model, addr)
            if got != want:
                mismatches.append(("read", hex(addr), got, want))
        # writes to read-only registers and the counter window
        for addr in [regmap.reg("id"), regmap.reg("status"), regmap.counter("cycles")]:
            got, _ = await drv.access(addr, 1)
            if got[0] != model_access(model, addr, 1)[0]:
                mismatches.append(("ro write", hex(addr), got))

    run_testbench(dut, bench)
    assert not mismatches, mismatches[:6]
    assert len(writes) > 50 and len(reads) > 60
    if "resident" in build.features:
        assert splits[True] >= 5 and splits[False] >= 20, splits


def test_widths_follow_the_build():
    """Each setting's register is as wide as its largest legal value needs (spec's table)."""
    dut = RegisterBank(SMALL)

    async def one_cycle(ctx):               # elaborated: the ports below are a real bank's
        await ctx.tick()

    run_testbench(dut, one_cycle)
    table = SMALL.settings()
    assert len(dut.settings.batch) == (SMALL.max_batch).bit_length() == table["batch"].bits
    assert len(dut.settings.update_mask) == SMALL.max_layers
    assert len(dut.settings.keep_q8) == spec.KEEP_ONE.bit_length()
    assert table["lr_shift"].hi == spec.UPDATE_SHIFT_MAX
    fields = SMALL.descriptor_fields()
    assert fields["weight_base"].bits == (SMALL.weight_words - 1).bit_length()
    assert fields["shift"].hi == spec.FORWARD_SHIFT_MAX


def test_out_of_range_writes_are_refused_not_truncated():
    """Issue 15, item 3: a write outside a setting's or field's lo..hi is answered bad_value
    and the register keeps its value, on the bank and the model alike (v1 kept the low bits:
    batch 0x80000001 read back 1 on the board and 0x80000001 in the model); the range's
    ends are taken."""
    dut = RegisterBank(SMALL)
    model = VirtualEngine(SMALL)
    table, fields = SMALL.settings(), SMALL.descriptor_fields()
    # the settings of the units SMALL has (the others have no register:
    # test_left_out_units_have_constant_settings)
    cases = [(regmap.reg(n), s) for n, s in table.items()
             if s.feature is None or s.feature in SMALL.features] + \
        [(regmap.layer_field(1, f), s) for f, s in fields.items()]
    # (not the resident unit's train/test_samples, epoch_key, schedule_half and
    # infer_program)
    assert len(cases) == len(table) - 5 + len(fields)
    log = []

    async def bench(ctx):
        drv = BankDriver(ctx, dut)
        for addr, s in cases:
            good = [s.lo, s.hi]
            bad = [v for v in (s.lo - 1, s.hi + 1, s.hi + 1 + (1 << 31), 0x80000001)
                   if 0 <= v < (1 << 32) and not s.contains(v)]
            for value in good + bad:
                before = (await drv.access(addr))[0]
                got = (await drv.access(addr, value))[0][0]
                after = (await drv.access(addr))[0]
                want = model_access(model, addr, value)[0]
                log.append((s.name, value, got, want, before, after,
                            model_access(model, addr)))

    run_testbench(dut, bench)
    for name, value, got, want, before, after, model_after in log:
        legal = SMALL.settings().get(name, SMALL.descriptor_fields().get(name)).contains(value)
        assert got == want == ("ok" if legal else "bad_value"), (name, value, got, want)
        assert after == model_after, (name, value, after, model_after)
        assert after == (("ok", value) if legal else before), (name, value, before, after)
    assert any(name == "batch" and value == 0x80000001 for name, value, *_ in log)


def test_left_out_units_have_constant_settings():
    """A build without PSG, ssProp or resident data has no registers for their settings: they
    read as their reset value whatever is written, and the ports are that constant."""
    dut = RegisterBank(LEAN)
    seen = {}

    async def bench(ctx):
        drv = BankDriver(ctx, dut)
        for name in ("psg_tau", "psg_step_shift", "keep_q8", "lfsr_seed", "lr_shift",
                     "train_samples", "epoch_key"):
            answer, _ = await drv.access(regmap.reg(name), 7)
            assert answer[0] == "ok"
            seen[name] = ((await drv.access(regmap.reg(name)))[0][1],
                          ctx.get(getattr(dut.settings, name)))

    run_testbench(dut, bench)
    assert seen == {"psg_tau": (0, 0), "psg_step_shift": (0, 0),
                    "keep_q8": (spec.KEEP_ONE, spec.KEEP_ONE), "lfsr_seed": (1, 1),
                    "lr_shift": (7, 7), "train_samples": (0, 0), "epoch_key": (0, 0)}


def test_control_busy_and_descriptor_loads():
    """CONTROL registers its strobes for one cycle and acknowledges a train command with
    `defer` (its answer owed until the command ends), starts none while one is owed, and always
    takes an abort; settings and descriptors answer `busy` while a command runs; a
    descriptor read waits while the sequencer loads one, whose word arrives the cycle after
    its address; batch and layer 0's inputs raise limit_changed."""
    dut = RegisterBank(SMALL)
    log = {}

    async def bench(ctx):
        drv = BankDriver(ctx, dut)
        # limit strobe and inputs0
        ctx.set(dut.sel, 1)
        ctx.set(dut.write, 1)
        ctx.set(dut.addr, regmap.layer_field(0, "inputs"))
        ctx.set(dut.w_data, 23)
        log["limit_inputs"] = ctx.get(dut.limit_changed)
        await ctx.tick()
        ctx.set(dut.sel, 0)
        await ctx.tick()
        log["inputs0"] = ctx.get(dut.inputs0)
        ctx.set(dut.sel, 1)
        ctx.set(dut.addr, regmap.layer_field(1, "inputs"))
        log["limit_other"] = ctx.get(dut.limit_changed)
        ctx.set(dut.sel, 0)
        await drv.access(regmap.layer_field(2, "act_base"), 0x1FF)
        # the sequencer reads a descriptor word: data the next cycle
        ctx.set(dut.desc_loading, 1)
        ctx.set(dut.desc_addr, 2 * spec.LAYER_STRIDE + spec.LAYER_FIELDS.index("act_base"))
        await ctx.tick()
        log["desc_data"] = ctx.get(dut.desc_data)
        # a bus read of a descriptor while loads run waits for them
        ctx.set(dut.sel, 1)
        ctx.set(dut.write, 0)
        ctx.set(dut.addr, regmap.layer_field(0, "inputs"))
        waited = 0
        for _ in range(5):
            await ctx.tick()
            waited += not (ctx.get(dut.ack) or ctx.get(dut.err))
        ctx.set(dut.desc_loading, 0)
        answer, cycles = await drv.access(regmap.layer_field(0, "inputs"))
        log["desc_read"] = (waited, answer, cycles)
        # a train command on a network that passes the command check: the check's cycles,
        # then the strobes, then the answer after busy drops
        await configure(drv, SMALL, [20, 9, 5], 3)
        ctx.set(dut.sel, 1)
        ctx.set(dut.write, 1)
        ctx.set(dut.addr, regmap.reg("control"))
        ctx.set(dut.w_data, spec.CONTROL_TRAIN | spec.CONTROL_CLEAR_COUNTERS)
        strobes, answered, started = [], None, None
        for cycle in range(400):
            assert not ctx.get(dut.err)
            acked = ctx.get(dut.ack) and answered is None
            if acked:
                answered, log["defer"] = cycle, ctx.get(dut.defer)
            await ctx.tick()
            if acked:
                ctx.set(dut.sel, 0)         # the master drops its strobe after the answer
            strobes.append((ctx.get(dut.start_train), ctx.get(dut.start_infer),
                            ctx.get(dut.clear_counters)))
            if ctx.get(dut.start_train):
                started = cycle
            if started is not None and cycle == started + 3:
                break
        log["strobes"] = strobes[started:started + 3]
        log["before"] = set(strobes[:started])
        log["answered"] = answered - started
        log["rejected"] = (await drv.access(regmap.reg("rejected")))[0]
        # the command's answer is owed: no other command starts, a counter clear does
        ctx.set(dut.owing, 1)
        log["owing"] = [(await drv.access(regmap.reg("control"), v))[0][0]
                        for v in (spec.CONTROL_TRAIN, spec.CONTROL_CLEAR_COUNTERS)]
        ctx.set(dut.owing, 0)
        # busy answers
        ctx.set(dut.busy, 1)
        log["busy"] = [(await drv.access(a, 1))[0][0] for a in
                       (regmap.reg("batch"), regmap.layer_field(0, "shift"),
                        regmap.reg("control"))]
        log["status"] = (await drv.access(regmap.reg("status")))[0]
        # an abort is answered at once, busy or not; it strobes `abort` only while busy
        aborts = []
        for busy in (1, 0):
            ctx.set(dut.busy, busy)
            ctx.set(dut.sel, 1)
            ctx.set(dut.write, 1)
            ctx.set(dut.addr, regmap.reg("control"))
            ctx.set(dut.w_data, spec.CONTROL_ABORT | spec.CONTROL_TRAIN)
            answer = (ctx.get(dut.ack), ctx.get(dut.err), ctx.get(dut.defer))
            await ctx.tick()
            ctx.set(dut.sel, 0)
            aborts.append((answer, ctx.get(dut.abort), ctx.get(dut.start_train)))
            await ctx.tick()
            assert not ctx.get(dut.abort)
        ctx.set(dut.busy, 0)
        log["aborts"] = aborts

    run_testbench(dut, bench)
    assert log["limit_inputs"] == 1 and log["limit_other"] == 0
    assert log["inputs0"] == 23
    assert log["desc_data"] == 0x1FF
    waited, answer, cycles = log["desc_read"]
    assert waited == 5 and answer == ("ok", 23) and cycles == 1
    assert log["strobes"] == [(1, 0, 1), (0, 0, 0), (0, 0, 0)]
    assert log["before"] == {(0, 0, 0)}  # nothing happens while the command is checked
    # acknowledged in the cycle before the strobes, deferred: answered when the command ends
    assert log["answered"] == 0 and log["defer"] == 1
    assert log["rejected"] == ("ok", 0)
    assert log["owing"] == ["busy", "ok"]
    assert log["busy"] == ["busy", "busy", "busy"]
    assert log["status"] == ("ok", 1)
    assert log["aborts"] == [((1, 0, 0), 1, 0), ((1, 0, 0), 0, 0)]


def test_counter_window_reads_through_the_counter_port():
    """A counter read holds counter_req and the index until counter_valid, then answers the
    low or the high word."""
    dut = RegisterBank(SMALL)
    value = (0x1234 << 32) | 0x89ABCDEF
    log = {}

    async def read(ctx, addr):
        # the counter file answers two cycles after the request, for one cycle
        ctx.set(dut.sel, 1)
        ctx.set(dut.write, 0)
        ctx.set(dut.addr, addr)
        requests = []
        for _ in range(3):
            requests.append((ctx.get(dut.counter_req), ctx.get(dut.counter_index),
                             ctx.get(dut.ack)))
            await ctx.tick()
        ctx.set(dut.counter_valid, 1)
        ctx.set(dut.counter_data, value)
        answer = (ctx.get(dut.ack), ctx.get(dut.data))
        await ctx.tick()
        ctx.set(dut.counter_valid, 0)
        ctx.set(dut.sel, 0)
        await ctx.tick()
        return requests, answer

    async def bench(ctx):
        log["lo"] = await read(ctx, regmap.counter("cycles"))
        log["hi"] = await read(ctx, regmap.counter("cycles") + 1)

    run_testbench(dut, bench)
    i = spec.COUNTERS.index("cycles")
    assert log["lo"] == ([(1, i, 0)] * 3, (1, value & 0xFFFFFFFF))
    assert log["hi"] == ([(1, i, 0)] * 3, (1, value >> 32))


def test_a_build_without_the_abort_unit_answers_a_command_when_it_ends():
    """The iCEBreaker's bank (no abort unit, for lack of logic): a train command's write is held
    until the command has finished, never deferred; an abort while idle is acknowledged and
    does nothing."""
    build = spec.BUILDS["icebreaker"]
    assert "abort" not in build.features and "watchdog" not in build.features
    dut = RegisterBank(build)
    log = {}

    async def bench(ctx):
        drv = BankDriver(ctx, dut)
        await configure(drv, build, [64, 32, 10], 4)
        ctx.set(dut.sel, 1)
        ctx.set(dut.write, 1)
        ctx.set(dut.addr, regmap.reg("control"))
        ctx.set(dut.w_data, spec.CONTROL_TRAIN)
        started = None
        for cycle in range(100):
            if ctx.get(dut.ack):
                log["answered"], log["defer"] = cycle - started, ctx.get(dut.defer)
                break
            await ctx.tick()
            if ctx.get(dut.start_train):
                started = cycle
                ctx.set(dut.busy, 1)
            if started is not None and cycle == started + 5:
                ctx.set(dut.busy, 0)
        await ctx.tick()
        ctx.set(dut.sel, 0)
        await ctx.tick()
        log["abort"] = (await drv.access(regmap.reg("control"), spec.CONTROL_ABORT))[0]
        log["abort_strobe"] = ctx.get(dut.abort)

    run_testbench(dut, bench)
    assert log["answered"] == 6 and log["defer"] == 0     # the first cycle with busy low
    assert log["abort"] == ("ok", 0) and log["abort_strobe"] == 0


# --- resident data (docs/protocol.md section 11): EPOCH and EVALUATE, the splits' unload ---------

TRAIN, INFER, CLEAR = spec.CONTROL_TRAIN, spec.CONTROL_INFER, spec.CONTROL_CLEAR_COUNTERS
EPOCH, EVALUATE = spec.CONTROL_EPOCH, spec.CONTROL_EVALUATE
#: the bank's one-cycle strobes a CONTROL write can register, as run_command reports them
STROBES = ("start_train", "start_infer", "start_epoch", "start_evaluate", "clear_counters")
#: a verdict's name: "passed" or the failed check (REJECTED's value indexes this)
VERDICTS = ("passed", *spec.COMMAND_CHECKS)


async def run_command(drv, value, program_ok=True, program_wait=0):
    """One CONTROL write of `value`. The bench plays the shell's program checker: asked by
    program_check (one cycle), it answers `program_ok` with program_done `program_wait`
    cycles later. Returns {"answer": status name, "defer", "cycles": from the write to its
    answer, "asked": cycles of program_check, "entries": the program_entries values seen in
    them, "strobes": STROBES in the cycle after the answer (0 for a port the build has
    not)}."""
    ctx, dut = drv.ctx, drv.dut
    ctx.set(dut.sel, 1)
    ctx.set(dut.write, 1)
    ctx.set(dut.addr, regmap.reg("control"))
    ctx.set(dut.w_data, value)
    entries, asked, asked_at = set(), 0, None
    for cycles in range(drv.timeout):
        if dut.checks_program:
            if ctx.get(dut.program_check):
                entries.add(ctx.get(dut.program_entries))
                asked += 1
                asked_at = cycles if asked_at is None else asked_at
            done = asked_at is not None and cycles == asked_at + program_wait
            ctx.set(dut.program_done, done)
            ctx.set(dut.program_ok, done and program_ok)
        if ctx.get(dut.ack) or ctx.get(dut.err):
            break
        await ctx.tick()
    else:
        raise TimeoutError(f"no answer to CONTROL {value:#x}")
    result = {"answer": "ok" if ctx.get(dut.ack) else _STATUS_NAME[ctx.get(dut.data) & 0xFF],
              "defer": ctx.get(dut.defer), "cycles": cycles, "asked": asked,
              "entries": entries}
    await ctx.tick()
    ctx.set(dut.sel, 0)
    ctx.set(dut.write, 0)
    if dut.checks_program:
        ctx.set(dut.program_done, 0)
        ctx.set(dut.program_ok, 0)
    result["strobes"] = tuple(ctx.get(getattr(dut, s)) if hasattr(dut, s) else 0
                              for s in STROBES)
    await ctx.tick()
    return result


def twin_verdict(twin, value):
    """The twin's verdict on CONTROL word `value` without the program check (the model
    backend's own program check of EPOCH and EVALUATE is another unit's): the checks
    VirtualEngine._control makes (spec.check_command for TRAIN or INFER, else on a resident
    build spec.check_resident), as a VERDICTS name; None for a word that starts no command."""
    epoch, evaluate = bool(value & EPOCH), bool(value & EVALUATE)
    if value & (TRAIN | INFER):
        failed = spec.check_command(twin.build, twin.regs, twin.layer, bool(value & TRAIN),
                                    twin.labels_written)
    elif (epoch or evaluate) and twin.resident:
        failed = spec.check_resident(twin.build, twin.regs, twin.layer, epoch, evaluate)
    else:
        return None
    return failed or "passed"


def started(value):
    """The strobes (STROBES order) a CONTROL word that passes its checks registers."""
    runs = bool(value & (TRAIN | INFER))
    return (int(bool(value & TRAIN)), int(bool(value & INFER)),
            int(bool(value & EPOCH) and not runs), int(bool(value & EVALUATE) and not runs),
            int(bool(value & CLEAR)))


def entries_of(value):
    """program_entries for a CONTROL word: bit 0 the program at word 0 (TRAIN, or EPOCH
    without TRAIN and INFER), bit 1 the one at INFER_PROGRAM (INFER, or EVALUATE so)."""
    *starts, _ = started(value)
    train, infer, epoch, evaluate = starts
    return (train | epoch) | (infer | evaluate) << 1


async def both(drv, twin, addr, value):
    """A write to the bank and to its twin; they must answer the same."""
    got = (await drv.access(addr, value))[0][0]
    want = model_access(twin, addr, value)[0]
    assert got == want, (hex(addr), value, got, want)
    return got


async def labels_both(drv, twin, words):
    """Label words written: the bank's label port, the twin's labels region."""
    for w in words:
        assert model_access(twin, spec.ADDRESS_MAP["labels"][0] + w, 0)[0] == "ok"
    await mark_labels(drv, words)


def test_epoch_and_evaluate_are_checked_like_the_model():
    """EPOCH and EVALUATE are commands: the infer command's checks (no labels needed), then
    "data", then the program checker; the first failure is REJECTED and answered bad_value
    with no strobe; a passing command registers its strobes (a counter clear with it) and
    is deferred. Every verdict but the program's equals the twin's (spec.check_resident as
    VirtualEngine runs it; refused words also through VirtualEngine.write), including both
    limits of the data memory taken exactly and passed by one."""
    dut = RegisterBank(RESIDENT)
    twin = VirtualEngine(RESIDENT)
    reg, field = regmap.reg, regmap.layer_field
    net = regmap.descriptor_writes([5, 6, 3], RESIDENT, 4)
    # (what, writes before, label words, CONTROL word, the program checker's verdict, the
    #  bank's verdict); RESIDENT holds 160 bytes and 20 samples, and a sample of K inputs
    #  takes K rounded up to a multiple of 4 bytes (spec.sample_data_bytes)
    steps = [
        ("no network", [], 0, EPOCH, True, "layers"),
        ("no batch", [(reg("layers"), 2)], 0, EPOCH | EVALUATE, True, "batch"),
        ("no training split", net, 0, EPOCH, True, "data"),
        ("no test split", [], 0, EVALUATE, True, "data"),
        ("neither split", [], 0, EPOCH | EVALUATE, True, "data"),
        ("train needs labels", [], 0, TRAIN, True, "labels"),
        ("epoch needs none", [(reg("train_samples"), 12)], 0, EPOCH, True, "passed"),
        ("still no test split", [], 0, EVALUATE, True, "data"),
        ("nor for both", [], 0, EPOCH | EVALUATE, True, "data"),
        # 20 samples x 5 inputs (8 bytes): both limits exactly
        ("evaluate", [(reg("test_samples"), 8)], 0, EVALUATE, True, "passed"),
        ("both, and a clear", [], 0, EPOCH | EVALUATE | CLEAR, True, "passed"),
        ("program refused", [], 0, EPOCH, False, "program"),
        # 21 samples, 168 bytes: data is checked before the program
        ("21 samples", [(reg("test_samples"), 9)], 0, EPOCH | CLEAR, False, "data"),
        # 4 inputs (unloads): 21 samples in 84 bytes, then 20 in 80
        ("past data_samples only", [(field(0, "inputs"), 4), (reg("train_samples"), 12),
                                    (reg("test_samples"), 9)], 0, EPOCH, True, "data"),
        ("20 samples of 4", [(reg("test_samples"), 8)], 0, EPOCH | EVALUATE, True, "passed"),
        # 9 inputs (unloads): 14 samples in 168 bytes, then 13 in 156
        ("past data_bytes only", [(field(0, "inputs"), 9), (reg("train_samples"), 10),
                                  (reg("test_samples"), 4)], 0, EVALUATE, True, "data"),
        ("156 bytes", [(reg("test_samples"), 3)], 0, EVALUATE, True, "passed"),
        # the network is checked before the data
        ("broken chain", [(field(1, "inputs"), 7)], 0, EPOCH, True, "chain"),
        ("chain again", [(field(1, "inputs"), 6)], 0, EPOCH, True, "passed"),
        ("one class (unloads)", [(field(1, "outputs"), 1)], 0, EVALUATE, True, "classes"),
        ("3 classes (unloads)", [(field(1, "outputs"), 3)], 0, EVALUATE, True, "data"),
        # with TRAIN or INFER, the EPOCH and EVALUATE bits are not a resident command
        ("train, epoch bit", [(reg("train_samples"), 10), (reg("test_samples"), 6)], 2,
         TRAIN | EPOCH, True, "passed"),
        ("infer, evaluate bit", [], 0, INFER | EVALUATE, True, "passed"),
        ("infer, no data", [(reg("train_samples"), 0), (reg("test_samples"), 0)], 0,
         INFER | EVALUATE, True, "passed"),
    ]
    log = []
    end = {}

    async def bench(ctx):
        drv = BankDriver(ctx, dut, timeout=500)
        for what, writes, label_words, value, program_ok, _ in steps:
            for addr, v in writes:
                assert await both(drv, twin, addr, v) == "ok", (what, hex(addr), v)
            await labels_both(drv, twin, range(label_words))
            want = twin_verdict(twin, value)
            twin_answer = model_access(twin, regmap.reg("control"), value)[0] \
                if want != "passed" else None
            got = await run_command(drv, value, program_ok)
            rejected = (await drv.access(regmap.reg("rejected")))[0]
            log.append((what, value, got, rejected, want, twin_answer,
                        ("ok", twin.rejected)))
        # busy rules as for train: none starts while a command runs or its answer is owed
        ctx.set(dut.owing, 1)
        end["owing"] = (await run_command(drv, EPOCH))["answer"]
        ctx.set(dut.owing, 0)
        ctx.set(dut.busy, 1)
        end["busy"] = (await run_command(drv, EVALUATE))["answer"]
        ctx.set(dut.busy, 0)

    run_testbench(dut, bench)
    for (what, value, got, rejected, want, twin_answer, twin_rejected), step in zip(log, steps):
        verdict = step[-1]
        assert rejected == ("ok", VERDICTS.index(verdict)), (what, rejected, verdict)
        # the twin has no program check here: a program refusal is a pass for it
        assert want == ("passed" if verdict == "program" else verdict), (what, want)
        if want != "passed":
            assert twin_answer == "bad_value" and twin_rejected == rejected, \
                (what, twin_answer, twin_rejected)
        if verdict == "passed":
            assert (got["answer"], got["defer"]) == ("ok", 1), (what, got)
            assert got["strobes"] == started(value), (what, got)
            assert got["entries"] == {entries_of(value)}, (what, got)
        else:
            assert (got["answer"], got["strobes"]) == ("bad_value", (0,) * 5), (what, got)
        # the program checker is asked once every other check has passed
        assert (got["asked"] > 0) == (verdict in ("passed", "program")), (what, got)
    assert {step[-1] for step in steps} == {"passed", "layers", "batch", "chain", "classes",
                                            "labels", "program", "data"}
    assert end == {"owing": "busy", "busy": "busy"}


@pytest.mark.parametrize("build", [RESIDENT, SMALL_V2], ids=lambda b: b.name)
def test_program_entries_name_the_programs_a_command_runs(build):
    """While the program checker is asked, program_entries says which programs the command
    runs: bit 0 the one at word 0 (TRAIN, EPOCH), bit 1 the one at INFER_PROGRAM (INFER,
    EVALUATE); on an engine v2 build without the resident unit too (TRAIN, INFER)."""
    dut = RegisterBank(build)
    twin = VirtualEngine(build)
    words = [TRAIN, INFER, TRAIN | INFER]
    if "resident" in build.features:
        words += [EPOCH, EVALUATE, EPOCH | EVALUATE, TRAIN | EPOCH, INFER | EPOCH]
    seen = {}

    async def bench(ctx):
        drv = BankDriver(ctx, dut, timeout=500)
        for addr, value in regmap.descriptor_writes([5, 6, 3], build, 4):
            await both(drv, twin, addr, value)
        await labels_both(drv, twin, range(2))
        if "resident" in build.features:
            await both(drv, twin, regmap.reg("train_samples"), 12)
            await both(drv, twin, regmap.reg("test_samples"), 8)
        for value in words:
            assert twin_verdict(twin, value) == "passed", value
            got = await run_command(drv, value, program_wait=3)
            seen[value] = (got["answer"], got["asked"], got["entries"])

    run_testbench(dut, bench)
    want = {TRAIN: 0b01, INFER: 0b10, TRAIN | INFER: 0b11, EPOCH: 0b01, EVALUATE: 0b10,
            EPOCH | EVALUATE: 0b11, TRAIN | EPOCH: 0b01, INFER | EPOCH: 0b10}
    # asked once, answered 3 cycles later
    assert seen == {value: ("ok", 1, {want[value]}) for value in words}


def test_a_change_of_shape_unloads_the_splits():
    """A write that changes layer 0's inputs or the class count (LAYERS, or the last layer's
    outputs) sets TRAIN_SAMPLES and TEST_SAMPLES to 0, as VirtualEngine._keep_data_if does;
    a write of the same value, of another field or of a value refused, unloads nothing. The
    class count port follows the twin's."""
    dut = RegisterBank(RESIDENT)
    twin = VirtualEngine(RESIDENT)
    reg, field = regmap.reg, regmap.layer_field
    # (what, address, value, unloads); the network is 5-6-3, layer 2 never written (1 output)
    cases = [
        ("layer 0's inputs, same", field(0, "inputs"), 5, False),
        ("layer 0's inputs", field(0, "inputs"), 4, True),
        ("layer 1's inputs", field(1, "inputs"), 7, False),
        ("layer 0's inputs refused", field(0, "inputs"), 0, False),
        ("the last layer's outputs, same", field(1, "outputs"), 3, False),
        ("the last layer's outputs", field(1, "outputs"), 4, True),
        ("a hidden layer's outputs", field(0, "outputs"), 9, False),
        ("the next layer's outputs", field(2, "outputs"), 9, False),
        ("layers, same", reg("layers"), 2, False),
        ("layers: 4 classes to 9", reg("layers"), 3, True),
        ("layers: 9 classes to 9", reg("layers"), 1, False),
        ("layers: 9 classes to 4", reg("layers"), 2, True),
        ("layers refused", reg("layers"), 0, False),
        ("batch", reg("batch"), 3, False),
        ("epoch_key", reg("epoch_key"), 0xDEADBEEF, False),
        ("infer_program", reg("infer_program"), 300, False),
    ]
    log = []

    async def bench(ctx):
        drv = BankDriver(ctx, dut)
        for addr, value in regmap.descriptor_writes([5, 6, 3], RESIDENT, 4):
            await both(drv, twin, addr, value)
        for what, addr, value, _ in cases:
            for name, count in (("train_samples", 12), ("test_samples", 8)):
                await both(drv, twin, reg(name), count)
            answer = await both(drv, twin, addr, value)
            splits = [(await drv.access(reg(n)))[0][1] for n in ("train_samples",
                                                                  "test_samples")]
            log.append((what, answer, splits,
                        [twin.read(reg(n)) for n in ("train_samples", "test_samples")],
                        ctx.get(dut.classes), twin.classes()))

    run_testbench(dut, bench)
    for (what, answer, splits, twin_splits, classes, twin_classes), case in zip(log, cases):
        assert splits == twin_splits == ([0, 0] if case[-1] else [12, 8]), \
            (what, splits, twin_splits)
        assert classes == twin_classes, (what, classes, twin_classes)
        assert answer == ("bad_value" if "refused" in what else "ok"), (what, answer)


def test_test_correct_reads_the_input_port():
    """TEST_CORRECT reads the test_correct port (the resident unit's count), as wide as
    data_samples needs; a build without the unit has no such port and reads 0."""
    dut = RegisterBank(RESIDENT)
    seen = []

    async def bench(ctx):
        drv = BankDriver(ctx, dut)
        for value in (17, RESIDENT.data_samples, 0, 5):
            ctx.set(dut.test_correct, value)
            seen.append((await drv.access(regmap.reg("test_correct")))[0])

    run_testbench(dut, bench)
    assert seen == [("ok", 17), ("ok", RESIDENT.data_samples), ("ok", 0), ("ok", 5)]
    assert len(dut.test_correct) == RESIDENT.data_samples.bit_length()


@pytest.mark.parametrize("build", [SMALL, SMALL_V2], ids=lambda b: b.name)
def test_a_build_without_the_unit_just_acknowledges_epoch_bits(build):
    """On a build without the resident unit EPOCH and EVALUATE are unknown bits: a CONTROL
    word with them and without TRAIN or INFER is acknowledged at once (no check, no defer, no
    strobe but a counter clear's), as by the twin; REJECTED keeps the last command's;
    TEST_CORRECT reads 0."""
    dut = RegisterBank(build)
    twin = VirtualEngine(build)
    seen = []

    async def bench(ctx):
        drv = BankDriver(ctx, dut)
        # a refused command first, so that REJECTED holds something to keep
        seen.append((await run_command(drv, INFER))["answer"])
        assert model_access(twin, regmap.reg("control"), INFER)[0] == "bad_value"
        for value in (EPOCH, EVALUATE, EPOCH | EVALUATE, EPOCH | CLEAR):
            got = await run_command(drv, value)
            rejected = (await drv.access(regmap.reg("rejected")))[0]
            seen.append((value, got["answer"], got["cycles"], got["defer"], got["asked"],
                         got["strobes"], rejected,
                         model_access(twin, regmap.reg("control"), value)[0]))
        seen.append((await drv.access(regmap.reg("test_correct")))[0])

    run_testbench(dut, bench)
    layers = ("ok", VERDICTS.index("layers"))
    # (the twin's REJECTED after a lone counter clear is 0: VirtualEngine._verdict(None))
    assert seen == ["bad_value"] + [
        (value, "ok", 0, 0, 0, (0, 0, 0, 0, int(value == EPOCH | CLEAR)), layers, "ok")
        for value in (EPOCH, EVALUATE, EPOCH | EVALUATE, EPOCH | CLEAR)] + [("ok", 0)]


def test_a_command_waits_for_the_splits_measure():
    """(TRAIN_SAMPLES + TEST_SAMPLES) x layer 0's inputs (padded to a data word) is measured
    after each write of them:
    a resident command right after such a write waits for the measure (a serial product of
    layer 0's input bits), so its verdict is the new values'. On a build without the
    command_check unit the data check is the only one that takes time."""
    build = dataclasses.replace(RESIDENT, name="resident-unchecked",
                                features=tuple(f for f in spec.FEATURES if f != "command_check"))
    dut = RegisterBank(build)
    twin = VirtualEngine(build)
    seen = []

    async def bench(ctx):
        drv = BankDriver(ctx, dut)
        for addr, value in regmap.descriptor_writes([9, 3], build, 4):
            await both(drv, twin, addr, value)
        # 14 samples x 9 inputs (12 bytes each) = 168 bytes: only the product is past the
        # memory; then 156
        for name, count in (("train_samples", 10), ("test_samples", 4), ("test_samples", 3)):
            await both(drv, twin, regmap.reg(name), count)
            got = await run_command(drv, EVALUATE)
            seen.append((name, count, got["answer"], got["cycles"],
                         twin_verdict(twin, EVALUATE)))
        # long after the last write: answered at once
        got = await run_command(drv, EVALUATE)
        seen.append(("again", 3, got["answer"], got["cycles"], twin_verdict(twin, EVALUATE)))

    run_testbench(dut, bench)
    # the write's answer, the driver's idle cycle, then the product's bits of layer 0's
    # inputs padded to a word (the multiplier starts the cycle after the write, done
    # bits + 2 cycles later)
    measure = len(dut.inputs0) + 1
    assert seen == [("train_samples", 10, "bad_value", measure, "data"),
                    ("test_samples", 4, "bad_value", measure, "data"),
                    ("test_samples", 3, "ok", measure, "passed"),
                    ("again", 3, "ok", 0, "passed")]


def test_without_the_abort_unit_an_epoch_is_answered_when_it_ends():
    """A resident build without the abort unit holds an EPOCH's write until the command has
    ended, as a train command's: not while its start strobe is out (the sequencer's busy
    rises the cycle after it), nor while busy; then answered, never deferred."""
    build = dataclasses.replace(RESIDENT, name="resident-held",
                                features=tuple(f for f in spec.FEATURES
                                               if f not in ("abort", "watchdog")))
    dut = RegisterBank(build)
    log = {}

    async def bench(ctx):
        drv = BankDriver(ctx, dut, timeout=500)
        await configure(drv, build, [5, 6, 3], 4, label_words=0)
        await drv.access(regmap.reg("train_samples"), 12)
        ctx.set(dut.sel, 1)
        ctx.set(dut.write, 1)
        ctx.set(dut.addr, regmap.reg("control"))
        ctx.set(dut.w_data, EPOCH)
        strobe = None
        for cycle in range(200):
            ctx.set(dut.program_done, ctx.get(dut.program_check))
            ctx.set(dut.program_ok, ctx.get(dut.program_check))
            if ctx.get(dut.ack) or ctx.get(dut.err):
                log["answer"] = (ctx.get(dut.ack), ctx.get(dut.defer), cycle - strobe)
                break
            await ctx.tick()
            if strobe is not None and cycle == strobe + 5:
                ctx.set(dut.busy, 0)
            elif strobe is not None:
                ctx.set(dut.busy, 1)    # a sequencer busy from the cycle after the strobe
            if ctx.get(dut.start_epoch):
                strobe = cycle
                log["strobes"] = (ctx.get(dut.start_train), ctx.get(dut.start_epoch),
                                  ctx.get(dut.start_evaluate))
        ctx.set(dut.sel, 0)
        await ctx.tick()

    run_testbench(dut, bench)
    assert log["strobes"] == (0, 1, 0)
    assert log["answer"] == (1, 0, 6)   # the first cycle with busy low again
