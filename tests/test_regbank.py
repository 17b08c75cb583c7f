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


@pytest.mark.parametrize("build", [SMALL, LEAN], ids=lambda b: b.name)
def test_bank_answers_like_the_model(build):
    """Random 32-bit writes to every setting and descriptor field (the value 0x80000001 of
    issue 15 among them), then reads of every register, field, the gaps between them and the
    counter window's ends: the bank and the model answer the same."""
    dut = RegisterBank(build)
    model = VirtualEngine(build)
    rng = np.random.default_rng(5)
    rw, fields = register_addresses(build)
    writes = [(a, int(v)) for a in rw + fields
              for v in [0x80000001, 0xFFFFFFFF, *rng.integers(0, 1 << 32, 2)]]
    reads = sorted({regmap.reg(n) for n in spec.REGISTERS} | set(fields)
                   | set(range(0, spec.LAYER_BASE + build.max_layers * spec.LAYER_STRIDE + 2))
                   | {spec.ADDRESS_MAP["counters"][0] + 2 * len(spec.COUNTERS),
                      spec.ADDRESS_MAP["counters"][0] + 0xFFF, 0x2000, 0xFFFFF})
    mismatches = []

    async def bench(ctx):
        drv = BankDriver(ctx, dut)
        for addr, value in writes:
            got, _ = await drv.access(addr, value)
            want = model_access(model, addr, value)
            if got[0] != want[0]:
                mismatches.append(("write", hex(addr), hex(value), got, want))
            # read back after each write: the value the register kept
            got, _ = await drv.access(addr)
            want = model_access(model, addr)
            if got != want:
                mismatches.append(("read back", hex(addr), hex(value), got, want))
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
    # (not the resident unit's train/test_samples, epoch_key and infer_program)
    assert len(cases) == len(table) - 4 + len(fields)
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
