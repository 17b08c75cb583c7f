"""The dX requantizer (ember_hw.requant.DxRequantizer) alone in the Amaranth simulator, with the
engine's RoundingShifter, against the golden model's input-gradient step: the batch's scale
max(0, bit_length(max |dX|) - 15) and saturate_grad(round_shift(dx, shift)), for batches whose
largest magnitude needs every scale 0..DX_SHIFT_MAX, the most negative dX included; one entry
a cycle (engine v1, v2 at 8 lanes or fewer) and four (v2's dX drain at 32 lanes), where the
entries not tracked in a cycle hold values larger than the batch's, which must not count; the
shifters' results registered before the saturation or not (round_output: the wide and the
narrow pipeline, ember.dataflow.Pipeline), with dY that many cycles after them."""

import numpy as np
import pytest
from amaranth import Module
from amaranth.sim import Simulator

from ember import golden, spec
from ember_hw.arith import RoundingShifter
from ember_hw.requant import DxRequantizer

# a build whose lane accumulators are narrower than dX (the iCEBreaker's and the tiny
# build's): the shifter is as wide as dX
VALUE_BITS = spec.DX_BITS


def batches():
    rng = np.random.default_rng(3)
    out = []
    for scale in range(spec.DX_SHIFT_MAX + 1):
        top = 1 << (scale + spec.GRAD_BITS - 2)         # bit length scale + 15
        dx = rng.integers(-top, top, 12)
        dx[0] = top if scale < spec.DX_SHIFT_MAX else -top
        dx[1] = -top + 1
        out.append(dx)
    out.append(np.array([-(1 << 31), (1 << 31) - 1, 1, -1, 0]))       # saturated dX
    out.append(np.array([0, 0, 0]))
    out.append(np.array([3 << 14, -(3 << 14), (1 << 15) + 1, -(1 << 16) - 1]))   # ties
    return out


def test_the_output_register_is_one_or_none():
    with pytest.raises(ValueError, match="not 2 times"):
        DxRequantizer(1, round_output=2)


@pytest.mark.parametrize("round_output", [1, 0])
@pytest.mark.parametrize("entries", [1, 4])
def test_requantizer_matches_golden(entries, round_output):
    m = Module()
    m.submodules.rq = rq = DxRequantizer(entries, round_output=round_output)
    shifters = []
    for i in range(entries):            # a shifter per entry, as the engine's requant phase
        m.submodules[f"shifter{i}"] = shifter = RoundingShifter(VALUE_BITS, spec.SHIFT_MAX)
        m.d.comb += [shifter.shift.eq(rq.shift), rq.rounded[i].eq(shifter.out)]
        shifters.append(shifter)
    got = []

    async def bench(ctx):
        for dx in batches():
            ctx.set(rq.clear, 1)
            await ctx.tick()
            ctx.set(rq.clear, 0)
            # the input-gradient pass writes the entries, `entries` a cycle; the last
            # cycle's missing ones are untracked and hold the most negative dX
            for at in range(0, len(dx), entries):
                chunk = [int(v) for v in dx[at:at + entries]]
                ctx.set(rq.track, (1 << len(chunk)) - 1)
                for i in range(entries):
                    ctx.set(rq.dx[i], chunk[i] if i < len(chunk) else -(1 << 31))
                await ctx.tick()
            ctx.set(rq.track, 0)
            ctx.set(rq.dx[0], -(1 << 31))
            await ctx.tick()                # an untracked cycle changes nothing
            ctx.set(rq.latch, 1)
            await ctx.tick()
            ctx.set(rq.latch, 0)
            shift = ctx.get(rq.shift)
            dy = []
            # `entries` entries a cycle into the shifters; dy 2 + round_output cycles after
            # they are taken (the shifter's two stages, the register)
            latency = 2 + round_output
            queue = [int(v) for v in dx]
            queue += [0] * (-len(queue) % entries + latency * entries)
            for n, at in enumerate(range(0, len(queue), entries)):
                for shifter, v in zip(shifters, queue[at:at + entries]):
                    ctx.set(shifter.en, 1)
                    ctx.set(shifter.value, v)
                if n >= latency:
                    dy.extend(ctx.get(rq.dy[i]) for i in range(entries))
                await ctx.tick()
            for shifter in shifters:
                ctx.set(shifter.en, 0)
            del dy[len(dx):]
            got.append((shift, dy))

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    for dx, (shift, dy) in zip(batches(), got):
        want_shift = max(0, golden.bit_length(np.abs(dx).max()) - (spec.GRAD_BITS - 1))
        assert shift == want_shift
        assert dy == [int(v) for v in golden.saturate_grad(golden.round_shift(dx, want_shift))]
    assert [s for s, _ in got[:spec.DX_SHIFT_MAX + 1]] == list(range(spec.DX_SHIFT_MAX + 1))
