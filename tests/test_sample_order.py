"""The order generator (hw/ember_hw/order.py) against its golden twin schedule.epoch_order, in
the Amaranth simulator: the indices, their timing, stalls and restarts."""

import gc
import warnings

import numpy as np
import pytest
from amaranth.hdl import UnusedElaboratable

from ember.schedule import (ORDER_KEY_BITS, ORDER_MAX_SAMPLES, epoch_order, order_half_bits,
                            order_permute, order_steps)
from ember_hw.order import ORDER_LATENCY, SampleOrder

from engine_harness import run_testbench

KEY_TOP = (1 << ORDER_KEY_BITS) - 1


def never_stall(cycle):
    return True


async def start_order(ctx, dut, key, n):
    """One start cycle for (key, n); the consumer holds ready low in it, so an index offered
    then by an abandoned order is not taken."""
    ctx.set(dut.key, key)
    ctx.set(dut.samples, n)
    ctx.set(dut.indices.ready, 0)
    ctx.set(dut.start, 1)
    await ctx.tick()
    ctx.set(dut.start, 0)
    ctx.set(dut.key, 0)             # sampled at start only: later values must not matter
    ctx.set(dut.samples, 0)


async def take(ctx, dut, ready_at=never_stall, stop_cycle=None):
    """Be the consumer from the cycle after a start until done (or until `stop_cycle`), with
    ready = ready_at(cycle). Returns (indices taken, the cycle each was taken in, the cycle done
    rose in or None, the cycles an index was offered and not taken); cycles count from the start
    cycle, 0. Checks that an offered index is held, unchanged, until taken."""
    indices, taken_at = [], []
    offered = None
    stalled = 0
    cycle = 1
    while not ctx.get(dut.done):
        if cycle == stop_cycle:
            return indices, taken_at, None, stalled
        ready = bool(ready_at(cycle))
        ctx.set(dut.indices.ready, ready)
        if ctx.get(dut.indices.valid):
            payload = ctx.get(dut.indices.payload)
            assert offered in (None, payload), f"offered {offered}, then {payload} before ready"
            offered = None if ready else payload
            stalled += not ready
            if ready:
                indices.append(payload)
                taken_at.append(cycle)
        else:
            assert offered is None, f"index {offered} withdrawn before it was taken"
        await ctx.tick()
        cycle += 1
    return indices, taken_at, cycle, stalled


def candidate_cycles(key, n):
    """The cycle (from the start cycle) each index of epoch_order(key, n) is offered in when
    never stalled, and the cycle done rises in."""
    h = order_half_bits(n)
    steps = order_steps(n)
    ys = order_permute(np.arange(steps, dtype=np.int64), key, h)
    accepted = np.flatnonzero(ys < n)
    last_accepted = bool(ys[-1] < n)
    done = steps + ORDER_LATENCY - (0 if last_accepted else 1)
    return (accepted + ORDER_LATENCY).tolist(), done


def check_orders(cases, max_samples):
    """Run every (key, n) back to back in one simulation, never stalled: the indices equal
    epoch_order(key, n), each offered in the cycle its candidate number says, and done rises
    within order_steps(n) + ORDER_LATENCY cycles."""
    dut = SampleOrder(max_samples=max_samples)

    async def tb(ctx):
        assert not ctx.get(dut.done), "done before any order"
        for key, n in cases:
            await start_order(ctx, dut, key, n)
            indices, taken_at, done_cycle, _ = await take(ctx, dut)
            expect = epoch_order(key, n).tolist()
            assert indices == expect, f"key {key:#010x} n={n}: {indices[:8]}... != {expect[:8]}..."
            expect_at, expect_done = candidate_cycles(key, n)
            assert taken_at == expect_at, f"key {key:#010x} n={n}: offer cycles"
            assert done_cycle == expect_done <= order_steps(n) + ORDER_LATENCY, (key, n)

    run_testbench(dut, tb)


def test_small_orders_match_golden():
    rng = np.random.default_rng(11)
    cases = [(int(rng.integers(0, KEY_TOP, endpoint=True)), n)
             for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65)
             for _ in range(2)]
    cases += [(0, 5), (KEY_TOP, 5), (0, 64), (KEY_TOP, 65)]
    check_orders(cases, max_samples=128)


def test_orders_near_powers_of_two_match_golden():
    rng = np.random.default_rng(12)
    cases = [(int(rng.integers(0, KEY_TOP, endpoint=True)), n)
             for n in (127, 128, 129, 255, 256, 257, 511, 512, 513, 1023, 1024, 1025, 2048)]
    check_orders(cases, max_samples=2048)


def test_random_orders_match_golden():
    rng = np.random.default_rng(13)
    cases = [(int(rng.integers(0, KEY_TOP, endpoint=True)), int(rng.integers(1, 2001)))
             for _ in range(6)]
    cases.append((int(rng.integers(0, KEY_TOP, endpoint=True)), 2000))
    check_orders(cases, max_samples=2000)


def test_largest_halves_match_golden():
    # h = 7 and h = 8: the rotations' wrapped bits come from the top bits of the halves. One
    # whole order of h = 7; h = 8 orders (65536 candidates) are checked over their first
    # 3000 cycles, in which the low half runs through all its values.
    prefix_cycles = 3000
    rng = np.random.default_rng(14)
    dut = SampleOrder(max_samples=ORDER_MAX_SAMPLES)

    async def tb(ctx):
        key, n = int(rng.integers(0, KEY_TOP, endpoint=True)), 4097
        await start_order(ctx, dut, key, n)
        indices, taken_at, done_cycle, _ = await take(ctx, dut)
        assert indices == epoch_order(key, n).tolist(), f"key {key:#010x} n={n}"
        assert (taken_at, done_cycle) == candidate_cycles(key, n)
        for n in (16385, ORDER_MAX_SAMPLES):
            key = int(rng.integers(0, KEY_TOP, endpoint=True))
            await start_order(ctx, dut, key, n)
            indices, taken_at, _, _ = await take(ctx, dut, stop_cycle=prefix_cycles)
            expect_at, _ = candidate_cycles(key, n)
            taken = sum(cycle < prefix_cycles for cycle in expect_at)
            assert taken >= prefix_cycles * n // (2 * order_steps(n)), (key, n, taken)
            assert indices == epoch_order(key, n)[:taken].tolist(), f"key {key:#010x} n={n}"
            assert taken_at == expect_at[:taken]

    run_testbench(dut, tb)


def test_smallest_unit_matches_golden():
    cases = [(key, n) for n in (1, 2, 3) for key in (0, 0x01020302, KEY_TOP)]
    check_orders(cases, max_samples=3)


@pytest.mark.parametrize("stall_chance", [0.3, 0.8])
def test_stalled_consumer_gets_the_exact_order(stall_chance):
    rng = np.random.default_rng(int(stall_chance * 100))
    dut = SampleOrder(max_samples=1024)
    cases = [(int(rng.integers(0, KEY_TOP, endpoint=True)), n) for n in (1, 5, 64, 300, 1000)]

    async def tb(ctx):
        for key, n in cases:
            await start_order(ctx, dut, key, n)
            indices, _, done_cycle, stalled = await take(
                ctx, dut, lambda cycle: rng.random() >= stall_chance)
            assert indices == epoch_order(key, n).tolist(), f"key {key:#010x} n={n}"
            assert stalled > 0 or n == 1
            # The pipeline stops only while an index is offered and not taken.
            _, never_stalled_done = candidate_cycles(key, n)
            assert done_cycle == never_stalled_done + stalled, (key, n, stalled)

    run_testbench(dut, tb)


def test_restarts_begin_new_orders_cleanly():
    rng = np.random.default_rng(15)
    dut = SampleOrder(max_samples=512)

    async def tb(ctx):
        key, n = 0x5EED0001, 300
        await start_order(ctx, dut, key, n)
        indices, _, _, _ = await take(ctx, dut)
        assert indices == epoch_order(key, n).tolist()
        # done holds, with nothing offered, until the cycle after the next start.
        for _ in range(3):
            await ctx.tick()
            assert ctx.get(dut.done) and not ctx.get(dut.indices.valid)

        # Starts in the middle of orders: at random points, stalled or not, with an index
        # offered or not; the abandoned order's indices so far are its prefix.
        for _ in range(8):
            old_key = int(rng.integers(0, KEY_TOP, endpoint=True))
            old_n = int(rng.integers(2, 513))
            await start_order(ctx, dut, old_key, old_n)
            assert not ctx.get(dut.done), "done in the cycle after start"
            stop = int(rng.integers(2, order_steps(old_n)))
            prefix, _, done_cycle, _ = await take(ctx, dut, lambda c: rng.random() < 0.7, stop)
            assert done_cycle is None
            assert prefix == epoch_order(old_key, old_n)[:len(prefix)].tolist()

            key, n = int(rng.integers(0, KEY_TOP, endpoint=True)), int(rng.integers(1, 513))
            await start_order(ctx, dut, key, n)
            indices, taken_at, done_cycle, _ = await take(ctx, dut)
            assert indices == epoch_order(key, n).tolist(), f"key {key:#010x} n={n} after restart"
            assert (taken_at, done_cycle) == candidate_cycles(key, n)

        # A start while an index is offered drops it: the new order begins with its own first.
        key, n = 0xC0FFEE, 40
        await start_order(ctx, dut, key, n)
        first_offer = candidate_cycles(key, n)[0][0]
        await take(ctx, dut, lambda cycle: False, stop_cycle=first_offer + 2)
        assert ctx.get(dut.indices.valid)
        await start_order(ctx, dut, key + 1, n)
        indices, _, _, _ = await take(ctx, dut)
        assert indices == epoch_order(key + 1, n).tolist()

    run_testbench(dut, tb)


def test_empty_order_is_done_after_its_candidates():
    dut = SampleOrder(max_samples=16)

    async def tb(ctx):
        await start_order(ctx, dut, 0x12345678, 0)
        indices, _, done_cycle, _ = await take(ctx, dut)
        assert indices == [] and done_cycle == order_steps(1) + ORDER_LATENCY - 1

    run_testbench(dut, tb)


def test_widths_follow_max_samples():
    for max_samples, index_bits, samples_bits in ((1, 1, 1), (2, 1, 2), (5, 3, 3),
                                                  (2048, 11, 12), (2049, 12, 12),
                                                  (ORDER_MAX_SAMPLES, 16, 17)):
        dut = SampleOrder(max_samples=max_samples)
        assert dut.max_half_bits == order_half_bits(max_samples)
        assert len(dut.indices.payload) == index_bits, max_samples
        assert len(dut.samples) == samples_bits, max_samples
        assert len(dut.key) == ORDER_KEY_BITS


def test_rejects_oversized_order():
    with warnings.catch_warnings():
        # The half-built component is never elaborated; that is the point.
        warnings.simplefilter("ignore", UnusedElaboratable)
        for bad in (0, ORDER_MAX_SAMPLES + 1):
            with pytest.raises(ValueError, match=f"max_samples {bad} is outside "
                                                 f"1..{ORDER_MAX_SAMPLES}"):
                SampleOrder(max_samples=bad)
        gc.collect()
