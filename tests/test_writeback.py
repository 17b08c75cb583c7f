"""The forward writeback unit (ember_hw.writeback.ForwardWriteback) alone in the Amaranth
simulator, with the engine's RoundingShifter and a snapshot of P sums in the testbench, against
golden.requantize: hidden layers write ReLU-saturated bytes, the output layer saturated logits,
only the lanes that hold outputs, one lane per cycle or a group of 2 or 4 (a shifter per lane
of a group), with the shifters' results registered before the saturation or not
(round_output: the wide and the narrow pipeline, ember.dataflow.Pipeline), with the timing of
its docstring."""

import numpy as np
import pytest
from amaranth import Module
from amaranth.sim import Simulator

from ember import dataflow, golden, spec
from ember_hw.arith import RoundingShifter
from ember_hw.writeback import ForwardWriteback

P = 4
VALUE_BITS = 30


def harness(drain, round_output=1):
    m = Module()
    m.submodules.wb = wb = ForwardWriteback(P, VALUE_BITS, act_addr_bits=10, grad_addr_bits=6,
                                            shift_bits=5, drain=drain,
                                            round_output=round_output)
    shifters = []
    for i in range(drain):
        m.submodules[f"shifter{i}"] = shifter = RoundingShifter(VALUE_BITS, spec.SHIFT_MAX)
        m.d.comb += [shifter.en.eq(wb.take), shifter.shift.eq(wb.take_shift),
                     wb.rounded[i].eq(shifter.out)]
        shifters.append(shifter)
    return m, wb, shifters


def lanes_of(value, bits, mask, first):
    """(lane, entry) of each set bit i of `mask`: lane first + i, bits [i * bits, ...)."""
    return [(first + i, value >> (i * bits) & ((1 << bits) - 1))
            for i in range(len(bin(mask)) - 2) if mask >> i & 1]


def test_a_group_divides_the_lanes():
    with pytest.raises(ValueError, match="divides the 4 lanes"):
        ForwardWriteback(P, VALUE_BITS, 10, 6, 5, drain=3)
    with pytest.raises(ValueError, match="not 2 times"):
        ForwardWriteback(P, VALUE_BITS, 10, 6, 5, round_output=2)


@pytest.mark.parametrize("round_output", [1, 0])
@pytest.mark.parametrize("drain", [1, 2, 4])
@pytest.mark.parametrize("last", [False, True])
def test_writeback_requantizes_like_golden(last, drain, round_output):
    D, G = drain, P // drain
    rng = np.random.default_rng(int(last))
    lo, hi = -(1 << (VALUE_BITS - 1)) + 1, (1 << (VALUE_BITS - 1)) - 1
    blocks = []
    for shift in (spec.HIDDEN_SHIFT, spec.OUTPUT_SHIFT, 0, 1, 20):
        sums = [int(v) for v in rng.integers(lo, hi, P)]
        sums[0] = (1 << shift) * 255 + (1 << max(shift - 1, 0))     # a tie just above 255
        sums[1] = -(1 << (shift + 3))
        lanes_on = int(rng.integers(1, 1 << P))
        blocks.append((sums, shift, lanes_on, int(rng.integers(0, 900)), int(rng.integers(0, 60))))
    m, wb, shifters = harness(drain, round_output)
    writes, timing = [], []

    async def bench(ctx):
        cycle = 0
        for sums, shift, lanes_on, act_addr, word in blocks:
            while ctx.get(wb.busy):
                await ctx.tick()
                cycle += 1
            snapshot = list(sums)
            for i, shifter in enumerate(shifters):
                ctx.set(shifter.value, snapshot[i])
            for port, v in ((wb.start, 1), (wb.last, last), (wb.shift, shift),
                            (wb.lanes_on, lanes_on), (wb.act_addr, act_addr),
                            (wb.grad_word, word)):
                ctx.set(port, v)
            start = cycle
            takes, written = [], []
            await ctx.tick()
            cycle += 1
            ctx.set(wb.start, 0)
            while True:
                if ctx.get(wb.take):
                    takes.append(cycle - start)
                if ctx.get(wb.act_wr_en):
                    written.append(cycle - start)
                    writes.extend(("act", lane, v) for lane, v in lanes_of(
                        ctx.get(wb.act_wr_data), spec.ACT_BITS, ctx.get(wb.act_wr_mask),
                        ctx.get(wb.act_wr_addr)))
                if ctx.get(wb.grad_wr_en):
                    written.append(cycle - start)
                    writes.extend(("grad", ctx.get(wb.grad_wr_word), lane, v)
                                  for lane, v in lanes_of(
                                      ctx.get(wb.grad_wr_value), spec.LOGIT_BITS,
                                      ctx.get(wb.grad_wr_mask), ctx.get(wb.grad_wr_lane)))
                take = ctx.get(wb.take)
                busy = ctx.get(wb.busy)
                await ctx.tick()
                cycle += 1
                if take:            # the snapshot moves down D lanes
                    snapshot = snapshot[D:] + snapshot[-D:]
                    for i, shifter in enumerate(shifters):
                        ctx.set(shifter.value, snapshot[i])
                if not busy and cycle - start > 2:
                    break
            timing.append((takes, written, cycle - start))

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    want = []
    for sums, shift, lanes_on, act_addr, word in blocks:
        y = golden.requantize(np.array(sums, dtype=np.int64), shift, relu=not last)
        for i in range(P):
            if lanes_on >> i & 1:
                want.append(("grad", word, i, int(y[i]) & 0xFFFF) if last
                            else ("act", act_addr + i, int(y[i])))
    assert writes == want, (writes, want, blocks)
    R = round_output
    # the spacing the engine and the cycle bounds take (Pipeline.writeback_gap)
    gap = dataflow.Pipeline(gate=0, broadcast=0, memory_write=0, grad_tree=0,
                            round_output=R).writeback_gap
    for (takes, written, span), (_, _, lanes_on, _, _) in zip(timing, blocks):
        assert takes == [2 + g for g in range(G)]
        assert written == [4 + R + g for g in range(G)
                           if lanes_on >> (g * D) & ((1 << D) - 1)]
        # busy from s + 1 to s + G + 3 + R, seen low in s + G + 4 + R
        assert span == G + 5 + R == G + gap + 1
