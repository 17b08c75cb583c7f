"""The block-RAM counter file (hw/ember_hw/counters.py) against a Python model of exact counters,
in the Amaranth simulator: random increments up to each counter's bound every cycle, reads at
random times (also while counting), clears, and pre-counters pushed to their bound."""

import itertools

import numpy as np
import pytest
from amaranth.hdl import Module, Signal
from amaranth.sim import Simulator

from ember_hw.counters import CounterFile, _ripple_add

# one counter per pre-counter flavour: 1- to 3-bit increments count in LUT logic ("one",
# "rare", "seven"), wider ones with an adder; "bulk" has a pre-counter wider than 16 bits
BOUNDS = {"one": 1, "lanes": 8, "batch": 64, "bulk": 1 << 20, "rare": 3, "seven": 7}
C = len(BOUNDS)


def run(bounds, script, width=48):
    """`script(ctx, dut, model)` drives the file; the model dict holds exact counts."""
    dut = CounterFile(bounds, width=width)

    async def bench(ctx):
        await script(ctx, dut, {name: 0 for name in bounds})

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return dut


def count(ctx, dut, model, amounts, width=48):
    """Present this cycle's increments (all counters not in `amounts` take 0)."""
    for name in model:
        amount = amounts.get(name, 0)
        ctx.set(getattr(dut.inc, name), amount)
        model[name] = (model[name] + amount) % (1 << width)


async def step(ctx, dut, model, amounts, width=48):
    count(ctx, dut, model, amounts, width)
    await ctx.tick()


async def read(ctx, dut, index):
    """Read counter `index` with no increments while waiting. Returns (value, cycles), cycles
    counting the request cycle."""
    ctx.set(dut.read_index, index)
    ctx.set(dut.read_req, 1)
    cycles = 0
    while True:
        valid, value = ctx.get(dut.read_valid), ctx.get(dut.read_data)
        await ctx.tick()
        cycles += 1
        if valid:
            break
        assert cycles < 64, "read not answered"
    ctx.set(dut.read_req, 0)
    return value, cycles


async def read_counting(ctx, dut, model, index, amounts, width=48):
    """Read counter `index` while counting `amounts()` every cycle, the request cycle
    included. Returns (value, history, cycles): history[k] is the counter's exact value
    after the first k cycles of the read, so a correct answer is one of history[0:cycles]
    (every increment made before the request, and no more than the cycles before the
    answer's)."""
    name = list(model)[index]
    ctx.set(dut.read_index, index)
    ctx.set(dut.read_req, 1)
    history = [model[name]]
    while True:
        count(ctx, dut, model, amounts(), width)
        valid, value = ctx.get(dut.read_valid), ctx.get(dut.read_data)
        await ctx.tick()
        history.append(model[name])
        if valid:
            break
        assert len(history) < 64, "read not answered"
    ctx.set(dut.read_req, 0)
    return value, history, len(history) - 1


async def idle(ctx, dut, bounds):
    for name in bounds:
        ctx.set(getattr(dut.inc, name), 0)


def random_amounts(rng, bounds, busy=0.7):
    return {n: int(rng.integers(0, b + 1)) if rng.random() < busy else 0
            for n, b in bounds.items()}


def test_ripple_add_is_addition():
    for wa, wb in ((1, 1), (3, 1), (5, 2), (4, 3), (3, 3)):
        a, b = Signal(wa), Signal(wb)
        m = Module()
        s = Signal(wa)
        m.d.comb += s.eq(_ripple_add(a, b))

        async def bench(ctx, a=a, b=b, s=s, wa=wa, wb=wb):
            for x, y in itertools.product(range(1 << wa), range(1 << wb)):
                ctx.set(a, x)
                ctx.set(b, y)
                assert ctx.get(s) == (x + y) % (1 << wa), (wa, wb, x, y)

        sim = Simulator(m)
        sim.add_testbench(bench)
        sim.run()


def test_random_increments_and_reads():
    rng = np.random.default_rng(1)
    names = list(BOUNDS)
    worst = []

    async def script(ctx, dut, model):
        for round_ in range(40):
            for _ in range(rng.integers(1, 80)):
                await step(ctx, dut, model, random_amounts(rng, BOUNDS))
            await idle(ctx, dut, BOUNDS)
            index = int(rng.integers(len(names)))
            value, cycles = await read(ctx, dut, index)
            worst.append(cycles)
            assert value == model[names[index]], (round_, names[index])
            if round_ % 13 == 12:
                ctx.set(dut.clear, 1)
                await ctx.tick()
                ctx.set(dut.clear, 0)
                for n in model:
                    model[n] = 0

    run(BOUNDS, script)
    assert max(worst) <= C + 2


def test_reads_while_counting():
    """Reads while every counter keeps counting (at random, or at its bound): the answer holds
    every increment made before the request and none made after the answer."""
    rng = np.random.default_rng(2)
    names = list(BOUNDS)
    seen = []

    async def script(ctx, dut, model):
        for round_ in range(60):
            for _ in range(rng.integers(0, 40)):
                await step(ctx, dut, model, random_amounts(rng, BOUNDS))
            index = int(rng.integers(len(names)))
            at_bound = round_ % 2 == 0
            value, history, cycles = await read_counting(
                ctx, dut, model, index,
                (lambda: BOUNDS) if at_bound else (lambda: random_amounts(rng, BOUNDS)))
            assert cycles <= C + 2
            assert value in history[:cycles], (round_, names[index], value, history)
            seen.append(history.index(value))
            # back to back: a second read of the same counter sees the first one's cycles
            value2, history2, _ = await read_counting(
                ctx, dut, model, index, lambda: random_amounts(rng, BOUNDS))
            assert value2 in history2[:-1] and value2 >= history[-1]

    run(BOUNDS, script)
    # the answers did not all come from the request cycle's value: some reads really
    # waited while the counter moved on
    assert max(seen) > 0


def test_read_latency():
    """A read is answered 2 to len(bounds) + 1 cycles after the request cycle, depending on
    where the flusher is; every phase of its round gives the answer in time."""
    latencies = []

    async def script(ctx, dut, model):
        for phase in range(2 * C):
            for _ in range(phase):
                await step(ctx, dut, model, BOUNDS)
            await idle(ctx, dut, BOUNDS)
            value, cycles = await read(ctx, dut, phase % C)
            assert value == model[list(BOUNDS)[phase % C]]
            latencies.append(cycles - 1)

    run(BOUNDS, script)
    assert min(latencies) == 2 and max(latencies) == C + 1


def test_every_counter_at_its_bound_every_cycle():
    """Worst case for the pre-counters: every counter takes its bound every cycle for longer
    than many flush rounds; nothing may be lost."""
    async def script(ctx, dut, model):
        for _ in range(200):
            await step(ctx, dut, model, BOUNDS)
        await idle(ctx, dut, BOUNDS)
        for i, name in enumerate(BOUNDS):
            value, _ = await read(ctx, dut, i)
            assert value == model[name] == 200 * BOUNDS[name]

    run(BOUNDS, script)


def test_carries_across_the_word():
    """The flush adds a pre-counter to the low bits of a word; its carries must reach the top
    bits (past the widest pre-counter, past 32 bits) and wrap at `width`."""
    bounds = {"one": 1, "bulk": 1 << 20}
    # 4200 x ~2**20 passes 2**32; 100 x ~2**20 wraps a 24-bit counter 6 times
    for width, cycles, beyond in ((48, 4200, 1 << 32), (24, 100, 6 << 24)):
        async def script(ctx, dut, model, width=width, cycles=cycles):
            added = 0
            for k in range(cycles):
                await step(ctx, dut, model, {"one": 1, "bulk": (1 << 20) - k % 3}, width)
                added += (1 << 20) - k % 3
                if k in (70, cycles // 2):
                    await idle(ctx, dut, bounds)
                    assert (await read(ctx, dut, 1))[0] == model["bulk"]
            await idle(ctx, dut, bounds)
            assert (await read(ctx, dut, 0))[0] == model["one"] == cycles
            assert (await read(ctx, dut, 1))[0] == model["bulk"] == added % (1 << width)
            assert added > beyond

        dut = run(bounds, script, width=width)
        assert max(dut.pre_bits.values()) < width


def test_clear_drops_its_cycle_and_counting_resumes():
    async def script(ctx, dut, model):
        for _ in range(10):
            await step(ctx, dut, model, {"one": 1, "bulk": 5})
        # the increments of the clear cycle are dropped, the next ones count
        ctx.set(dut.clear, 1)
        await step(ctx, dut, model, {"one": 1, "bulk": 5})
        ctx.set(dut.clear, 0)
        await step(ctx, dut, model, {"one": 1, "bulk": 7})
        await idle(ctx, dut, BOUNDS)
        assert (await read(ctx, dut, 0))[0] == 1
        assert (await read(ctx, dut, 3))[0] == 7
        assert (await read(ctx, dut, 1))[0] == 0

    run(BOUNDS, script)


def test_clear_at_every_point_of_the_flush_round():
    """A clear while everything counts, at each position of the flusher's round, then reads
    of every counter straight away (while the words are rewritten after the clear, and with
    counting going on) and once more when idle."""
    rng = np.random.default_rng(3)

    async def script(ctx, dut, model):
        for offset in range(C + 2):
            for _ in range(offset + 40):
                await step(ctx, dut, model, random_amounts(rng, BOUNDS, busy=0.9))
            ctx.set(dut.clear, 1)
            count(ctx, dut, model, BOUNDS)
            await ctx.tick()
            ctx.set(dut.clear, 0)
            for n in model:
                model[n] = 0
            for i in range(C):
                value, history, _ = await read_counting(
                    ctx, dut, model, i, lambda: random_amounts(rng, BOUNDS))
                assert value in history[:-1], (offset, i, value, history)
            await idle(ctx, dut, BOUNDS)
            for i, name in enumerate(BOUNDS):
                assert (await read(ctx, dut, i))[0] == model[name], (offset, name)

    run(BOUNDS, script)


def test_wraps_at_width():
    async def script(ctx, dut, model):
        for _ in range(20):
            await step(ctx, dut, model, {"batch": 64}, width=8)
        await idle(ctx, dut, BOUNDS)
        assert (await read(ctx, dut, 2))[0] == (20 * 64) % 256

    run(BOUNDS, script, width=8)


def test_every_counter_wraps_at_a_narrow_width():
    """Pre-counters wider than the counter itself (capped at `width`) still wrap exactly."""
    async def script(ctx, dut, model):
        for _ in range(300):
            await step(ctx, dut, model, BOUNDS, width=6)
        await idle(ctx, dut, BOUNDS)
        for i, name in enumerate(BOUNDS):
            assert (await read(ctx, dut, i))[0] == model[name] == (300 * BOUNDS[name]) % 64

    dut = run(BOUNDS, script, width=6)
    assert dut.pre_bits["bulk"] == 6


def test_needs_two_counters():
    with pytest.raises(ValueError):
        CounterFile({"one": 1})


def test_a_counter_of_bound_zero_reads_zero_whatever_its_increment():
    """A bound of 0 (an event of a unit the build does not have, spec.COUNTER_UNITS) has no
    pre-counter: its increment input is ignored and it reads 0, while its neighbours in the
    flush round count exactly, clears included."""
    bounds = {"one": 1, "never": 0, "lanes": 8, "absent": 0}
    rng = np.random.default_rng(7)
    names = list(bounds)
    live = {n: b for n, b in bounds.items() if b}

    async def script(ctx, dut, model):
        for round_ in range(12):
            for _ in range(rng.integers(1, 30)):
                amounts = random_amounts(rng, live)
                count(ctx, dut, model, amounts)
                for n in ("never", "absent"):
                    ctx.set(getattr(dut.inc, n), 1)     # driven, but never counted
                await ctx.tick()
            await idle(ctx, dut, bounds)
            for index, name in enumerate(names):
                value, _ = await read(ctx, dut, index)
                assert value == (model[name] if bounds[name] else 0), (round_, name)
            if round_ == 5:
                ctx.set(dut.clear, 1)
                await ctx.tick()
                ctx.set(dut.clear, 0)
                for n in model:
                    model[n] = 0

    dut = run(bounds, script)
    assert set(dut.pre_bits) == {"one", "lanes"}
