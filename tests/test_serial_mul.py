"""The serial multiplier (hw/ember_hw/serial_mul.py) against Python multiplication, in the
Amaranth simulator: random operands, the extremes, its done timing and a restart."""

import gc
import warnings

import numpy as np
import pytest
from amaranth.hdl import UnusedElaboratable
from amaranth.sim import Simulator

from ember_hw.serial_mul import SerialMultiplier


def simulate(dut, testbench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()


async def multiply(ctx, dut, a, b):
    """Start a * b; return (product, cycles from the start cycle to the first done cycle)."""
    ctx.set(dut.a, a)
    ctx.set(dut.b, b)
    ctx.set(dut.start, 1)
    await ctx.tick()
    ctx.set(dut.start, 0)
    # the operands are sampled in the start cycle: changing them now changes nothing
    ctx.set(dut.a, 0)
    ctx.set(dut.b, 0)
    cycles = 1
    while not ctx.get(dut.done):
        await ctx.tick()
        cycles += 1
    return ctx.get(dut.product), cycles


@pytest.mark.parametrize("width_a,width_b", [(1, 1), (6, 9), (15, 9), (20, 13), (4, 16)])
def test_random_operands_match_python(width_a, width_b):
    rng = np.random.default_rng(width_a * 100 + width_b)
    top_a, top_b = (1 << width_a) - 1, (1 << width_b) - 1
    pairs = [(0, 0), (top_a, top_b), (top_a, 0), (0, top_b), (1, top_b), (top_a, 1)]
    pairs += [(int(rng.integers(0, top_a + 1)), int(rng.integers(0, top_b + 1)))
              for _ in range(60)]
    dut = SerialMultiplier(width_a, width_b)

    async def tb(ctx):
        assert ctx.get(dut.done) and ctx.get(dut.product) == 0       # from reset
        for a, b in pairs:
            product, cycles = await multiply(ctx, dut, a, b)
            assert product == a * b, f"{a} * {b}: got {product}"
            assert cycles == width_b + 1
            # done and the product stay until the next start
            for _ in range(3):
                await ctx.tick()
                assert ctx.get(dut.done) and ctx.get(dut.product) == a * b

    simulate(dut, tb)


def test_done_is_low_while_running_and_restart_wins():
    dut = SerialMultiplier(10, 8)

    async def tb(ctx):
        ctx.set(dut.a, 1000)
        ctx.set(dut.b, 255)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        for _ in range(4):
            assert not ctx.get(dut.done)
            await ctx.tick()
        # a start in the middle of a product abandons it
        product, cycles = await multiply(ctx, dut, 777, 200)
        assert (product, cycles) == (777 * 200, 9)
        # back to back: a start in the done cycle
        product, cycles = await multiply(ctx, dut, 1023, 3)
        assert (product, cycles) == (1023 * 3, 9)

    simulate(dut, tb)


def test_widths_are_checked():
    with warnings.catch_warnings():
        # the half-built component is never elaborated; that is the point
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(ValueError, match="at least 1"):
            SerialMultiplier(0, 4)
        gc.collect()
