"""The forward writeback unit: one block of P forward sums, requantized one lane per cycle and
written to the next layer's input (activation memory) or, for the output layer, as logits to
the gradient memory.

Golden twin: ``ember.golden.requantize(acc, shift, relu)`` -- round_shift by the layer's
shift, then ReLU and saturation to UQ2.6 bytes (hidden layers, relu=True) or saturation to
Q7.8 logits (the output layer).

The unit does not hold the sums: it takes them lane by lane from the head of the MAC lanes'
snapshot (ember_hw.lanes.MacLanes.head, which moves down a lane each cycle ``take`` is high)
through the engine's shared RoundingShifter (ember_hw.arith), so it needs no P-way
multiplexer and no shifter of its own. The sequencer hands a block over with ``start`` and may
accumulate the next block meanwhile; it waits for ``busy`` low before the next hand-over.

`ForwardWriteback(lanes, value_bits, act_addr_bits, grad_addr_bits, shift_bits)`.

Ports (sync domain):
  start:      In(1) -- take a block: ``last``, ``shift``, ``lanes_on``, ``act_addr`` and
              ``grad_word`` are registered. Only while not ``busy``.
  last:       In(1) -- the output layer: logits into the gradient memory.
  shift:      In(shift_bits) -- the layer's forward shift.
  lanes_on:   In(lanes) -- the lanes that hold outputs (a block may be narrower than P).
  act_addr:   In(act_addr_bits) -- activation byte of lane 0's output (hidden layers).
  grad_word:  In(grad_addr_bits) -- gradient-memory word of the block (output layer).
  busy:       Out(1) -- from the cycle after ``start`` until the last lane is written.
  take:       Out(1) -- the shifter takes the snapshot's head with ``take_shift``, and the
              snapshot moves down a lane (one cycle per lane, P cycles from the cycle after
              ``start``).
  take_shift: Out(shift_bits).
  rounded:    In(signed(value_bits + 2)) -- the shifter's result, two cycles after a take.
  act_wr_en, act_wr_addr, act_wr_data: Out -- write one activation byte (hidden layers).
  grad_wr_en, grad_wr_word, grad_wr_lane, grad_wr_value: Out -- write one logit (output layer).

Timing (s: the ``start`` cycle): lane i is taken in cycle s + 2 + i and written in cycle
s + 5 + i; ``busy`` is high from s + 1 to s + P + 4, so the next block can be handed over in
cycle s + P + 5.
"""

from amaranth import Module, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ember import spec

from .arith import clamp_byte, clamp_signed


class ForwardWriteback(wiring.Component):
    """Requantize and write one block of forward outputs (module docstring)."""

    def __init__(self, lanes, value_bits, act_addr_bits, grad_addr_bits, shift_bits):
        self.lanes, self.value_bits = lanes, value_bits
        super().__init__({
            "start": In(1),
            "last": In(1),
            "shift": In(shift_bits),
            "lanes_on": In(lanes),
            "act_addr": In(act_addr_bits),
            "grad_word": In(grad_addr_bits),
            "busy": Out(1),
            "take": Out(1),
            "take_shift": Out(shift_bits),
            "rounded": In(signed(value_bits + 2)),
            "act_wr_en": Out(1),
            "act_wr_addr": Out(act_addr_bits),
            "act_wr_data": Out(spec.ACT_BITS),
            "grad_wr_en": Out(1),
            "grad_wr_word": Out(grad_addr_bits),
            "grad_wr_lane": Out(range(lanes)),
            "grad_wr_value": Out(spec.LOGIT_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        P = self.lanes
        # the block's copy, taken at `start`
        busy, last = Signal(), Signal()
        shift = Signal.like(self.shift)
        lanes_on = Signal(P)
        act_addr = Signal.like(self.act_addr)
        grad_word = Signal.like(self.grad_word)
        with m.If(self.start):
            m.d.sync += [busy.eq(1), last.eq(self.last), shift.eq(self.shift),
                         lanes_on.eq(self.lanes_on), act_addr.eq(self.act_addr),
                         grad_word.eq(self.grad_word)]
        m.d.comb += [self.busy.eq(busy), self.take_shift.eq(shift)]

        # stage A takes lane wp at the snapshot's head into the shifter, stages B1 and B2
        # shift and round it, stage C saturates and writes; each stage's lane and whether it
        # holds an output travel with it
        wp = Signal(range(P + 1))
        y = Signal(signed(self.value_bits + 1))
        a_on, b2_on, y_on = Signal(), Signal(), Signal()
        a_lane, b2_lane, y_lane = (Signal(range(P)) for _ in range(3))
        b_valid, b2_valid, c_valid = Signal(), Signal(), Signal()
        with m.FSM(name="writeback"):
            with m.State("IDLE"):
                m.d.sync += [wp.eq(0), b_valid.eq(0), b2_valid.eq(0), c_valid.eq(0)]
                with m.If(busy):
                    m.next = "LANES"
            with m.State("LANES"):
                with m.If(wp < P):
                    m.d.sync += [a_on.eq(lanes_on[0]), a_lane.eq(wp),
                                 lanes_on.eq(lanes_on >> 1), wp.eq(wp + 1)]
                    m.d.comb += self.take.eq(1)
                m.d.sync += [b_valid.eq(wp < P), b2_valid.eq(b_valid), c_valid.eq(b2_valid),
                             y.eq(self.rounded), b2_on.eq(a_on), b2_lane.eq(a_lane),
                             y_on.eq(b2_on), y_lane.eq(b2_lane)]
                with m.If(c_valid & y_on):
                    with m.If(last):
                        m.d.comb += self.grad_wr_en.eq(1)
                    with m.Else():
                        m.d.comb += self.act_wr_en.eq(1)
                with m.If((wp == P) & ~b_valid & ~b2_valid):
                    m.d.sync += busy.eq(0)
                    m.next = "IDLE"
        m.d.comb += [self.act_wr_addr.eq(act_addr + y_lane), self.act_wr_data.eq(clamp_byte(y)),
                     self.grad_wr_word.eq(grad_word), self.grad_wr_lane.eq(y_lane),
                     self.grad_wr_value.eq(clamp_signed(y, spec.LOGIT_BITS))]
        return m
