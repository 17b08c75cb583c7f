"""The update unit (ember_hw.update.UpdateUnit) alone in the Amaranth simulator, with the
engine's RoundingShifter and, in the testbench, the MAC lanes' snapshot and the weight word
register, against golden.sgd_update (every shift 0..UPDATE_SHIFT_MAX, saturation at both
ends) and golden.sign_update (PSG): only the changed lanes of the kept ones are written, with
the read-before-write order and the timing of its docstring, and skip_psg's amounts."""

import numpy as np
import pytest
from amaranth import Module
from amaranth.sim import Simulator

from ember import golden, spec
from ember_hw.arith import RoundingShifter
from ember_hw.update import UpdateUnit

P = 4
VALUE_BITS = 36
W = spec.WEIGHT_BITS


def harness():
    m = Module()
    m.submodules.upd = upd = UpdateUnit(P, VALUE_BITS, addr_bits=8, live_bits=4, step_bits=4)
    m.submodules.shifter = shifter = RoundingShifter(VALUE_BITS, spec.SHIFT_MAX)
    m.d.comb += [shifter.en.eq(upd.take), shifter.shift.eq(upd.take_shift),
                 upd.twice.eq(shifter.twice), upd.rounded.eq(shifter.out)]
    return m, upd, shifter


def words(rng, psg):
    """(weights, gradients, lanes_on, shift, skip, live, step) of the words to update."""
    out = []
    lo, hi = -(1 << (VALUE_BITS - 1)) + 1, 1 << (VALUE_BITS - 1)
    shifts = [0, 1, 2, 9, 14, 20, 33, spec.UPDATE_SHIFT_MAX] + \
        [int(s) for s in rng.integers(0, spec.UPDATE_SHIFT_MAX + 1, 4)]
    for shift in shifts:
        w = rng.integers(-(1 << 15), 1 << 15, P)
        w[0], w[1] = 32767, -32768            # saturation at both ends
        g = rng.integers(lo, hi, P) >> int(rng.integers(0, 30))
        g[0], g[1] = -(1 << (shift + 4)), 1 << (shift + 4)
        g[2] = 0 if shift % 2 else g[2]       # no change: no write
        out.append((w, g, int(rng.integers(1, 1 << P)), shift, int(rng.integers(0, 1 << P)),
                    int(rng.integers(0, 9)), int(rng.integers(0, 15))))
    return out


@pytest.mark.parametrize("psg", [False, True])
def test_update_unit_matches_golden(psg):
    rng = np.random.default_rng(int(psg))
    cases = words(rng, psg)
    m, upd, shifter = harness()
    log = []

    async def bench(ctx):
        ctx.set(upd.psg, psg)
        for addr, (w, g, lanes_on, shift, skip, live, step) in enumerate(cases):
            while ctx.get(upd.busy):
                await ctx.tick()
            ctx.set(upd.step_shift, step)
            for port, v in ((upd.start, 1), (upd.lanes_on, lanes_on), (upd.addr, addr),
                            (upd.shift, shift), (upd.skip, skip), (upd.live, live)):
                ctx.set(port, v)
            snapshot = [int(v) for v in g]
            word = None                        # the engine's word register (lane list)
            memory = [int(v) for v in w]       # the weight memory's word `addr`
            ctx.set(shifter.value, snapshot[0])
            reads, writes, skipped, rd_lanes = [], {}, 0, None
            await ctx.tick()
            ctx.set(upd.start, 0)
            cycle, read_data = 1, None
            while True:
                if ctx.get(upd.rd_en):
                    reads.append((cycle, ctx.get(upd.word_addr)))
                    rd_lanes = ctx.get(upd.rd_lanes)
                if ctx.get(upd.wr_en):
                    lane = ctx.get(upd.wr_lane)
                    v = ctx.get(upd.wr_value)
                    writes[lane] = (cycle, v - (1 << W) if v >> (W - 1) else v)
                    memory[lane] = writes[lane][1]
                skipped += ctx.get(upd.skipped)
                load, shift_word = ctx.get(upd.word_load), ctx.get(upd.word_shift)
                take, busy = ctx.get(upd.take), ctx.get(upd.busy)
                rd = ctx.get(upd.rd_en)
                await ctx.tick()
                cycle += 1
                if load:
                    word = list(read_data)
                elif shift_word:
                    word = word[1:] + [0]
                read_data = list(memory) if rd else read_data
                if take:
                    snapshot = snapshot[1:] + snapshot[-1:]
                    ctx.set(shifter.value, snapshot[0])
                if word is not None:
                    ctx.set(upd.old_weight, word[0] & 0xFFFF)
                if not busy and cycle > 2:
                    break
            log.append((reads, writes, memory, skipped, rd_lanes, cycle))

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    for addr, ((w, g, lanes_on, shift, skip, live, step), (reads, writes, memory, skipped,
                                                            rd_lanes, span)) \
            in enumerate(zip(cases, log)):
        kept = np.array([lanes_on >> i & 1 for i in range(P)], dtype=bool)
        new = golden.sign_update(w, np.sign(g), step) if psg else golden.sgd_update(w, g, shift)
        new = np.where(kept, new, w)
        assert memory == [int(v) for v in new], (addr, shift)
        assert sorted(writes) == [i for i in range(P) if new[i] != w[i]]     # changed only
        assert reads == [(2, addr)] and rd_lanes == lanes_on
        assert all(c == 8 + lane for lane, (c, _) in writes.items())
        assert span == P + 9            # busy from s + 1 to s + P + 7, seen low in s + P + 8
        assert skipped == live * bin(skip).count("1")
