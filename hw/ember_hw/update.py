"""The update unit: one weight word's P lanes updated from the MAC lanes' gradients, one lane
per cycle; only the lanes whose weight changes are written.

Golden twins: ``ember.golden.sgd_update(w, g, shift)`` -- W - round_shift(G, shift),
saturated to int16 -- and, in PSG mode, ``ember.golden.sign_update(w, sign, step_shift)`` --
W - sign(G) * 2**step_shift, saturated (the sign of the lane's accumulator: the prediction
where it was confident, the recomputed gradient elsewhere).

The unit holds neither the gradients nor the weight word: it takes the gradient lane by lane at
the head of the MAC lanes' snapshot (ember_hw.lanes.MacLanes.head, which moves down a lane each
cycle ``take`` is high) through the engine's shared RoundingShifter (ember_hw.arith), and the
old weights from the engine's weight-word register, which it loads (``word_load``) and moves
down a lane per cycle (``word_shift``), reading its bottom lane (``old_weight``); the engine
shares that register with the bus's weight reads. The sequencer hands a word over with
``start`` and accumulates the next one meanwhile; it waits for ``busy`` low before the next
hand-over.

`UpdateUnit(lanes, value_bits, addr_bits, live_bits, step_bits)`.

Ports (sync domain):
  start:      In(1) -- take a word: ``lanes_on``, ``addr``, ``shift``, ``skip`` and ``live``
              are registered. Only while not ``busy``.
  lanes_on:   In(lanes) -- the lanes to update (kept outputs of the block).
  addr:       In(addr_bits) -- the weight word (and Out: the registered copy, for the read
              and the writes: ``word_addr``).
  shift:      In(range(spec.UPDATE_SHIFT_MAX + 1)) -- SGD's shift.
  skip:       In(lanes) -- PSG: the confident lanes, each of which skipped ``live`` full MACs.
  live:       In(live_bits).
  psg:        In(1) -- sign update (a setting: constant during a command).
  step_shift: In(step_bits) -- the sign update's step, 2**step_shift.
  busy:       Out(1) -- from the cycle after ``start`` until the last lane is written.
  rd_en:      Out(1) -- read weight word ``word_addr`` (its data the next cycle);
  rd_lanes:   Out(lanes) -- in that cycle: the lanes updated (weight_reads counts them).
  word_load:  Out(1) -- the engine's word register takes the read data; word_shift: Out(1) --
              it moves down a lane; old_weight: In(signed(WEIGHT_BITS)) -- its bottom lane.
  take, take_shift: Out -- the shifter takes the snapshot's head with this shift, and the
              snapshot moves down a lane.
  twice, rounded: In(signed(value_bits + 2)) -- the shifter's stage 1 (its sign is the
              gradient's) and result.
  skipped:    Out(live_bits) -- PSG: full MACs a confident lane skipped, counted in the
              cycle it is taken (skip_psg).
  wr_en, wr_lane, wr_value: Out -- write the new weight into one lane of ``word_addr``.

Timing (s: the ``start`` cycle): the read in s + 2, the word register loaded in s + 3, lane i
taken in s + 4 + i and written in s + 8 + i if it changed; ``busy`` is high from s + 1 to
s + P + 7, so the next word can be handed over in s + P + 8. The weight memory is never read
after its first write of a word (lane 0's write comes after the read), which the single-port
SPRAM needs.
"""

from amaranth import Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ember import spec

from .arith import clamp_signed


class UpdateUnit(wiring.Component):
    """SGD or sign update of one weight word (module docstring)."""

    def __init__(self, lanes, value_bits, addr_bits, live_bits, step_bits):
        self.lanes, self.value_bits = lanes, value_bits
        W = spec.WEIGHT_BITS
        super().__init__({
            "start": In(1),
            "lanes_on": In(lanes),
            "addr": In(addr_bits),
            "shift": In(range(spec.UPDATE_SHIFT_MAX + 1)),
            "skip": In(lanes),
            "live": In(live_bits),
            "psg": In(1),
            "step_shift": In(step_bits),
            "busy": Out(1),
            "word_addr": Out(addr_bits),
            "rd_en": Out(1),
            "rd_lanes": Out(lanes),
            "word_load": Out(1),
            "word_shift": Out(1),
            "old_weight": In(signed(W)),
            "take": Out(1),
            "take_shift": Out(range(spec.UPDATE_SHIFT_MAX + 1)),
            "twice": In(signed(value_bits + 2)),
            "rounded": In(signed(value_bits + 2)),
            "skipped": Out(live_bits),
            "wr_en": Out(1),
            "wr_lane": Out(range(lanes)),
            "wr_value": Out(W),
        })

    def elaborate(self, platform):
        m = Module()
        P, W = self.lanes, spec.WEIGHT_BITS
        # the word's copy, taken at `start`
        busy = Signal()
        lanes_on = Signal(P)
        addr = Signal.like(self.addr)
        shift = Signal.like(self.shift)
        skip = Signal(P)
        live = Signal.like(self.live)
        with m.If(self.start):
            m.d.sync += [busy.eq(1), lanes_on.eq(self.lanes_on), addr.eq(self.addr),
                         shift.eq(self.shift), skip.eq(self.skip), live.eq(self.live)]
        m.d.comb += [self.busy.eq(busy), self.word_addr.eq(addr), self.take_shift.eq(shift),
                     self.rd_lanes.eq(lanes_on)]

        # Stage A takes lane `taken` of the snapshot and of the weight word, stages B1 and B2
        # shift and round the gradient (or take the PSG step, by the gradient's sign), stage C
        # subtracts and saturates, stage D writes the new weight into its lane if it changed.
        # Each stage's old weight and whether its lane is updated travel with it.
        taken = Signal(range(P + 1))
        a_old, b2_old, b_old = (Signal(signed(W), name=n) for n in ("a_old", "b2_old", "b_old"))
        a_on, b2_on, b_on = Signal(), Signal(), Signal()
        b2_pos, b2_neg = Signal(), Signal()         # the gradient's sign, in stage B2
        b_valid, b2_valid, c_valid = Signal(), Signal(), Signal()
        # the amount to subtract, saturated to WEIGHT_BITS + 2 bits: from a weight in
        # WEIGHT_BITS, any larger amount saturates the new weight just the same, and stage C's
        # subtractor stays short
        DELTA = W + 2
        b_delta = Signal(signed(DELTA))
        c_lane = Signal(range(P))           # the lane in stage C
        d_write = Signal()                  # stage D: write d_value into lane d_lane
        d_value = Signal(W, reset_less=True)
        d_lane = Signal(range(P))
        m.d.sync += d_write.eq(0)
        m.d.comb += [self.wr_en.eq(d_write), self.wr_lane.eq(d_lane), self.wr_value.eq(d_value)]
        with m.FSM(name="update"):
            with m.State("IDLE"):
                with m.If(busy):
                    m.next = "READ"
            with m.State("READ"):
                m.d.comb += self.rd_en.eq(1)
                m.d.sync += [taken.eq(0), b_valid.eq(0), b2_valid.eq(0), c_valid.eq(0),
                             c_lane.eq(0)]
                m.next = "LATCH"
            with m.State("LATCH"):
                m.d.comb += self.word_load.eq(1)
                m.next = "LANES"
            with m.State("LANES"):
                # stage A
                with m.If(taken < P):
                    m.d.comb += [self.word_shift.eq(1), self.take.eq(1)]
                    m.d.sync += [a_old.eq(self.old_weight), a_on.eq(lanes_on[0]),
                                 lanes_on.eq(lanes_on >> 1), skip.eq(skip >> 1),
                                 taken.eq(taken + 1)]
                    with m.If(skip[0]):
                        # a confident lane skipped the full MAC of every live sample
                        m.d.comb += self.skipped.eq(live)
                m.d.sync += b_valid.eq(taken < P)
                # stage B1: the shifter's first stage
                m.d.sync += [b2_old.eq(a_old), b2_on.eq(a_on), b2_valid.eq(b_valid),
                             b2_pos.eq(self.twice > 0), b2_neg.eq(self.twice < 0)]
                # stage B2: the amount to subtract
                step = (Const(1, unsigned(W)) << self.step_shift)[:W]
                sign_step = Mux(b2_pos, step, 0) - Mux(b2_neg, step, 0)
                m.d.sync += [b_delta.eq(Mux(self.psg, sign_step,
                                            clamp_signed(self.rounded, DELTA))),
                             b_old.eq(b2_old), b_on.eq(b2_on), c_valid.eq(b2_valid)]
                # stage C: the new weight, saturated; written only if it changed
                new = Signal(signed(DELTA + 1))
                m.d.comb += new.eq(b_old - b_delta)
                newsat = clamp_signed(new, W)
                changed = b_on & (newsat != b_old)
                with m.If(c_valid):
                    m.d.sync += [d_write.eq(changed), d_value.eq(newsat[:W]),
                                 d_lane.eq(c_lane), c_lane.eq(c_lane + 1)]
                with m.If((taken == P) & ~b_valid & ~b2_valid):
                    m.next = "WRITE"
            with m.State("WRITE"):
                # stage D of the last lane
                m.d.sync += busy.eq(0)
                m.next = "IDLE"
        return m
