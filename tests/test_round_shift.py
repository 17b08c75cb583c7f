"""The engine's rounding shifter and clamps (ember_hw.engine.round_shift) equals golden.round_shift for
every shift up to 63, also shifts wider than the value (accumulators are sized from the build,
while the SGD update shift goes up to spec.UPDATE_SHIFT_MAX), on edge and random values."""

import numpy as np
import pytest
from amaranth.hdl import Module, Signal, signed, unsigned
from amaranth.sim import Simulator

from ember import golden
from ember_hw.engine import clamp_byte, clamp_signed, round_shift


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
    out_b = Signal(unsigned(8))
    m = Module()
    m.d.comb += [out_s.eq(clamp_signed(value, bits)), out_b.eq(clamp_byte(value))]
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
            if (ctx.get(out_s), ctx.get(out_b)) != (want_s, want_b):
                failures.append((v, ctx.get(out_s), want_s, ctx.get(out_b), want_b))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert not failures, failures[:5]
