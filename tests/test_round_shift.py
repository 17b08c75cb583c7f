"""The engine's arithmetic (ember_hw.arith) against the golden model: the rounding shift equals
golden.round_shift for every shift up to 63, also shifts wider than the value (accumulators are
sized from the build, while the SGD update shift goes up to spec.UPDATE_SHIFT_MAX), on edge and
random values; the clamps equal golden.saturate; the registered RoundingShifter gives
round_shift two cycles after it takes a value, one value per cycle."""

import numpy as np
import pytest
from amaranth.hdl import Module, Signal, signed, unsigned
from amaranth.sim import Simulator

from ember import golden, spec
from ember_hw.arith import (RoundingShifter, clamp_byte, clamp_signed, clamp_symmetric,
                             round_shift)


@pytest.mark.parametrize("width", [9, 17, 32])
def test_round_shift_matches_golden(width):
    value = Signal(signed(width))
    shift = Signal(unsigned(6))
    out = Signal(signed(width + 2))
    m = Module()
    m.d.comb += out.eq(round_shift(value, shift, width))
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    rng = np.random.default_rng(width)
    values = [lo, lo + 1, -1, 0, 1, hi - 1, hi] + [int(v) for v in rng.integers(lo, hi + 1, 24)]
    values += [-(1 << s) for s in range(width - 1)] + [(1 << s) for s in range(width - 1)]
    values += [-(3 << s) // 2 for s in range(1, width - 2)]       # ties
    failures = []

    async def bench(ctx):
        for v in values:
            for s in range(64):
                ctx.set(value, v)
                ctx.set(shift, s)
                got = ctx.get(out)
                want = int(golden.round_shift(np.int64(v), s))
                if got != want:
                    failures.append((v, s, got, want))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert not failures, failures[:5]


@pytest.mark.parametrize("width,bits", [(12, 8), (20, 16), (16, 16), (7, 8)])
def test_clamps_match_golden(width, bits):
    """clamp_signed(v, bits) and clamp_byte(v) equal golden.saturate for every value of a
    `width`-bit signed input (narrower inputs pass through)."""
    value = Signal(signed(width))
    out_s = Signal(signed(bits))
    out_y = Signal(signed(bits))
    out_b = Signal(unsigned(8))
    m = Module()
    m.d.comb += [out_s.eq(clamp_signed(value, bits)), out_b.eq(clamp_byte(value)),
                 out_y.eq(clamp_symmetric(value, bits))]
    lo, hi = -(1 << (width - 1)), (1 << (width - 1))
    values = range(lo, hi) if width <= 12 else \
        sorted({lo, hi - 1, 0, -1, 255, 256, -32768, -32769, 32767, 32768} & set(range(lo, hi))
               | {int(v) for v in np.random.default_rng(width).integers(lo, hi, 3000)})
    failures = []

    async def bench(ctx):
        for v in values:
            ctx.set(value, v)
            want_s = int(golden.saturate(np.int64(v), bits))
            want_b = int(golden.saturate(np.int64(v), 8, signed=False))
            want_y = int(golden.saturate(np.int64(v), bits, signed="symmetric"))
            got = (ctx.get(out_s), ctx.get(out_b), ctx.get(out_y))
            if got != (want_s, want_b, want_y):
                failures.append((v, got, (want_s, want_b, want_y)))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert not failures, failures[:5]


@pytest.mark.parametrize("finish_registered", [False, True])
@pytest.mark.parametrize("width", [32, 49])
def test_rounding_shifter_component(width, finish_registered):
    """RoundingShifter at the engine's widths (dX entries, a build's accumulators), its
    rounding after stage 2's register or in it: a new value every cycle, every shift
    0..spec.SHIFT_MAX; `out` is golden.round_shift two cycles after the take, `twice` has
    the value's sign one cycle after it, and both hold while `en` is low."""
    dut = RoundingShifter(width, spec.SHIFT_MAX, finish_registered=finish_registered)
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    rng = np.random.default_rng(width)
    values = [lo, lo + 1, -3, -2, -1, 0, 1, 2, 3, hi - 1, hi]
    values += [int(v) for v in rng.integers(lo, hi + 1, 6)]
    values += [-(3 << s) // 2 for s in range(1, width - 2, 7)]       # ties
    jobs = [(v, s) for v in values for s in range(spec.SHIFT_MAX + 1)]
    failures = []

    def sign(v):
        return (v > 0) - (v < 0)

    async def bench(ctx):
        history = []
        for i, (v, s) in enumerate(jobs + [(0, 0), (0, 0)]):
            take = i < len(jobs)
            ctx.set(dut.en, take)
            ctx.set(dut.value, v)
            ctx.set(dut.shift, s)
            await ctx.tick()
            history.append((v, s) if take else None)
            if len(history) >= 2 and history[-2] is not None:
                v2, s2 = history[-2]
                want = int(golden.round_shift(np.int64(v2), s2)) if width < 63 else None
                got = ctx.get(dut.out)
                if got != want:
                    failures.append(("out", v2, s2, got, want))
            if take and sign(ctx.get(dut.twice)) != sign(v):
                failures.append(("twice", v, s, ctx.get(dut.twice)))
        # nothing taken for two cycles: the last result holds
        v, s = jobs[-1]
        await ctx.tick().repeat(3)
        if ctx.get(dut.out) != int(golden.round_shift(np.int64(v), s)):
            failures.append(("hold", v, s, ctx.get(dut.out)))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert not failures, failures[:5]
