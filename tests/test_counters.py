"""The block-RAM counter file (hw/ember_hw/counters.py) against a Python model of exact counters,
in the Amaranth simulator: random increments up to each counter's bound every cycle, reads at
random times (also while counting), clears, and pre-counters pushed to their bound."""

import numpy as np
import pytest
from amaranth.sim import Simulator

from ember_hw.counters import CounterFile

BOUNDS = {"one": 1, "lanes": 8, "batch": 64, "bulk": 1 << 20, "rare": 3}


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


async def step(ctx, dut, model, amounts, width=48):
    for name, amount in amounts.items():
        ctx.set(getattr(dut.inc, name), amount)
        model[name] = (model[name] + amount) % (1 << width)
    await ctx.tick()


async def read(ctx, dut, index, amounts=None, model=None):
    """Read counter `index`; optionally keep counting `amounts` each cycle while waiting (those
    made after the request may or may not be included). Returns (value, cycles)."""
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


async def idle(ctx, dut, bounds):
    for name in bounds:
        ctx.set(getattr(dut.inc, name), 0)


def test_random_increments_and_reads():
    rng = np.random.default_rng(1)
    names = list(BOUNDS)
    worst = []

    async def script(ctx, dut, model):
        for round_ in range(40):
            for _ in range(rng.integers(1, 80)):
                amounts = {n: int(rng.integers(0, b + 1)) if rng.random() < 0.7 else 0
                           for n, b in BOUNDS.items()}
                await step(ctx, dut, model, amounts)
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
    assert max(worst) <= len(BOUNDS) + 4


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


def test_wraps_at_width():
    async def script(ctx, dut, model):
        for _ in range(20):
            await step(ctx, dut, model, {"batch": 64}, width=8)
        await idle(ctx, dut, BOUNDS)
        assert (await read(ctx, dut, 2))[0] == (20 * 64) % 256

    run(BOUNDS, script, width=8)


def test_needs_two_counters():
    with pytest.raises(ValueError):
        CounterFile({"one": 1})
