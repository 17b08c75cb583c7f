"""Small real designs that prove the RTL harness (ember_sim.rtl) end to end.

``ByteSummer`` sums the bytes of a byte stream into a 32-bit register. It is the smoke
design of tests/test_rtl_harness.py and the speed probe of ember_sim.speed: small enough to
build in seconds, but with a real valid/ready handshake (the sink stalls on a fixed pattern)
so a bench that ignores ``ready`` computes the wrong sum.
"""

from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

TOTAL_BITS = 32


class ByteSummer(wiring.Component):
    """Sum of the bytes accepted on a stream, with a clear and a stall pattern.

    Parameters
    ----------
    stall_period : int
        The sink refuses one cycle in every ``stall_period`` (``ready`` low), free-running from
        reset; 0 never stalls. Makes backpressure visible to benches.

    Ports (Verilog names in brackets; the ``sync`` domain becomes ``clk``/``rst``)
    -----
    i : In(stream.Signature(8))  [``i__payload``, ``i__valid``, ``i__ready``]
        A byte is accepted in a cycle where ``valid`` and ``ready`` are both high.
        ``ready`` is low while ``clear`` is high and on the stall cycles.
    clear : In(1)
        Zeroes ``total`` and ``count`` on the next clock edge; no byte is accepted meanwhile.
    total : Out(32)
        Sum modulo 2**32 of the accepted bytes, updated one cycle after acceptance.
    count : Out(32)
        Number of accepted bytes, same timing as ``total``.
    """

    i: In(stream.Signature(8))
    clear: In(1)
    total: Out(TOTAL_BITS)
    count: Out(TOTAL_BITS)

    def __init__(self, stall_period=4):
        if stall_period < 0 or stall_period == 1:
            raise ValueError(
                f"stall_period={stall_period} would never accept a byte; use 0 (no stall) or >= 2")
        self.stall_period = stall_period
        super().__init__()

    def elaborate(self, platform):
        m = Module()

        if self.stall_period:
            phase = Signal(range(self.stall_period))
            m.d.sync += phase.eq(phase + 1)
            with m.If(phase == self.stall_period - 1):
                m.d.sync += phase.eq(0)
            stalled = phase == self.stall_period - 1
        else:
            stalled = 0

        m.d.comb += self.i.ready.eq(~self.clear & ~stalled)

        with m.If(self.clear):
            m.d.sync += [self.total.eq(0), self.count.eq(0)]
        with m.Elif(self.i.valid & self.i.ready):
            m.d.sync += [
                self.total.eq(self.total + self.i.payload),
                self.count.eq(self.count + 1),
            ]
        return m


def byte_sum_reference(byte_values):
    """What ``ByteSummer.total`` holds after accepting ``byte_values`` (the golden model)."""
    return sum(byte_values) % (1 << TOTAL_BITS)
