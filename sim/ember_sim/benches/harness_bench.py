"""cocotb bench of ``ByteSummer`` (harness_dut.py): proves ember_sim.rtl end to end, and times it.

Run by tests/test_rtl_harness.py (``sums_random_bytes``, ``clear_zeroes_total``,
``clock_helpers_count_cycles``; the
deliberately failing ``expects_wrong_sum`` only when selected) and by ember_sim.speed
(``idle_speed``, ``driven_speed``). Tests declared ``skip=True`` run only when named by
``rtl.run(testcase=...)``: cocotb runs skipped tests that a test filter selects.

Case keys (``rtl.run(case=...)``): ``bytes`` (how many to send), ``gap_probability`` (chance
the source idles in a cycle), ``stall_period`` (must match the built ``ByteSummer``),
``cycles`` and ``driven_cycles`` (speed tests).
"""

import random
import time

import cocotb
from cocotb.simtime import get_sim_time
from cocotb.triggers import ReadOnly, RisingEdge

from ember_sim import clock, rtl
from ember_sim.benches.harness_dut import byte_sum_reference


async def _start(dut):
    clk = clock.start_clock(dut)
    dut.i__valid.value = 0
    dut.i__payload.value = 0
    dut.clear.value = 0
    await clock.reset(dut, clk)
    return clk


async def _send(dut, byte_values, gap_probability):
    """Offer each byte until the sink takes it, idling at random; return the stalls seen.

    A stall is a cycle where a byte was offered and ``ready`` was low. Runs from just after a
    rising edge to just after the edge that accepted the last byte.
    """
    stalls = 0
    index = 0
    while index < len(byte_values):
        offer = random.random() >= gap_probability
        dut.i__valid.value = int(offer)
        dut.i__payload.value = byte_values[index] if offer else random.randrange(256)
        await ReadOnly()  # ``ready`` of this cycle, after our writes settled
        if offer:
            if int(dut.i__ready.value):
                index += 1
            else:
                stalls += 1
        await RisingEdge(dut.clk)
    dut.i__valid.value = 0
    return stalls


async def _read_after_edge(dut):
    """``total`` and ``count`` after the next rising edge (ends in the read-only phase)."""
    await RisingEdge(dut.clk)
    await ReadOnly()
    return int(dut.total.value), int(dut.count.value)


async def _send_random_bytes(dut):
    case = rtl.load_case()
    byte_values = [random.randrange(256) for _ in range(case.get("bytes", 200))]
    await _start(dut)
    stalls = await _send(dut, byte_values, case.get("gap_probability", 0.3))
    total, count = await _read_after_edge(dut)
    return byte_values, stalls, total, count


@cocotb.test()
async def sums_random_bytes(dut):
    """Random bytes with random valid gaps: total and count match the golden sum."""
    byte_values, stalls, total, count = await _send_random_bytes(dut)
    assert count == len(byte_values), f"count {count}, sent {len(byte_values)}"
    assert total == byte_sum_reference(byte_values), (
        f"total {total}, expected {byte_sum_reference(byte_values)}")
    if rtl.load_case().get("stall_period", 0):
        assert stalls > 0, "the sink never refused a byte: backpressure went untested"


@cocotb.test()
async def clear_zeroes_total(dut):
    """``clear`` drops ``ready`` at once and zeroes total and count on the next edge."""
    await _start(dut)
    await _send(dut, [200, 100, 55], gap_probability=0.0)
    total, count = await _read_after_edge(dut)
    assert (total, count) == (355, 3)
    await RisingEdge(dut.clk)  # leave the read-only phase before driving
    dut.clear.value = 1
    dut.i__valid.value = 1
    await ReadOnly()
    assert int(dut.i__ready.value) == 0, "ready must be low while clear is high"
    await RisingEdge(dut.clk)
    dut.clear.value = 0
    dut.i__valid.value = 0
    await ReadOnly()
    assert (int(dut.total.value), int(dut.count.value)) == (0, 0)


@cocotb.test()
async def clock_helpers_count_cycles(dut):
    """``wait_high`` and ``wait_cycles`` land on the edges the stall pattern predicts."""
    period = rtl.load_case().get("stall_period", 0)
    if not period:
        return
    clk = await _start(dut)
    for _ in range(period):  # find the stall cycle (``ready`` low), just after its edge
        await ReadOnly()
        if not int(dut.i__ready.value):
            break
        await RisingEdge(dut.clk)
    assert not int(dut.i__ready.value), f"ready never dropped in {period} cycles"
    assert await clock.wait_high(dut.i__ready, clk, max_cycles=period) == 1
    dut.i__valid.value = 0  # inputs may be driven after wait_high returns
    await clock.wait_cycles(clk, period - 1)
    await ReadOnly()
    assert not int(dut.i__ready.value), "the next stall comes one period after the last"
    await RisingEdge(dut.clk)
    dut.clear.value = 1  # holds ready low
    try:
        await clock.wait_high(dut.i__ready, clk, max_cycles=3 * period)
    except TimeoutError as error:
        assert "i__ready" in str(error)
    else:
        raise AssertionError("wait_high returned although ready stayed low")


@cocotb.test(skip=True)
async def expects_wrong_sum(dut):
    """Deliberately wrong expectation: proves rtl.run turns a failing cocotb test into a failure."""
    byte_values, _, total, _ = await _send_random_bytes(dut)
    assert total == byte_sum_reference(byte_values) + 1, "this test fails on purpose"


@cocotb.test(skip=True)
async def idle_speed(dut):
    """Free-running clock, Python asleep: simulator speed without per-cycle Python cost."""
    cycles = rtl.load_case().get("cycles", 1_000_000)
    clk = await _start(dut)
    sim_start = get_sim_time("ns")
    wall_start = time.perf_counter()
    await clock.wait_cycles(clk, cycles)
    seconds = time.perf_counter() - wall_start
    assert get_sim_time("ns") - sim_start == cycles * clock.CLOCK_PERIOD_NS
    rtl.write_result({"idle_cycles": cycles, "idle_seconds": seconds})


@cocotb.test(skip=True)
async def driven_speed(dut):
    """Python drives a byte every cycle: the cost of waking Python at each edge."""
    cycles = rtl.load_case().get("driven_cycles", 20_000)
    clk = await _start(dut)
    dut.i__valid.value = 1
    wall_start = time.perf_counter()
    for n in range(cycles):
        dut.i__payload.value = n & 0xFF
        await RisingEdge(clk.signal)
    seconds = time.perf_counter() - wall_start
    dut.i__valid.value = 0
    _, count = await _read_after_edge(dut)
    assert count > 0, "no byte accepted while driving"
    rtl.write_result({"driven_cycles": cycles, "driven_seconds": seconds})
