"""A small sequential shift-add multiplier for the engine's few products of two signals that are
needed once per layer or per command (bulk event counts, the ssProp keep count, the bus limit
of the input batch), so that the only combinational multipliers are the MAC lanes' and the loss
unit's.

``SerialMultiplier`` lives in the ``sync`` domain.
"""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out


class SerialMultiplier(wiring.Component):
    """Unsigned product ``a * b``, one bit of ``b`` per cycle.

    Parameters:

    - ``width_a``, ``width_b``: operand widths (at least 1). A step costs one ``width_a``-bit
      adder; a product takes ``width_b`` steps, so ``b`` should be the narrower operand.

    Ports:

    - ``a`` In(width_a), ``b`` In(width_b), ``start`` In(1): ``a`` and ``b`` are sampled in the
      ``start`` cycle. A ``start`` while a product is under way abandons it and starts anew.
    - ``product`` Out(width_a + width_b): ``a * b`` while ``done`` is high.
    - ``done`` Out(1): low from the cycle after ``start`` for ``width_b`` cycles, high again
      ``width_b + 1`` cycles after the ``start`` cycle, and from then on until the next
      ``start``. High from reset, with ``product`` 0.

    Each step adds ``a`` to the upper part of the product register if its lowest bit (the next
    bit of ``b``) is set, then shifts the register right by one: after ``width_b`` steps the
    bits of ``b`` have been shifted out and the register holds the product.
    """

    def __init__(self, width_a, width_b):
        if width_a < 1 or width_b < 1:
            raise ValueError(f"operand widths {width_a}, {width_b} must be at least 1")
        self.width_a = width_a
        self.width_b = width_b
        super().__init__({
            "a": In(width_a),
            "b": In(width_b),
            "start": In(1),
            "product": Out(width_a + width_b),
            "done": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        wb = self.width_b
        multiplicand = Signal(self.width_a)
        # upper part: the partial sum; lower part: the bits of b not yet used
        register = Signal(self.width_a + wb)
        steps_left = Signal(range(wb + 1))

        m.d.comb += [self.product.eq(register), self.done.eq(steps_left == 0)]
        partial = register[wb:] + Mux(register[0], multiplicand, 0)     # width_a + 1 bits
        with m.If(self.start):
            m.d.sync += [multiplicand.eq(self.a), register.eq(self.b), steps_left.eq(wb)]
        with m.Elif(steps_left != 0):
            m.d.sync += [register.eq(Cat(register[1:wb], partial)),
                         steps_left.eq(steps_left - 1)]
        return m
