"""Clock, reset and waiting for cocotb benches, written for speed (cocotb 2.x API).

The rule that matters: Python must not wake on every clock edge in long waits. A wake costs
about as much as simulating several cycles of a small design, so

- the clock is driven from C (``Clock(..., impl="gpi")``), not by a Python coroutine. cocotb
  picks the Python clock by default when ``COCOTB_TRUST_INERTIAL_WRITES`` is unset, which is the
  case under Icarus; ``start_clock`` asks for the C clock on every simulator;
- bulk waits use ``wait_cycles`` (one ``Timer`` for the whole span, then one edge to realign),
  never a loop of ``RisingEdge`` or ``ClockCycles`` (which wakes Python at every edge);
- waiting for the design to finish uses ``wait_high(dut.done, ...)``: one wake when ``done``
  rises, with a cycle budget so a hung design fails instead of hanging the test;
- inputs are driven right after ``await RisingEdge(dut.clk)``; the value is applied before the
  next edge. Per-cycle driving is fine for short transfers; feed bytes in bursts.

Typical bench::

    import cocotb
    from ember_sim import clock

    @cocotb.test()
    async def finishes(dut):
        clk = clock.start_clock(dut)
        await clock.reset(dut, clk)
        dut.start.value = 1
        await RisingEdge(dut.clk)
        dut.start.value = 0
        cycles = await clock.wait_high(dut.done, clk, max_cycles=100_000)
"""

from __future__ import annotations

from cocotb.clock import Clock
from cocotb.simtime import get_sim_time
from cocotb.triggers import First, ReadOnly, RisingEdge, Timer, current_gpi_trigger
from cocotb.utils import get_sim_steps

CLOCK_PERIOD_NS = 10
"""Simulated clock period. Only ratios matter in simulation; 10 ns keeps timestamps readable."""


def start_clock(dut, period_ns: int = CLOCK_PERIOD_NS, signal: str = "clk") -> Clock:
    """Start a C-driven clock on ``dut.<signal>`` (Amaranth's ``sync`` domain is ``clk``).

    cocotb 2.x ``Clock.start()`` schedules its own task: no ``cocotb.start_soon`` needed.
    """
    clock = Clock(getattr(dut, signal), period_ns, unit="ns", impl="gpi")
    clock.start(start_high=False)
    return clock


async def reset(dut, clock: Clock, cycles: int = 2, signal: str = "rst") -> None:
    """Hold Amaranth's synchronous ``rst`` high for ``cycles`` rising edges, then release it.

    Ends just after a rising edge with reset low, the design in its reset state. Also settles
    Icarus, where ``always @*`` blocks may not have evaluated at time 0.
    """
    rst = getattr(dut, signal)
    rst.value = 1
    for _ in range(cycles):
        await RisingEdge(clock.signal)
    rst.value = 0
    await RisingEdge(clock.signal)


async def wait_cycles(clock: Clock, cycles: int) -> None:
    """Let ``cycles`` rising edges pass, waking Python about three times whatever ``cycles`` is.

    Returns just after the last of them, like ``cycles`` awaits of ``RisingEdge``.
    """
    if cycles <= 0:
        return
    await clock.cycles(cycles)


async def _settle() -> None:
    # values of this time step after every process (and the bench's own writes) ran
    if not isinstance(current_gpi_trigger(), ReadOnly):
        await ReadOnly()


async def wait_high(signal, clock: Clock, max_cycles: int) -> int:
    """Wait until the registered status output ``signal`` (e.g. ``done``) is 1; return edges waited.

    Wakes Python once when ``signal`` rises instead of once per cycle. Call it just after a
    rising edge of ``clock`` (after ``await RisingEdge(dut.clk)``, possibly having driven inputs,
    or from the read-only phase of that edge). It returns one simulator step after the edge at
    which ``signal`` is seen high, when every register has settled and inputs may be driven, with
    the number of edges that took: 0 if ``signal`` is already high now. Raises TimeoutError
    naming the signal when it stays low for ``max_cycles`` edges, so a hung design fails the
    test instead of hanging it.
    """
    period = get_sim_steps(clock.period, clock.unit)
    start = get_sim_time("step")
    await _settle()
    if int(signal.value) != 1:
        timeout = Timer(period * max_cycles, unit="step")
        if await First(RisingEdge(signal), timeout) is timeout:
            raise TimeoutError(f"{signal._name} stayed low for {max_cycles} cycles")
        # The edge of ``signal`` can be reported before other registers of the same clock edge
        # are updated (Icarus): wait until all of them are.
        await _settle()
    await Timer(1, unit="step")
    return round((get_sim_time("step") - start) / period)
