"""The forward writeback unit: one block of P forward sums, requantized ``drain`` lanes per cycle
(a group) and written to the next layer's input (activation memory) or, for the output layer,
as logits to the gradient memory.

Golden twin: ``ember.golden.requantize(acc, shift, relu)`` -- round_shift by the layer's
shift, then ReLU and saturation to UQ2.6 bytes (hidden layers, relu=True) or saturation to
Q7.8 logits (the output layer).

The unit does not hold the sums: it takes them a group at a time from the head of the MAC
lanes' snapshot (ember_hw.lanes.MacLanes: ``head`` moving down a lane, or ``heads`` moving
down ``drain`` lanes, each cycle ``take`` is high) through the engine's RoundingShifters
(ember_hw.arith: the shared one, and on a build that drains several lanes a cycle one more
per further lane, spec.Build.drain_lanes), so it needs no P-way multiplexer and no shifter of
its own. The sequencer hands a block over with ``start`` and may accumulate the next block
meanwhile; it waits for ``busy`` low before the next hand-over.

`ForwardWriteback(lanes, value_bits, act_addr_bits, grad_addr_bits, shift_bits, drain=1,
round_output=1)`; D = drain lanes a group, a power of two that divides the lanes; R =
round_output, the registers between the shifters' results and the saturation (0 or 1:
ember.dataflow.Pipeline.round_output).

Ports (sync domain):
  start:      In(1) -- take a block: ``last``, ``shift``, ``lanes_on``, ``act_addr`` and
              ``grad_word`` are registered. Only while not ``busy``.
  last:       In(1) -- the output layer: logits into the gradient memory.
  shift:      In(shift_bits) -- the layer's forward shift.
  lanes_on:   In(lanes) -- the lanes that hold outputs (a block may be narrower than P).
  act_addr:   In(act_addr_bits) -- activation byte of lane 0's output (hidden layers).
  grad_word:  In(grad_addr_bits) -- gradient-memory word of the block (output layer).
  busy:       Out(1) -- from the cycle after ``start`` until the last lane is written.
  take:       Out(1) -- shifter i takes the snapshot's lane i with ``take_shift``, and the
              snapshot moves down D lanes (one cycle per group, P / D cycles from the cycle
              after ``start``).
  take_shift: Out(shift_bits).
  rounded:    In(signed(value_bits + 2)).array(D) -- shifter i's result, two cycles after a
              take (saturated and written R cycles later).
  act_wr_en, act_wr_addr, act_wr_data, act_wr_mask: Out -- write the group's activation
              bytes (hidden layers): byte i of the data is lane act_wr_addr + i's, written
              where bit i of the mask is set (the lanes that hold outputs).
  grad_wr_en, grad_wr_word, grad_wr_lane, grad_wr_value, grad_wr_mask: Out -- write the
              group's logits (output layer): logit i is lane grad_wr_lane + i's.

Timing (s: the ``start`` cycle): group g (lanes gD .. gD + D - 1) is taken in cycle s + 2 + g
and written in cycle s + 4 + R + g; ``busy`` is high from s + 1 to s + P / D + 3 + R, so the
next block can be handed over in cycle s + P / D + 4 + R (ember.dataflow.Pipeline.writeback_gap:
4 + R).
"""

from amaranth import Cat, Module, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ember import spec

from .arith import clamp_byte, clamp_signed


class ForwardWriteback(wiring.Component):
    """Requantize and write one block of forward outputs (module docstring)."""

    def __init__(self, lanes, value_bits, act_addr_bits, grad_addr_bits, shift_bits, drain=1,
                 round_output=1):
        if drain < 1 or lanes % drain or drain & (drain - 1):
            raise ValueError(f"the writeback takes a power of two of lanes that divides the "
                             f"{lanes} lanes a cycle, not {drain}")
        if round_output not in (0, 1):
            raise ValueError(f"the writeback registers the shifters' results once or not at "
                             f"all, not {round_output} times")
        self.lanes, self.value_bits, self.drain = lanes, value_bits, drain
        self.round_output = round_output
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
            "rounded": In(signed(value_bits + 2)).array(drain),
            "act_wr_en": Out(1),
            "act_wr_addr": Out(act_addr_bits),
            "act_wr_data": Out(drain * spec.ACT_BITS),
            "act_wr_mask": Out(drain),
            "grad_wr_en": Out(1),
            "grad_wr_word": Out(grad_addr_bits),
            "grad_wr_lane": Out(range(lanes)),
            "grad_wr_value": Out(drain * spec.LOGIT_BITS),
            "grad_wr_mask": Out(drain),
        })

    def elaborate(self, platform):
        m = Module()
        P, D = self.lanes, self.drain
        G, LOGD = P // D, (D - 1).bit_length()
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

        # stage A takes group wp at the snapshot's head into the shifters, stages B1 and B2
        # shift and round it, stage C saturates and writes: the cycle after B2 with the
        # round_output register, or B2's own without (y, y_on, y_lane and c_valid are then
        # B2's results and flags); each stage's first lane and which of its lanes hold
        # outputs travel with it
        c_domain = "sync" if self.round_output else "comb"
        wp = Signal(range(G + 1))
        y = [Signal(signed(self.value_bits + 1), name=f"y{i}") for i in range(D)]
        a_on, b2_on, y_on = Signal(D), Signal(D), Signal(D)
        a_lane, b2_lane, y_lane = (Signal(range(P)) for _ in range(3))
        b_valid, b2_valid, c_valid = Signal(), Signal(), Signal()
        with m.FSM(name="writeback"):
            with m.State("IDLE"):
                m.d.sync += [wp.eq(0), b_valid.eq(0), b2_valid.eq(0)]
                if self.round_output:       # else stage C's flag is B2's (low here)
                    m.d.sync += c_valid.eq(0)
                with m.If(busy):
                    m.next = "LANES"
            with m.State("LANES"):
                with m.If(wp < G):
                    m.d.sync += [a_on.eq(lanes_on[:D]), a_lane.eq(wp << LOGD),
                                 lanes_on.eq(lanes_on >> D), wp.eq(wp + 1)]
                    m.d.comb += self.take.eq(1)
                m.d.sync += [b_valid.eq(wp < G), b2_valid.eq(b_valid), b2_on.eq(a_on),
                             b2_lane.eq(a_lane)]
                m.d[c_domain] += [c_valid.eq(b2_valid), y_on.eq(b2_on), y_lane.eq(b2_lane)]
                m.d[c_domain] += [y[i].eq(self.rounded[i]) for i in range(D)]
                with m.If(c_valid & (y_on != 0)):
                    with m.If(last):
                        m.d.comb += self.grad_wr_en.eq(1)
                    with m.Else():
                        m.d.comb += self.act_wr_en.eq(1)
                # done in stage C's cycle of the last group: no group left before it
                done = wp == G
                for ahead in [b_valid, b2_valid][:1 + self.round_output]:
                    done = done & ~ahead
                with m.If(done):
                    m.d.sync += busy.eq(0)
                    m.next = "IDLE"
        # each lane's byte and logit at their exact widths, side by side
        byte = [Signal(spec.ACT_BITS, name=f"byte{i}") for i in range(D)]
        logit = [Signal(signed(spec.LOGIT_BITS), name=f"logit{i}") for i in range(D)]
        m.d.comb += [b.eq(clamp_byte(v)) for b, v in zip(byte, y)]
        m.d.comb += [n.eq(clamp_signed(v, spec.LOGIT_BITS)) for n, v in zip(logit, y)]
        m.d.comb += [self.act_wr_addr.eq(act_addr + y_lane), self.act_wr_data.eq(Cat(*byte)),
                     self.act_wr_mask.eq(y_on), self.grad_wr_mask.eq(y_on),
                     self.grad_wr_word.eq(grad_word), self.grad_wr_lane.eq(y_lane),
                     self.grad_wr_value.eq(Cat(*logit))]
        return m
