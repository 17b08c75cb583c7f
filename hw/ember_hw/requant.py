"""The dX requantizer: a layer's raw input gradients dX (DX_BITS, in the scratch memory) become
the layer below's dY (GRAD_BITS, symmetric) with one power-of-two scale for the whole batch.

Golden twin: the input-gradient step of ``ember.golden.GoldenModel.train_batch``:
``shift = max(0, bit_length(max |dX|) - (GRAD_BITS - 1))`` and
``dy_below = saturate_grad(round_shift(dx, shift))``; the shift also enters the update-shift
correction of the layers below (WEIGHT_FRAC_BITS - shift).

The unit keeps the OR of the batch's |dX| while the input-gradient pass writes the entries
(``track``), turns it into the scale (``latch``: a leading-one detector), and saturates each
entry after the engine's shared RoundingShifter (ember_hw.arith) has rounded it by that scale.
The scale depends on max |dX| only through its bit length, and the bit length of the OR of
the magnitudes is the bit length of the largest: so the unit takes ``entries`` values a cycle
(the v2 engine's dX drain, spec.Build.drain_lanes) with no compare between them, and
saturates as many a cycle after as many shifters (the v2 engine's requant phase).
The sequencer owns the loop: it reads the scratch entries in order, feeds them to the shifter
with ``shift`` and writes ``dy`` to the gradient memory.

`DxRequantizer(entries=1, round_output=1)`; R = round_output, the registers between the
shifters' results and the saturation (0 or 1: ember.dataflow.Pipeline.round_output).
Ports (sync domain):
  clear:    In(1) -- the OR of |dX| to 0 (a new layer's pass).
  track:    In(entries), dx: In(signed(DX_BITS)).array(entries) -- entry i of the pass where
            track[i] is set; the OR of |dX| takes it at the end of the cycle.
  latch:    In(1) -- ``shift`` takes the scale of the entries tracked so far (from the next
            cycle on, until the next latch).
  shift:    Out(range(DX_SHIFT_MAX + 1)).
  rounded:  In(signed(DX_BITS + 1)).array(entries) -- round_shift(entry i, shift), from
            shifter i.
  dy:       Out(signed(GRAD_BITS)).array(entries) -- R cycles later (the next cycle, or
            the same with R = 0): saturate_grad of each.
"""

from amaranth import Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ember import spec

from .arith import bit_length, clamp_symmetric


class DxRequantizer(wiring.Component):
    """The batch scale of dX and the saturation to dY (module docstring)."""

    def __init__(self, entries=1, round_output=1):
        if round_output not in (0, 1):
            raise ValueError(f"the requantizer registers the shifters' results once or not "
                             f"at all, not {round_output} times")
        self.entries, self.round_output = entries, round_output
        super().__init__({
            "clear": In(1),
            "track": In(entries),
            "dx": In(signed(spec.DX_BITS)).array(entries),
            "latch": In(1),
            "shift": Out(range(spec.DX_SHIFT_MAX + 1)),
            "rounded": In(signed(spec.DX_BITS + 1)).array(entries),
            "dy": Out(signed(spec.GRAD_BITS)).array(entries),
        })

    def elaborate(self, platform):
        m = Module()
        dx_max = Signal(spec.DX_BITS)       # the OR of |dX| (each 2**(DX_BITS-1) at most)
        tracked = dx_max
        for i, dx in enumerate(self.dx):
            mag = Mux(dx < 0, -dx, dx).as_unsigned()[:spec.DX_BITS]
            tracked = tracked | Mux(self.track[i], mag, 0)
        with m.If(self.clear):
            m.d.sync += dx_max.eq(0)
        with m.Else():
            m.d.sync += dx_max.eq(tracked)
        # max(0, golden.bit_length(max |dX|) - (GRAD_BITS - 1)), the OR's, is the bit length
        # of the OR's bits above the magnitude's: a leading-one detector (a tree) over those
        magnitude_bits = spec.GRAD_BITS - 1
        shift = Signal.like(self.shift)
        with m.If(self.latch):
            m.d.sync += shift.eq(bit_length(dx_max[magnitude_bits:]))
        m.d.comb += self.shift.eq(shift)
        # round_output: a register before the saturation, or the shifter's result itself
        value_domain = "sync" if self.round_output else "comb"
        for i in range(self.entries):
            value = Signal(signed(spec.DX_BITS + 1), name=f"value{i}")
            m.d[value_domain] += value.eq(self.rounded[i])
            m.d.comb += self.dy[i].eq(clamp_symmetric(value, spec.GRAD_BITS))
        return m
