"""UART receiver and transmitter for the host link: 8 data bits, no parity, 1 stop bit (8N1).

Both take ``divisor``, the number of clock cycles per bit: ``clk_hz // baud``
(``uart_divisor`` computes and checks it). Bytes go least significant bit first, as on every
PC serial port. The receiver samples each bit in its middle, so sender and receiver may
disagree on the bit time by a few percent.
"""

from amaranth import *
from amaranth.lib import cdc, stream, wiring
from amaranth.lib.wiring import In, Out

from ember import spec

#: Fewest clock cycles per bit: the receiver needs a cycle of margin either side of its
#: mid-bit sample after the synchronizer's delay.
MIN_DIVISOR = 4


def uart_divisor(clk_hz, baud, tolerance=0.02):
    """Cycles per bit for `baud` at `clk_hz` (``clk_hz // baud``).

    Raises ValueError if that is below MIN_DIVISOR or if the truncation makes the real rate
    differ from `baud` by more than `tolerance` (a fraction).
    """
    divisor = clk_hz // baud
    if divisor < MIN_DIVISOR:
        raise ValueError(f"{baud} baud at {clk_hz} Hz is {divisor} cycles per bit; the UART "
                         f"needs at least {MIN_DIVISOR}")
    error = abs(clk_hz / divisor - baud) / baud
    if error > tolerance:
        raise ValueError(f"{baud} baud at {clk_hz} Hz with divisor {divisor} is off by "
                         f"{error:.1%}; at most {tolerance:.1%} is allowed")
    return divisor


def baud_error(clk_hz, baud):
    """The UART's real rate at `clk_hz` (``clk_hz / uart_divisor(clk_hz, baud)``) relative to
    `baud`, minus one: +0.0016 is 0.16 % fast. Raises ValueError as uart_divisor does."""
    return clk_hz / uart_divisor(clk_hz, baud) / baud - 1


def _check_divisor(divisor):
    if not isinstance(divisor, int) or divisor < MIN_DIVISOR:
        raise ValueError(f"UART divisor {divisor!r} must be an integer >= {MIN_DIVISOR} "
                         "(clock cycles per bit)")


class UARTRx(wiring.Component):
    """UART receiver, 8N1.

    Parameter ``divisor``: clock cycles per bit (``clk_hz // baud``), at least MIN_DIVISOR.

    Ports:
      rx:          the serial input pin, idle high; passed through a 2-flip-flop synchronizer.
      o:           received bytes (stream: payload/valid/ready). A byte is offered from the
                   middle of its stop bit until taken.
      overrun:     one-cycle pulse: a byte arrived while the previous one had not been taken;
                   the new byte is dropped (the one on ``o`` stays).
      frame_error: one-cycle pulse: the stop bit was 0; the byte is dropped and the receiver
                   waits for the line to return high (a break) before looking for a start bit.

    A start bit is a low level still low half a bit later; a shorter glitch is ignored.
    """

    rx: In(1, init=1)
    o: Out(stream.Signature(8))
    overrun: Out(1)
    frame_error: Out(1)

    def __init__(self, divisor):
        _check_divisor(divisor)
        self.divisor = divisor
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        line = Signal(init=1)
        m.submodules.rx_sync = cdc.FFSynchronizer(self.rx, line, init=1)

        timer = Signal(range(self.divisor))     # cycles until the next sample
        shifter = Signal(8)                     # data bits, LSB arrives first
        bit_index = Signal(range(8))

        m.d.sync += [self.overrun.eq(0), self.frame_error.eq(0)]
        with m.If(self.o.ready):
            m.d.sync += self.o.valid.eq(0)

        with m.FSM():
            with m.State("IDLE"):
                with m.If(~line):
                    m.d.sync += timer.eq(self.divisor // 2 - 1)
                    m.next = "START"
            with m.State("START"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Elif(line):
                    m.next = "IDLE"             # a glitch, not a start bit
                with m.Else():
                    m.d.sync += [timer.eq(self.divisor - 1), bit_index.eq(0)]
                    m.next = "DATA"
            with m.State("DATA"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Else():
                    m.d.sync += [shifter.eq(Cat(shifter[1:], line)), timer.eq(self.divisor - 1),
                                 bit_index.eq(bit_index + 1)]
                    with m.If(bit_index == 7):
                        m.next = "STOP"
            with m.State("STOP"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Elif(~line):
                    m.d.sync += self.frame_error.eq(1)
                    m.next = "BREAK"
                with m.Else():
                    with m.If(self.o.valid & ~self.o.ready):
                        m.d.sync += self.overrun.eq(1)
                    with m.Else():
                        m.d.sync += [self.o.payload.eq(shifter), self.o.valid.eq(1)]
                    # Back to IDLE half a bit early, so the next start bit is seen on time.
                    m.next = "IDLE"
            with m.State("BREAK"):
                with m.If(line):
                    m.next = "IDLE"
        return m


class UARTTx(wiring.Component):
    """UART transmitter, 8N1.

    Parameter ``divisor``: clock cycles per bit (``clk_hz // baud``), at least MIN_DIVISOR.

    Ports:
      i:  bytes to send (stream). ``ready`` is high while the transmitter is idle and in the
          last cycle of a stop bit; a byte taken in cycle t starts its start bit in cycle t+1,
          so back-to-back bytes take exactly 10 x divisor cycles each.
      tx: the serial output pin, idle high, driven straight from a flip-flop (glitch-free).
    """

    i: In(stream.Signature(8))
    tx: Out(1, init=1)

    def __init__(self, divisor):
        _check_divisor(divisor)
        self.divisor = divisor
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        # Start bit, data LSB first, stop bit; shifting in ones leaves the line idle high.
        shifter = Signal(10, init=(1 << 10) - 1)
        bits_left = Signal(range(11))
        timer = Signal(range(self.divisor))

        # Ready when idle, and in the last cycle of a stop bit: back-to-back bytes.
        m.d.comb += [self.tx.eq(shifter[0]),
                     self.i.ready.eq((bits_left == 0) | ((bits_left == 1) & (timer == 0)))]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [shifter.eq(Cat(C(0, 1), self.i.payload, C(1, 1))),
                         bits_left.eq(10), timer.eq(self.divisor - 1)]
        with m.Elif(bits_left == 0):
            pass
        with m.Elif(timer == 0):
            m.d.sync += [shifter.eq(Cat(shifter[1:], C(1, 1))), bits_left.eq(bits_left - 1),
                         timer.eq(self.divisor - 1)]
        with m.Else():
            m.d.sync += timer.eq(timer - 1)
        return m
