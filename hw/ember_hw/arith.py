"""The engine's arithmetic: rounding shift, saturation and sums, as the golden model defines them.

Golden twins (host/ember/golden.py): ``round_shift`` (ties away from zero), ``saturate`` (signed,
symmetric and unsigned) and, for the component, ``requantize``'s shift and the SGD update's
``round_shift(g, shift)``.

The functions build combinational logic from Amaranth values; `RoundingShifter` is the one
registered shifter the engine shares between its forward writeback, its dX requantizer and its
update unit (they never run at the same time).

`RoundingShifter(value_bits, max_shift, finish_registered=False)`:

Ports:
  en:      In(1) -- take `value` and `shift` in this cycle.
  value:   In(signed(value_bits)).
  shift:   In(range(max_shift + 1)).
  twice:   Out(signed(value_bits + 2)) -- stage 1, the cycle after `en`:
           round_shift_twice(value), whose sign is the value's (the update unit's PSG step
           takes the gradient's sign from it). Two bits wider than the value: 2 * value - 1
           of the most negative value needs them.
  out:     Out(signed(value_bits + 2)) -- golden.round_shift(value, shift), two cycles after
           `en`. Stage 2's register holds the shifted value, and `out` adds its rounding
           (plus one, halved) after it; with finish_registered, stage 2 holds `out` itself,
           so no carry chain follows the register (for users that saturate and write it in
           the same cycle, engine v2's narrow builds: dataflow.Pipeline.round_output 0).

Both stages hold their values while `en` is low (stage 2 recomputes from stage 1 every cycle,
so `out` stays valid as long as no new value is taken). The registers are reset-less: every
user takes a value before it reads the result.
"""

from amaranth import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2


def bits_for(limit):
    """Bits of an unsigned signal that holds 0..limit (at least 1)."""
    return max(1, int(limit).bit_length())


def round_shift(value, shift, width):
    """Round to nearest, ties away from zero, then arithmetic right shift by `shift` (a
    signal): golden.round_shift, (value + 2**(shift-1) - (value < 0)) >> shift, for every
    shift (0 is the identity; from width + 1 on the result is 0). `value` is signed and
    `width` bits wide; the result is signed(width + 2).

    Computed without the 2**(shift-1) term (no second shifter, no test of shift == 0) as
    ((2*value - neg) >> shift) + 1, halved: for shift >= 1 that equals
    floor((value - neg + 2**(shift-1)) / 2**shift), because 2*value - neg and
    2*(value - neg) differ by one below an even number and so by no multiple of 2**shift;
    for shift 0 it is (2*value - neg + 1) >> 1 = value."""
    return round_shift_finish(round_shift_twice(value) >> shift)


def round_shift_twice(value):
    """The first step of round_shift: 2*value - (value < 0), signed(len(value) + 2) (one bit
    less holds it for every value but the most negative)."""
    value = value.as_signed()
    return Cat(Const(0, 1), value).as_signed() - value[-1].as_unsigned()


def round_shift_finish(shifted):
    """The last step of round_shift, from round_shift_twice(value) >> shift: plus one, halved."""
    return (shifted + 1) >> 1


def tree_sum(values):
    """The sum of `values` as a balanced tree of adders (log2(n) adders deep, where Python's
    sum() would chain n of them)."""
    values = list(values)
    while len(values) > 1:
        values = [values[i] + values[i + 1] if i + 1 < len(values) else values[i]
                  for i in range(0, len(values), 2)]
    return values[0]


def pipelined_tree_sum(m, values, stages, shape, name):
    """The sum of `values` as a balanced adder tree cut into `stages` registered levels
    (sync domain, reset-less): each level sums groups of its inputs (2**ceil(levels left /
    stages left) each) into registers, so the sum is in the last register `stages` cycles
    after `values`. Lets P lanes' products meet in a tree whose first level sums neighbours
    near them. `shape` is every register's (wide enough for the whole sum); returns the last
    register (with `stages` 0: the sum itself, combinational)."""
    values = list(values)
    if stages == 0:
        total = Signal(shape, name=name)
        m.d.comb += total.eq(tree_sum(values))
        return total
    for stage in range(stages):
        per = 1 << -(-ceil_log2(len(values)) // (stages - stage))
        groups = [values[i:i + per] for i in range(0, len(values), per)]
        sums = [Signal(shape, name=f"{name}{stage}_{i}", reset_less=True)
                for i in range(len(groups))]
        m.d.sync += [r.eq(tree_sum(g)) for r, g in zip(sums, groups)]
        values = sums
    return values[0]


def below(value, limit):
    """``value < limit`` for an unsigned `value` and an unsigned `limit` (a signal or a
    constant), formed at the narrower width: Yosys compares at the wider operand's width with
    a carry chain, a logic cell a bit on the iCE40, even where the bits above `limit`'s need
    only be zero. A constant power of two is a test of `value`'s high bits alone."""
    value = value.as_unsigned()
    if isinstance(limit, int):
        if limit <= 0:
            return Const(0, 1)
        if limit >= 1 << len(value):
            return Const(1, 1)
        bits = limit.bit_length()
        if limit & (limit - 1) == 0:
            return value[bits - 1:] == 0
        return (value[bits:] == 0) & (value[:bits] < limit)
    limit = limit.as_unsigned()
    if len(value) <= len(limit):
        return value < limit
    return (value[len(limit):] == 0) & (value[:len(limit)] < limit)


def bit_length(value):
    """golden.bit_length of an unsigned `value` (0 for 0), as a tree: the high half's length
    plus its offset if it has a set bit, else the low half's, log2 of the width deep (a chain
    of ifs over the bits is as deep as the value is wide)."""
    value = value.as_unsigned()
    n = len(value)
    if n <= 1:
        return value if n else Const(0, 1)
    half = 1 << (ceil_log2(n) - 1)
    high, low = value[half:], value[:half]
    return Mux(high != 0, half + bit_length(high), bit_length(low))


def popcount(word):
    """The number of set bits of `word`, as an adder tree."""
    return tree_sum([word[i] for i in range(len(word))])


def clamp_signed(value, bits):
    """`value` (signed) saturated to signed(bits): golden.saturate(value, bits). By its top
    bits rather than two comparators: it fits unless the bits from `bits - 1` up are not all
    equal to its sign."""
    value = value.as_signed()
    if len(value) <= bits:
        return value
    top = value[bits - 1:]
    fits = (top == 0) | (top == (1 << len(top)) - 1)
    lim = (1 << (bits - 1)) - 1
    return Mux(fits, value[:bits].as_signed(),
               Mux(value[-1], Const(-lim - 1, signed(bits)), Const(lim, signed(bits))))


def clamp_symmetric(value, bits):
    """`value` (signed) saturated to +-(2**(bits-1) - 1): golden.saturate(value, bits,
    signed="symmetric") (gradients have no -2**(bits-1))."""
    clamped = clamp_signed(value, bits)
    lim = (1 << (bits - 1)) - 1
    return Mux(clamped == -lim - 1, Const(-lim, signed(bits)), clamped)


def clamp_byte(value):
    """`value` (signed) saturated to 0..255: golden.saturate(value, 8, signed=False)."""
    value = value.as_signed()
    return Mux(value[-1], 0, Mux(value[8:] != 0, 255, value[:8]))


class RoundingShifter(wiring.Component):
    """golden.round_shift in two register stages (see the module docstring for the ports).

    value_bits: width of the widest value a user shifts.
    max_shift:  the largest shift a user asks for (the result is 0 from value_bits + 1 on).
    """

    def __init__(self, value_bits, max_shift, finish_registered=False):
        self.value_bits, self.max_shift = value_bits, max_shift
        self.finish_registered = finish_registered
        super().__init__({
            "en": In(1),
            "value": In(signed(value_bits)),
            "shift": In(range(max_shift + 1)),
            "twice": Out(signed(value_bits + 2)),
            "out": Out(signed(value_bits + 2)),
        })

    def elaborate(self, platform):
        m = Module()
        # (the stage registers are plain Signals rather than the ports themselves so that
        # they can be reset-less)
        twice = Signal(signed(self.value_bits + 2), reset_less=True)
        shift = Signal(range(self.max_shift + 1), reset_less=True)
        shifted = Signal(signed(self.value_bits + 2), reset_less=True)
        with m.If(self.en):
            m.d.sync += [twice.eq(round_shift_twice(self.value)), shift.eq(self.shift)]
        m.d.comb += self.twice.eq(twice)
        if self.finish_registered:
            m.d.sync += shifted.eq(round_shift_finish(twice >> shift))
            m.d.comb += self.out.eq(shifted)
        else:
            m.d.sync += shifted.eq(twice >> shift)
            m.d.comb += self.out.eq(round_shift_finish(shifted))
        return m
