"""The memory window (ember_hw.memwindow.MemoryWindow) alone in the Amaranth simulator, with the
engine's memories and u_word register around it, against its twin, the model backend's
VirtualEngine: random reads and writes of the weight, activation, label and prediction regions
and of unmapped regions answer the same words and error codes, write the same values to the
same places (and count the same activation bytes and label words), with the timing of the
window's docstring; while a command runs every access is answered `busy` and writes nothing,
and an activation write waits while the input batch's size is being recomputed."""

import dataclasses
import gc
import warnings

import numpy as np
import pytest
from amaranth import Module, Signal, unsigned
from amaranth.hdl import UnusedElaboratable
from amaranth.lib.memory import Memory

from ember import spec
from ember.virtual import VirtualEngine
from ember_hw.memwindow import MemoryWindow
from engine_harness import model_access, run_testbench

SMALL = spec.Build(name="small", lanes=4, weight_words=256, act_bytes=510, grad_words=64,
                   scratch_entries=128, max_batch=8, max_layers=3, max_width=32)
# (the two-lane build's program memory is half the default: the window's program region
# ends at the build's figure)
BUILDS = [SMALL, dataclasses.replace(SMALL, name="two-lane", lanes=2, program_words=512),
          dataclasses.replace(SMALL, name="eight-lane", lanes=8)]
_STATUS_NAME = {v: k for k, v in spec.LINK_STATUS.items()}
REGION = {name: base >> spec.REGION_BITS for name, (base, _) in spec.ADDRESS_MAP.items()}
W = spec.WEIGHT_BITS


class Harness:
    """The window with the memories and the u_word register EngineCore connects it to."""

    def __init__(self, build, predictions):
        P = build.lanes
        self.m = m = Module()
        m.submodules.win = self.win = win = MemoryWindow(build)
        m.submodules.wmem = self.wmem = Memory(shape=unsigned(P * W), depth=build.weight_words,
                                               init=[])
        m.submodules.amem = self.amem = Memory(shape=unsigned(spec.ACT_BITS),
                                               depth=build.act_bytes, init=[])
        m.submodules.lmem = self.lmem = Memory(shape=unsigned(spec.LABEL_BITS),
                                               depth=build.max_batch, init=[])
        m.submodules.pmem = self.pmem = Memory(shape=unsigned(spec.LABEL_BITS),
                                               depth=build.max_batch, init=predictions)
        w_rd, w_wr = self.wmem.read_port(), self.wmem.write_port(granularity=W)
        a_wr = self.amem.write_port()
        l_rd, l_wr = self.lmem.read_port(), self.lmem.write_port()
        p_rd = self.pmem.read_port()
        u_word = Signal(P * W)
        m.d.comb += [w_wr.addr.eq(win.w_wr_addr), w_wr.data.eq(win.w_wr_data),
                     w_wr.en.eq(win.w_wr_en), w_rd.addr.eq(win.w_rd_addr),
                     w_rd.en.eq(win.w_rd), win.u_word_low.eq(u_word[:spec.BUS_DATA_BITS]),
                     a_wr.addr.eq(win.act_wr_addr), a_wr.data.eq(win.act_wr_data),
                     a_wr.en.eq(win.act_wr_en),
                     l_wr.addr.eq(win.label_wr_addr), l_wr.data.eq(win.label_wr_data),
                     l_wr.en.eq(win.label_wr_en),
                     l_rd.addr.eq(win.label_rd_addr), p_rd.addr.eq(win.label_rd_addr),
                     win.label_rd_data.eq(l_rd.data), win.pred_rd_data.eq(p_rd.data)]
        with m.If(win.u_word_load):
            m.d.sync += u_word.eq(w_rd.data)
        with m.Elif(win.u_word_shift):
            m.d.sync += u_word.eq(u_word >> W)


class WindowDriver:
    """One access at a time on the window's side of the bus decode, as EngineCore drives it;
    it counts the activation byte writes and records the label words written meanwhile."""

    def __init__(self, ctx, win, timeout=40):
        self.ctx, self.win, self.timeout = ctx, win, timeout
        self.act_writes = 0
        self.label_words = 0                # bit w: label word w written

    async def access(self, addr, data=None):
        """The answer: ("ok", word or None) or (status name, None); and the cycles it took."""
        ctx, win = self.ctx, self.win
        ctx.set(win.sel, 1)
        ctx.set(win.addr, addr)
        ctx.set(win.write, data is not None)
        ctx.set(win.w_data, (data or 0) & 0xFFFFFFFF)
        for cycles in range(self.timeout):
            self.act_writes += ctx.get(win.act_wr_en)
            if ctx.get(win.label_written):
                self.label_words |= 1 << ctx.get(win.label_word)
            if ctx.get(win.ack) or ctx.get(win.err):
                if ctx.get(win.ack):
                    answer = ("ok", ctx.get(win.data) if data is None else None)
                else:
                    answer = (_STATUS_NAME[ctx.get(win.data) & 0xFF], None)
                await ctx.tick()
                ctx.set(win.sel, 0)
                ctx.set(win.write, 0)
                await ctx.tick()            # the engine's registered answer: one idle cycle
                return answer, cycles
            await ctx.tick()
        raise TimeoutError(f"no answer at {addr:#x}")


def configured_model(build, batch, inputs, classes):
    """The twin with the settings the window's inputs come from (limit and class count)."""
    model = VirtualEngine(build)
    model.regs.update(batch=batch, layers=2)
    model.layer[0]["inputs"] = inputs
    model.layer[1]["outputs"] = classes
    return model


def random_accesses(build, rng, classes, count):
    """(address, data or None) for every region the window answers, in range and past it."""
    P = build.lanes
    ends = {"weights": build.weight_words * P // 2, "acts": (build.act_bytes + 3) // 4,
            "labels": (build.max_batch + 1) // 2, "predictions": (build.max_batch + 1) // 2}
    accesses = []
    for _ in range(count):
        name = rng.choice(["weights", "weights", "acts", "acts", "labels", "labels",
                           "predictions", "unmapped"])
        write = bool(rng.integers(0, 2))
        if name == "unmapped":
            region = int(rng.integers(REGION["predictions"] + 1, 1 << (spec.BUS_ADDR_BITS -
                                                                       spec.REGION_BITS)))
            offset = int(rng.integers(0, 1 << spec.REGION_BITS))
        else:
            region = REGION[name]
            end = ends[name]
            offset = int(rng.integers(0, end)) if rng.random() < 0.85 else \
                int(rng.choice([end, end + 1, (1 << spec.REGION_BITS) - 1]))
        data = None
        if write:
            if name == "labels":
                # mostly valid labels; some with one label at or above the class count
                low, high = (int(v) for v in rng.integers(0, classes, 2))
                if rng.random() < 0.25:
                    bad = int(rng.choice([classes, classes + 1, 0xFFFF]))
                    low, high = (bad, high) if rng.random() < 0.5 else (low, bad)
                data = low | (high << 16)
            else:
                data = int(rng.integers(0, 1 << 32))
        accesses.append(((region << spec.REGION_BITS) | offset, data))
    return accesses


async def replay(ctx, win, model, accesses, cycles_of, mismatches, late):
    """Each access on the window and on the model: an answer that differs goes to
    `mismatches`, one that comes in another cycle than `cycles_of` says to `late`."""
    drv = WindowDriver(ctx, win)
    for addr, data in accesses:
        got, cycles = await drv.access(addr, data)
        want = model_access(model, addr, data)
        if got != want:
            mismatches.append((hex(addr), data, got, want))
        elif cycles != cycles_of(win.build, addr, data, want[0]):
            late.append((hex(addr), data, cycles))
    return drv


def expected_cycles(build, addr, data, status):
    """Cycles from the access's first cycle to its answer (MemoryWindow's timing)."""
    if status != "ok":
        return 0
    region, offset = addr >> spec.REGION_BITS, addr & ((1 << spec.REGION_BITS) - 1)
    if region == REGION["weights"]:
        return 0 if data is not None else 2 + (offset * 2) % build.lanes
    if region == REGION["acts"]:
        return 3
    return 1 if data is not None else 3


@pytest.mark.parametrize("build", BUILDS, ids=lambda b: b.name)
def test_window_answers_and_writes_like_the_model(build):
    """Random accesses: the same answers, the same memory contents afterwards, the same
    activation bytes counted and label words marked, each answer in its docstring's cycle."""
    rng = np.random.default_rng(build.lanes)
    batch, inputs, classes = 5, 37, 10
    model = configured_model(build, batch, inputs, classes)
    predictions = [int(v) for v in rng.integers(0, 1 << 16, build.max_batch)]
    model.predictions[:] = predictions
    h = Harness(build, predictions)
    accesses = random_accesses(build, rng, classes, 400)
    mismatches, late = [], []

    async def bench(ctx):
        win = h.win
        ctx.set(win.act_limit, batch * inputs)
        ctx.set(win.limit_ready, 1)
        ctx.set(win.classes, classes)
        drv = await replay(ctx, win, model, accesses, expected_cycles, mismatches, late)
        # every weight, activation and label afterwards, read out of the memories
        weights = [[(ctx.get(h.wmem.data[w]) >> (W * p)) & 0xFFFF for p in range(build.lanes)]
                   for w in range(build.weight_words)]
        assert weights == (model.weights & 0xFFFF).tolist()
        assert [ctx.get(h.amem.data[i]) for i in range(build.act_bytes)] == model.acts.tolist()
        assert [ctx.get(h.lmem.data[i]) for i in range(build.max_batch)] == model.labels.tolist()
        assert drv.label_words == model.labels_written
        limit = batch * inputs
        assert drv.act_writes == sum(
            sum(4 * (addr & 0xFFFFF) + i < limit for i in range(4)) for addr, data in accesses
            if data is not None and addr >> spec.REGION_BITS == REGION["acts"]
            and (addr & 0xFFFFF) < (build.act_bytes + 3) // 4)

    run_testbench(h.m, bench)
    assert not mismatches, mismatches[:6]
    assert not late, late[:6]
    statuses = {model_access(VirtualEngine(build), a, d)[0] for a, d in accesses}
    assert {"ok", "out_of_range", "bad_value"} <= statuses      # the accesses cover each


def test_busy_answers_busy_and_writes_nothing():
    """While a command runs, every access to a memory region (in range) is answered `busy` in
    its first cycle and no memory port is driven; past a region's end it is `out_of_range`."""
    build = SMALL
    rng = np.random.default_rng(7)
    h = Harness(build, [0] * build.max_batch)
    accesses = random_accesses(build, rng, 10, 200)
    wrong = []

    async def bench(ctx):
        win = h.win
        ctx.set(win.busy, 1)
        ctx.set(win.act_limit, 100)
        ctx.set(win.limit_ready, 1)
        ctx.set(win.classes, 10)
        for addr, data in accesses:
            want = model_access(VirtualEngine(build), addr, data)[0]
            want = "out_of_range" if want == "out_of_range" else "busy"
            ctx.set(win.sel, 1)
            ctx.set(win.addr, addr)
            ctx.set(win.write, data is not None)
            ctx.set(win.w_data, data or 0)
            driven = [ctx.get(port) for port in (win.w_wr_en, win.w_rd, win.u_word_load,
                                                 win.u_word_shift, win.act_wr_en,
                                                 win.label_wr_en, win.label_written)]
            got = _STATUS_NAME[ctx.get(win.data)] if ctx.get(win.err) else \
                ("ok" if ctx.get(win.ack) else None)
            if got != want or any(driven):
                wrong.append((hex(addr), data, got, want, driven))
            await ctx.tick()
            ctx.set(win.sel, 0)
            await ctx.tick()

    run_testbench(h.m, bench)
    assert not wrong, wrong[:6]


def test_activation_write_waits_for_the_limit():
    """An activation write while the input batch's size is being recomputed (limit_ready low)
    writes nothing and is not answered; once it is ready it writes the bytes below the new
    limit and is answered in its fourth cycle."""
    build = SMALL
    h = Harness(build, [0] * build.max_batch)

    async def bench(ctx):
        win = h.win
        ctx.set(win.act_limit, 6)
        ctx.set(win.limit_ready, 0)
        ctx.set(win.sel, 1)
        ctx.set(win.addr, spec.ADDRESS_MAP["acts"][0] + 1)      # bytes 4 to 7
        ctx.set(win.write, 1)
        ctx.set(win.w_data, 0x44332211)
        for _ in range(5):
            assert not (ctx.get(win.ack) | ctx.get(win.err) | ctx.get(win.act_wr_en))
            await ctx.tick()
        ctx.set(win.limit_ready, 1)
        written = []
        for cycle in range(4):
            if ctx.get(win.act_wr_en):
                written.append((ctx.get(win.act_wr_addr), ctx.get(win.act_wr_data)))
            assert ctx.get(win.ack) == (cycle == 3)
            await ctx.tick()
        assert written == [(4, 0x11), (5, 0x22)]
        assert [ctx.get(h.amem.data[i]) for i in range(4, 8)] == [0x11, 0x22, 0, 0]

    run_testbench(h.m, bench)


def test_ports_are_as_wide_as_the_engines_memories():
    """The window's request ports have the memories' address widths and the bus's data width
    (spec and the build, none typed in the window)."""
    with warnings.catch_warnings():     # the windows are never elaborated
        warnings.simplefilter("ignore", UnusedElaboratable)
        for build in BUILDS + [spec.BUILDS["icebreaker"], spec.DEFAULT_BUILD]:
            win = MemoryWindow(build)
            depths = {"w_wr_addr": build.weight_words, "w_rd_addr": build.weight_words,
                      "act_wr_addr": build.act_bytes, "label_wr_addr": build.max_batch,
                      "label_rd_addr": build.max_batch}
            for name, depth in depths.items():
                assert len(getattr(win, name)) == (depth - 1).bit_length(), (build.name, name)
            assert len(win.w_wr_en) == build.lanes
            assert len(win.w_wr_data) == build.lanes * W
            assert len(win.data) == spec.BUS_DATA_BITS
            assert len(win.act_limit) >= (build.max_batch * build.max_width).bit_length()
            del win
        gc.collect()


class SampleHarness:
    """Engine v2's window (SampleWindow) with memories laid out as SampleEngine's: one weight
    per word, the activation bytes, the program, labels and predictions."""

    def __init__(self, build, predictions):
        from ember_hw.memwindow import SampleWindow
        P = build.lanes
        self.m = m = Module()
        m.submodules.win = self.win = win = SampleWindow(build)
        mems = {"wmem": (W, build.weight_words * P), "amem": (spec.ACT_BITS, build.act_bytes // P * P),
                "prog": (32, build.program_words), "lmem": (spec.LABEL_BITS, build.max_batch)}
        for name, (bits, depth) in mems.items():
            m.submodules[name] = mem = Memory(shape=unsigned(bits), depth=depth, init=[])
            setattr(self, name, mem)
        m.submodules.pmem = self.pmem = Memory(shape=unsigned(spec.LABEL_BITS),
                                               depth=build.max_batch, init=predictions)
        w_rd, w_wr = self.wmem.read_port(), self.wmem.write_port()
        g_rd, g_wr = self.prog.read_port(), self.prog.write_port()
        a_wr = self.amem.write_port()
        l_rd, l_wr = self.lmem.read_port(), self.lmem.write_port()
        p_rd = self.pmem.read_port()
        m.d.comb += [w_wr.addr.eq(win.w_wr_addr), w_wr.data.eq(win.w_wr_data),
                     w_wr.en.eq(win.w_wr_en), w_rd.addr.eq(win.w_rd_addr),
                     win.w_rd_data.eq(w_rd.data),
                     g_wr.addr.eq(win.prog_wr_addr), g_wr.data.eq(win.prog_wr_data),
                     g_wr.en.eq(win.prog_wr_en), g_rd.addr.eq(win.prog_rd_addr),
                     win.prog_rd_data.eq(g_rd.data),
                     a_wr.addr.eq(win.act_wr_addr), a_wr.data.eq(win.act_wr_data),
                     a_wr.en.eq(win.act_wr_en),
                     l_wr.addr.eq(win.label_wr_addr), l_wr.data.eq(win.label_wr_data),
                     l_wr.en.eq(win.label_wr_en),
                     l_rd.addr.eq(win.label_rd_addr), p_rd.addr.eq(win.label_rd_addr),
                     win.label_rd_data.eq(l_rd.data), win.pred_rd_data.eq(p_rd.data)]


def sample_cycles(build, addr, data, status):
    """Cycles from the access's first cycle to its answer (SampleWindow's timing)."""
    if status != "ok":
        return 0
    region = addr >> spec.REGION_BITS
    if region == REGION["weights"]:
        return 1 if data is not None else 2
    if region == REGION["program"]:
        return 0 if data is not None else 1
    return expected_cycles(build, addr, data, status)


@pytest.mark.parametrize("build", BUILDS, ids=lambda b: b.name)
@pytest.mark.parametrize("batch", [5, 8])
def test_v2_window_answers_and_writes_like_the_model(build, batch):
    """Engine v2's window against the model's v2 layouts: random accesses of every region,
    the program's included, answer the same, leave the same weights, input bytes (only the
    samples of the batch: a full last block and a partial one), program words and labels,
    each answer in its docstring's cycle."""
    build = dataclasses.replace(build, dataflow="samples")
    P = build.lanes
    rng = np.random.default_rng(100 + build.lanes + batch)
    inputs, classes = 37, 10
    model = configured_model(build, batch, inputs, classes)
    predictions = [int(v) for v in rng.integers(0, 1 << 16, build.max_batch)]
    model.predictions[:] = predictions
    h = SampleHarness(build, predictions)
    accesses = random_accesses(build, rng, classes, 300)
    for _ in range(60):
        off = int(rng.integers(0, build.program_words)) if rng.random() < 0.85 else \
            int(rng.choice([build.program_words, (1 << spec.REGION_BITS) - 1]))
        data = int(rng.integers(0, 1 << 32)) if rng.random() < 0.6 else None
        accesses.insert(int(rng.integers(0, len(accesses))),
                        ((REGION["program"] << spec.REGION_BITS) | off, data))
    mismatches, late = [], []

    async def bench(ctx):
        win = h.win
        ctx.set(win.full_words, batch // P * inputs)
        ctx.set(win.block_words, build.sample_blocks(batch) * inputs)
        ctx.set(win.tail, batch % P)
        ctx.set(win.limit_ready, 1)
        ctx.set(win.classes, classes)
        drv = await replay(ctx, win, model, accesses, sample_cycles, mismatches, late)
        depth = build.act_bytes // P * P
        assert [ctx.get(h.wmem.data[i]) for i in range(build.weight_words * P)] == \
            (model.weights & 0xFFFF).tolist()
        assert [ctx.get(h.amem.data[i]) for i in range(depth)] == model.acts[:depth].tolist()
        assert [ctx.get(h.prog.data[i]) for i in range(build.program_words)] == \
            model.program.tolist()
        assert [ctx.get(h.lmem.data[i]) for i in range(build.max_batch)] == model.labels.tolist()
        assert drv.label_words == model.labels_written
        def kept(byte):                 # a byte of a sample in the batch
            word, lane = divmod(byte, P)
            return word < build.act_bytes // P and (word // inputs) * P + lane < batch
        assert drv.act_writes == sum(
            sum(kept(4 * (addr & 0xFFFFF) + i) for i in range(4)) for addr, data in accesses
            if data is not None and addr >> spec.REGION_BITS == REGION["acts"]
            and (addr & 0xFFFFF) < (build.act_bytes + 3) // 4)

    run_testbench(h.m, bench)
    assert not mismatches, mismatches[:6]
    assert not late, late[:6]
    statuses = {model_access(VirtualEngine(build), a, d)[0] for a, d in accesses}
    assert {"ok", "out_of_range", "bad_value"} <= statuses
