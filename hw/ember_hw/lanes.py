"""The MAC lanes: P multipliers with registered operands and products, P accumulators, and the
snapshot of the accumulators that the writeback and update units read one lane at a time and
the input gradient's dX drain reads ``drain`` lanes at a time.

Golden twin: the integer sums of ``ember.golden`` -- each lane forms one of them, one product
per cycle: a forward output ``x @ W.T`` (GoldenModel._forward), a weight gradient
``dY.T @ A`` (train_batch), a PSG prediction (``golden.psg_predict``) or, summed across the
lanes by the engine, an input gradient ``dY @ W``. The accumulators are as wide as the build's
largest sum (spec.Build.lane_acc_bits), so no sum wraps and the lanes equal the golden model's
exact integers.

`MacLanes(lanes, operand_bits, acc_bits, drain=1)`. Vectors hold lane i at bits
``[i * w, (i + 1) * w)`` (``operand(vector, i)`` and friends pick a lane's slice).

Ports (sync domain):
  a, b:       In(lanes * operand_bits) -- each lane's signed operands, chosen this cycle
              (cycle c); registered at the end of c.
  b_zero:     In(lanes) -- in cycle c: these lanes register 0 instead of their b (their
              product in c + 2 is 0). A synchronous reset of the operand register, not a
              multiplexer on the product: Yosys then packs operand and product registers
              into the iCE40's SB_MAC16.
  products:   Out(lanes * 2 * operand_bits) -- in cycle c + 2: a * b of cycle c (the
              registered products).
  acc_clear:  In(1) -- every accumulator to 0 (at the end of this cycle).
  acc_zero:   In(lanes) -- these accumulators to 0.
  acc_add:    In(lanes) -- these accumulators add this cycle's `products`.
  acc_first:  In(1) -- with acc_add: those accumulators take the products instead of adding
              them (the first product of a sum: no clearing cycle between two sums).
  acc:        Out(lanes * acc_bits) -- the accumulators.
  snap:       In(1) -- the snapshot takes every accumulator (its value at the start of this
              cycle).
  snap_shift: In(1) -- the snapshot moves down one lane (lane i takes lane i + 1's value;
              the top lane keeps its own), so a reader takes lane after lane at ``head``
              with no P-way multiplexer.
  head:       Out(signed(acc_bits)) -- the snapshot's lane 0.
  snap_drain: In(1) -- the snapshot moves down ``drain`` lanes (lane i takes lane i + drain's
              value; the top ``drain`` lanes keep their own), so a reader takes ``drain``
              lanes a cycle at ``heads`` (spec.Build.drain_lanes: the dX drain keeps up with
              a narrow layer's groups on a wide build).
  heads:      Out(signed(acc_bits)).array(drain) -- the snapshot's lanes 0 .. drain - 1.

All registers are reset-less: every phase writes the operands, products and accumulators
before it reads them, and a reset net to thousands of flip-flops only costs routing.
"""

from amaranth import Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out


def lane(vector, i, width):
    """Lane i's `width`-bit signed slice of a lane vector."""
    return vector.word_select(i, width).as_signed()


class MacLanes(wiring.Component):
    """P multiply-accumulate lanes (see the module docstring for the ports and timing).

    lanes:         P.
    operand_bits:  width of each (signed) operand.
    acc_bits:      width of each (signed) accumulator and of the snapshot.
    drain:         the lanes ``snap_drain`` moves and ``heads`` shows (a power of two that
                   divides lanes).
    """

    def __init__(self, lanes, operand_bits, acc_bits, drain=1):
        if drain < 1 or lanes % drain or drain & (drain - 1):
            raise ValueError(f"the snapshot drains a power of two of lanes that divides the "
                             f"{lanes} lanes, not {drain}")
        self.lanes, self.operand_bits, self.acc_bits = lanes, operand_bits, acc_bits
        self.drain = drain
        super().__init__({
            "a": In(lanes * operand_bits),
            "b": In(lanes * operand_bits),
            "b_zero": In(lanes),
            "products": Out(lanes * 2 * operand_bits),
            "acc_clear": In(1),
            "acc_zero": In(lanes),
            "acc_add": In(lanes),
            "acc_first": In(1),
            "acc": Out(lanes * acc_bits),
            "snap": In(1),
            "snap_shift": In(1),
            "head": Out(signed(acc_bits)),
            "snap_drain": In(1),
            "heads": Out(signed(acc_bits)).array(drain),
        })

    def operand_a(self, i):
        """Lane i's slice of the `a` port (to assign)."""
        return self.a.word_select(i, self.operand_bits)

    def operand_b(self, i):
        """Lane i's slice of the `b` port (to assign)."""
        return self.b.word_select(i, self.operand_bits)

    def product(self, i):
        """Lane i's registered product, signed."""
        return lane(self.products, i, 2 * self.operand_bits)

    def accumulator(self, i):
        """Lane i's accumulator, signed."""
        return lane(self.acc, i, self.acc_bits)

    def elaborate(self, platform):
        m = Module()
        P, OPND, ACC, D = self.lanes, self.operand_bits, self.acc_bits, self.drain
        op_a = [Signal(signed(OPND), name=f"op_a{i}", reset_less=True) for i in range(P)]
        op_b = [Signal(signed(OPND), name=f"op_b{i}", reset_less=True) for i in range(P)]
        prod_r = [Signal(signed(2 * OPND), name=f"prod_r{i}", reset_less=True)
                  for i in range(P)]
        acc = [Signal(signed(ACC), name=f"acc{i}", reset_less=True) for i in range(P)]
        snap = [Signal(signed(ACC), name=f"snap{i}", reset_less=True) for i in range(P)]
        # each lane's multiplier is named after its product, prod<i> (the ULX3S floorplan
        # finds the multiplier cells by that name: ember_boards.ulx3s.floorplan_script)
        prod = [Signal(signed(2 * OPND), name=f"prod{i}") for i in range(P)]
        for i in range(P):
            m.d.comb += prod[i].eq(op_a[i] * op_b[i])
            m.d.sync += [op_a[i].eq(lane(self.a, i, OPND)), prod_r[i].eq(prod[i])]
            with m.If(self.b_zero[i]):
                m.d.sync += op_b[i].eq(0)
            with m.Else():
                m.d.sync += op_b[i].eq(lane(self.b, i, OPND))
            with m.If(self.acc_clear | self.acc_zero[i]):
                m.d.sync += acc[i].eq(0)
            with m.Elif(self.acc_add[i]):
                m.d.sync += acc[i].eq(Mux(self.acc_first, 0, acc[i]) + prod_r[i])
            with m.If(self.snap):
                m.d.sync += snap[i].eq(acc[i])
            # one lane down, or `drain` lanes (the same move when drain is 1)
            moves = ([(self.snap_shift | self.snap_drain, 1)] if D == 1 else
                     [(self.snap_shift, 1), (self.snap_drain, D)])
            for move, by in moves:
                if i + by < P:
                    with m.Elif(move):
                        m.d.sync += snap[i].eq(snap[i + by])
            m.d.comb += [self.products.word_select(i, 2 * OPND).eq(prod_r[i]),
                         self.acc.word_select(i, ACC).eq(acc[i])]
        m.d.comb += [self.head.eq(snap[0])] + [self.heads[i].eq(snap[i]) for i in range(D)]
        return m
