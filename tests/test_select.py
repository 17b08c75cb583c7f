"""ssProp selection gateware (hw/ember_hw/select.py) against its golden twins
golden.select_channels and golden.lfsr_sequence, in the Amaranth simulator."""

import gc
import warnings

import numpy as np
import pytest
from amaranth.hdl import Fragment, UnusedElaboratable
from amaranth.sim import Simulator

from ember import golden, spec
from ember_hw.select import LFSR_BITS, TOP_K_SCORE_BITS, ChannelSelector, Lfsr16


def simulate(dut, testbench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()


async def select(ctx, dut, scores, k):
    """Write `scores`, run one selection of `k`; return (mask, kept_count, cycles from the
    start cycle to the done cycle). Checks the busy/done handshake on the way."""
    scores = [int(s) for s in scores]
    for i, s in enumerate(scores):
        ctx.set(dut.score_index, i)
        ctx.set(dut.score_data, s)
        ctx.set(dut.score_we, 1)
        await ctx.tick()
    ctx.set(dut.score_we, 0)
    ctx.set(dut.channels, len(scores))
    ctx.set(dut.keep, k)
    ctx.set(dut.start, 1)
    await ctx.tick()
    ctx.set(dut.start, 0)
    cycles = 1
    while not ctx.get(dut.done):
        assert ctx.get(dut.busy), f"busy dropped before done (N={len(scores)}, k={k})"
        await ctx.tick()
        cycles += 1
    assert not ctx.get(dut.busy)
    kept_count = ctx.get(dut.kept_count)
    mask = []
    # Read one index past N (when it exists) to check that stale entries read 0.
    read = min(len(scores) + 1, dut.max_channels)
    for i in range(read):
        ctx.set(dut.kept_index, i)
        await ctx.tick()
        assert not ctx.get(dut.done), "done is longer than one cycle"
        mask.append(ctx.get(dut.kept))
    if read > len(scores):
        assert mask.pop() == 0, f"index N={len(scores)} reads a stale kept bit"
    return np.array(mask, dtype=bool), kept_count, cycles


def check_cases(cases, max_channels=128, score_bits=20):
    """Run every (scores, k) in one simulation and compare with golden.select_channels.
    Returns the cycle count of each case."""
    dut = ChannelSelector(max_channels=max_channels, score_bits=score_bits)
    all_cycles = []

    async def tb(ctx):
        for scores, k in cases:
            n = len(scores)
            mask, kept_count, cycles = await select(ctx, dut, scores, k)
            expect = golden.select_channels(scores, k)
            assert np.array_equal(mask, expect), (
                f"N={n} k={k} scores={list(scores)}: mismatch at "
                f"{np.flatnonzero(mask != expect).tolist()}")
            assert kept_count == min(k, n) == mask.sum()
            if k < n:
                assert cycles <= (score_bits + 1) * (n + 1) + 1, (n, k, cycles)
            else:
                assert cycles == n + 2, (n, k, cycles)
            all_cycles.append(cycles)

    simulate(dut, tb)
    return all_cycles


def test_random_scores_match_golden():
    rng = np.random.default_rng(1)
    cases = []
    for _ in range(40):
        n = int(rng.integers(1, 101))
        k = int(rng.integers(1, n + 1))
        cases.append((rng.integers(0, 1 << 20, size=n), k))
    # Small scores: the search starts below the MSB (leading-zero skip).
    for _ in range(10):
        n = int(rng.integers(1, 101))
        k = int(rng.integers(1, n + 1))
        cases.append((rng.integers(0, 50, size=n), k))
    check_cases(cases)


def test_heavy_ties_match_golden():
    rng = np.random.default_rng(2)
    cases = []
    for values in ([0, 1], [3, 7, 7, 9], [5], [0, (1 << 20) - 1], [1 << 19, (1 << 19) - 1]):
        for _ in range(6):
            n = int(rng.integers(1, 101))
            k = int(rng.integers(1, n + 1))
            cases.append((rng.choice(values, size=n), k))
    cases += [
        (np.zeros(40, dtype=int), 1),
        (np.zeros(40, dtype=int), 17),
        (np.full(40, 12345), 39),
        (np.full(50, (1 << 20) - 1), 25),    # all at the maximum value
        (np.full(50, (1 << 20) - 1), 1),
        (np.array([(1 << 20) - 1] * 3 + [0] * 5 + [(1 << 20) - 1] * 4), 5),
    ]
    check_cases(cases)


def test_k_edges_match_golden():
    rng = np.random.default_rng(3)
    cases = []
    for n in (1, 2, 3, 17, 64, 100):
        scores = rng.integers(0, 1 << 20, size=n)
        cases += [(scores, 1), (scores, n)]
    scores = rng.integers(0, 1 << 20, size=30)
    cases.append((scores, 100))           # k > N keeps everything
    cases.append((np.full(30, 0), 30))
    check_cases(cases)


def test_k_zero_and_empty_layer():
    dut = ChannelSelector(max_channels=32, score_bits=8)

    async def tb(ctx):
        # A full selection first, so the mask memory holds kept bits that must be cleared.
        mask, count, _ = await select(ctx, dut, list(range(20)), 20)
        assert mask.all() and count == 20
        mask, count, _ = await select(ctx, dut, [255] * 10 + list(range(10)), 0)
        assert not mask.any() and count == 0
        mask, count, cycles = await select(ctx, dut, [], 3)
        assert len(mask) == 0 and count == 0 and cycles == 1

    simulate(dut, tb)


def test_cycle_counts_at_the_extremes():
    n, score_bits = 40, 12
    top = (1 << score_bits) - 1
    one_top = np.arange(n)
    one_top[7] = top
    cycles = check_cases([
        (np.zeros(n, dtype=int), 5),          # one pass finds all scores 0
        (np.full(n, top), 5),                 # ties at the MSB: every bit is searched
        (one_top, 1),                         # the MSB pass alone meets k exactly
        (np.arange(n), n // 2),               # scores below 2**6: search starts at bit 5
    ], max_channels=64, score_bits=score_bits)
    assert cycles[0] == 2 * (n + 1) + 1
    assert cycles[1] == (score_bits + 1) * (n + 1) + 1
    assert cycles[2] == 2 * (n + 1) + 1
    assert cycles[3] <= (1 + 6 + 1) * (n + 1) + 1


def test_wide_scores_match_golden():
    rng = np.random.default_rng(4)
    score_bits = 32
    top = (1 << score_bits) - 1
    cases = []
    for _ in range(6):
        n = int(rng.integers(1, 80))
        k = int(rng.integers(1, n + 1))
        cases.append((rng.integers(0, top, size=n, endpoint=True), k))
    cases.append((np.full(30, top), 12))
    cases.append((rng.choice([top, top - 1, 1 << 31, 0], size=60), 21))
    # Random-variant scores: 16-bit LFSR states.
    states, _ = golden.lfsr_sequence(0xACE1, 90)
    cases.append((states, golden.keep_count(90, spec.KEEP_ONE // 4)))
    check_cases(cases, max_channels=128, score_bits=score_bits)


@pytest.mark.parametrize("seed", [5, 6])
def test_wide_layers_match_golden(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(280, 320))
    cases = [
        (rng.integers(0, 1 << 10, size=n), golden.keep_count(n, 77)),
        (rng.integers(0, 4, size=n), golden.keep_count(n, 128)),
        (rng.integers(0, 1 << 10, size=n), n - 1),
    ]
    check_cases(cases, max_channels=512, score_bits=10)


def test_default_score_width_holds_both_variants():
    dut = ChannelSelector()
    Fragment.get(dut, None)                  # the default size elaborates
    assert len(dut.score_data) >= max(TOP_K_SCORE_BITS, LFSR_BITS)
    assert dut.max_channels <= spec.MAX_WIDTH


def test_rejects_oversized_selector():
    with warnings.catch_warnings():
        # The half-built component is never elaborated; that is the point.
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(ValueError, match=f"{spec.MAX_WIDTH + 1} is outside 1..{spec.MAX_WIDTH}"):
            ChannelSelector(max_channels=spec.MAX_WIDTH + 1)
        gc.collect()


def test_lfsr_matches_golden():
    dut = Lfsr16()
    steps = 1000

    async def tb(ctx):
        for seed in (1, 0xACE1, 0xFFFF, 0x8000):
            ctx.set(dut.seed, seed)
            ctx.set(dut.load, 1)
            ctx.set(dut.step, 1)             # load wins over step
            await ctx.tick()
            ctx.set(dut.load, 0)
            assert ctx.get(dut.state) == seed
            expect, _ = golden.lfsr_sequence(seed, steps)
            got = []
            for _ in range(steps):
                await ctx.tick()
                got.append(ctx.get(dut.state))
            assert got == expect.tolist(), f"seed {seed:#06x}"
            ctx.set(dut.step, 0)             # holds without step
            await ctx.tick()
            await ctx.tick()
            assert ctx.get(dut.state) == expect[-1]

    simulate(dut, tb)
