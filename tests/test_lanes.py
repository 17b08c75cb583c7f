"""The MAC lanes (ember_hw.lanes.MacLanes) alone in the Amaranth simulator, against the golden
model's integer sums: streams of operands with random gates form each lane's dot product
exactly (numpy int64), products arrive two cycles after their operands, b_zero clears a
lane's product, and the snapshot hands the accumulators out lane by lane at its head."""

import numpy as np
import pytest
from amaranth.sim import Simulator

from ember import spec
from ember_hw.lanes import MacLanes

P = 4
OPND = max(spec.WEIGHT_BITS, spec.GRAD_BITS, spec.ACT_BITS + 1)


def run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


def stream(dut, ctx, a, b, add, zero):
    """Drive one cycle of operands and the accumulate mask of the product two cycles old."""
    for i in range(P):
        ctx.set(dut.operand_a(i), int(a[i]) & ((1 << OPND) - 1))
        ctx.set(dut.operand_b(i), int(b[i]) & ((1 << OPND) - 1))
    ctx.set(dut.b_zero, sum(int(z) << i for i, z in enumerate(zero)))
    ctx.set(dut.acc_add, sum(int(g) << i for i, g in enumerate(add)))


@pytest.mark.parametrize("seed", [0, 1])
def test_lanes_form_the_golden_sums(seed):
    """Forward-pass shape: a weight per lane and one broadcast activation per cycle; the lanes
    equal golden's x @ W.T on the samples, with a lane mask (blocks narrower than P) and
    zero operands; then the extremes of a build's largest sum (no wrap)."""
    rng = np.random.default_rng(seed)
    K = 23
    build = spec.Build(name="t", lanes=P, max_width=64, max_batch=8)
    acc_bits = build.lane_acc_bits()
    dut = MacLanes(P, OPND, acc_bits)
    cases = []
    for _ in range(3):
        w = rng.integers(-(1 << 15), 1 << 15, size=(P, K))
        x = rng.integers(0, 256, size=K)
        x[rng.random(K) < 0.3] = 0
        gate = rng.integers(0, 2, size=P)
        cases.append((w, x, gate))
    w_max = np.full((P, 64), -(1 << 15))
    cases.append((w_max, np.full(64, 255), np.ones(P, dtype=int)))
    results = []

    async def bench(ctx):
        for w, x, gate in cases:
            ctx.set(dut.acc_clear, 1)
            await ctx.tick()
            ctx.set(dut.acc_clear, 0)
            k_len = w.shape[1]
            for t in range(k_len + 2):
                a = w[:, t] if t < k_len else np.zeros(P, dtype=int)
                b = np.full(P, x[t]) if t < k_len else np.zeros(P, dtype=int)
                # the products of cycle t - 2 are here now: accumulate them in gated lanes
                add = gate if t >= 2 else np.zeros(P, dtype=int)
                stream(dut, ctx, a, b, add, np.zeros(P, dtype=int))
                await ctx.tick()
            stream(dut, ctx, np.zeros(P), np.zeros(P), np.zeros(P), np.zeros(P))
            results.append([ctx.get(dut.accumulator(i)) for i in range(P)])

    run(dut, bench)
    for (w, x, gate), got in zip(cases, results):
        # golden's forward sum (GoldenModel._forward: x @ W.T) in the gated lanes
        want = np.where(gate == 1, (x[None, :] @ w.T)[0], 0)
        assert got == [int(v) for v in want]
    assert results[-1][0] == -(1 << 15) * 255 * 64   # the largest negative forward sum


def test_b_zero_and_product_timing():
    """A lane's product is a * b two cycles after the operands, 0 where b_zero was set."""
    dut = MacLanes(P, OPND, 40)
    a = [-32768, 32767, -5, 7]
    b = [-32768, -32768, 255, 3]
    seen = []

    async def bench(ctx):
        stream(dut, ctx, a, b, [0] * P, [0, 0, 1, 0])
        await ctx.tick()
        stream(dut, ctx, [0] * P, [0] * P, [0] * P, [0] * P)
        seen.append([ctx.get(dut.product(i)) for i in range(P)])
        await ctx.tick()
        seen.append([ctx.get(dut.product(i)) for i in range(P)])

    run(dut, bench)
    assert seen[1] == [(-32768) * (-32768), 32767 * -32768, 0, 21]
    assert seen[0] != seen[1]


def test_snapshot_hands_out_lanes_in_order():
    """snap takes the accumulators; snap_shift moves lane i + 1 to lane i, so head shows lane
    0, 1, 2, ... on successive shifts, while the accumulators are free to restart (acc_zero
    clears only its lanes)."""
    dut = MacLanes(P, OPND, 40)
    seen = {}

    async def bench(ctx):
        values = [1000, -2000, 3, -(1 << 30)]
        for i in range(P):
            ctx.set(dut.operand_a(i), values[i] & 0xFFFF if abs(values[i]) < 1 << 15 else 0)
            ctx.set(dut.operand_b(i), 1)
        ctx.set(dut.operand_a(3), (-(1 << 15)) & 0xFFFF)
        ctx.set(dut.operand_b(3), (1 << 15) - 1)
        await ctx.tick().repeat(2)
        ctx.set(dut.acc_add, (1 << P) - 1)
        await ctx.tick()
        ctx.set(dut.acc_add, 0)
        ctx.set(dut.snap, 1)
        ctx.set(dut.acc_zero, 0b0101)
        await ctx.tick()
        ctx.set(dut.snap, 0)
        ctx.set(dut.acc_zero, 0)
        seen["acc"] = [ctx.get(dut.accumulator(i)) for i in range(P)]
        heads = []
        for _ in range(P):
            heads.append(ctx.get(dut.head))
            ctx.set(dut.snap_shift, 1)
            await ctx.tick()
        ctx.set(dut.snap_shift, 0)
        seen["heads"] = heads
        seen["after"] = ctx.get(dut.head)

    run(dut, bench)
    lane3 = -(1 << 15) * ((1 << 15) - 1)
    assert seen["heads"] == [1000, -2000, 3, lane3]
    assert seen["acc"] == [0, -2000, 0, lane3]
    assert seen["after"] == lane3          # the top lane keeps its value
