"""The loss unit (docs/numerics.md section 4): the softmax cross-entropy gradient of one sample
and the training-accuracy argmax. Golden twins: ``ember.golden.softmax_grad`` and
``ember.golden.argmax_first``.

``SoftmaxGradUnit`` does not own the logits: it reads them through a synchronous read port of
the engine's memory and writes the gradients through a write port. Per sample it makes exactly
3N reads (index order 0..N-1, three times) and N writes (index order), which the engine's
counters rely on:

1. pass 1 reads z[0..N-1] and keeps the maximum m and its first index (the argmax);
2. pass 2 reads them again: d = m - z, t = (d * LOG2E_NUM) >> LOG2E_SHIFT,
   e = EXP2_TABLE[fraction bits of t] >> (t >> LOGIT_FRAC_BITS) (0 from a shift of 16),
   S = sum(e);
3. a restoring divider computes r = floor(2**RECIP_BITS / S);
4. pass 3 reads them a third time, recomputes e and writes
   g = saturate_sym16(((e * r + 2**15) >> 16) - 2**15 * [n == label]) to index n.

Passes 1 and 2 are issued back to back, one read per cycle (pass 2's first logit arrives just
after the maximum is final). Pass 3 starts its reads while the divider finishes its last steps,
timed so that r is final when the first exponent reaches the multiplier. A sample takes
``SoftmaxGradUnit.cycles(N)`` = 3N + DIVIDER_STEPS + 6 = 3N + 23 cycles from the ``start``
cycle to the ``done`` cycle, and ``start`` may be raised again in the ``done`` cycle.

Datapath, one logit per cycle (the tag of each read travels with it):

- cycle c: ``rd_en``, ``rd_addr = n`` (issue);
- c+1: ``rd_data`` = z[n]: pass 1 updates the maximum; the logit is registered (the read
  port's data comes through the engine's lane multiplexer: nothing else on that path);
- c+2: ``t`` (a subtraction and a multiplication by a constant) is registered;
- c+3: the exponent e (table and shifter) is registered;
- c+4: pass 2 adds e to S; pass 3 multiplies e * r and registers the write;
- c+5: ``wr_en``, ``wr_addr = n``, ``wr_data = g``.

The unit lives in the ``sync`` domain.
"""

from amaranth.hdl import Array, Const, Module, Mux, Signal, signed
from amaranth.lib import enum, wiring
from amaranth.lib.wiring import In, Out

from ember.spec import (EXP2_FRAC_BITS, EXP2_TABLE, GRAD_BITS, LOG2E_NUM, LOG2E_SHIFT,
                        LOGIT_BITS, LOGIT_FRAC_BITS, MAX_WIDTH, OUT_GRAD_FRAC_BITS, RECIP_BITS)

#: Exponent of a logit equal to the maximum (d = 0): the scale of e and of the probabilities.
EXP2_ONE = EXP2_TABLE[0]
#: Width of an exponent e; a shift by this much or more leaves 0.
EXP2_BITS = EXP2_ONE.bit_length()
#: Largest d = max - z of two Q7.8 logits.
D_MAX = (1 << LOGIT_BITS) - 1
#: Largest base-2 exponent t (8 fraction bits, like the logits).
T_MAX = (D_MAX * LOG2E_NUM) >> LOG2E_SHIFT
#: The maximum always contributes EXP2_ONE, so S >= EXP2_ONE and r = floor(2**RECIP_BITS / S)
#: has at most this many bits; the divider computes only these quotient bits (the higher ones
#: are 0 because 2**RECIP_BITS >> DIVIDER_STEPS < EXP2_ONE <= S).
DIVIDER_STEPS = RECIP_BITS - (EXP2_ONE.bit_length() - 1) + 1
#: The divider's remainder before its first step: the dividend bits above the quotient bits.
DIVIDER_START = (1 << RECIP_BITS) >> DIVIDER_STEPS
#: p = (e * r + 2**(PROB_SHIFT - 1)) >> PROB_SHIFT is a Q0.OUT_GRAD_FRAC_BITS probability.
PROB_SHIFT = RECIP_BITS - OUT_GRAD_FRAC_BITS
#: The gradient range, symmetric: +-GRAD_LIMIT.
GRAD_LIMIT = (1 << (GRAD_BITS - 1)) - 1
#: Cycles from a read's issue to the stage that multiplies by r (see the module docstring).
READ_TO_MULTIPLY = 4

assert DIVIDER_START < EXP2_ONE
assert DIVIDER_STEPS > READ_TO_MULTIPLY


class _Pass(enum.Enum, shape=2):
    """Which pass a read in flight belongs to (NONE: no read)."""
    NONE = 0
    MAX = 1
    SUM = 2
    GRAD = 3


class SoftmaxGradUnit(wiring.Component):
    """Softmax cross-entropy gradient and argmax of one sample, bit-exact with
    ``golden.softmax_grad`` and ``golden.argmax_first``.

    Parameters:

    - ``max_classes``: most outputs N a sample may have (2..spec.MAX_WIDTH); it sets the index
      widths and the width of the exponent sum.

    Ports (I = ceil_log2(max_classes), C = bit_length(max_classes)):

    - ``start`` In(1): one-cycle pulse, ignored while ``busy``. ``classes`` and ``label`` are
      sampled in the ``start`` cycle.
    - ``classes`` In(C): N, the number of logits, 2..max_classes.
    - ``label`` In(I): the sample's class, 0..N-1 (a label >= N subtracts no one-hot).
    - ``rd_addr`` Out(I), ``rd_en`` Out(1): read request for logit ``rd_addr``.
    - ``rd_data`` In(signed(16)): the Q7.8 logit requested in the previous cycle (synchronous
      memory, one cycle of latency). It is sampled only in that cycle.
    - ``wr_addr`` Out(I), ``wr_data`` Out(signed(16)), ``wr_en`` Out(1): write gradient
      ``wr_data`` (Q0.15, two's complement, -32767..32767) to index ``wr_addr``.
    - ``busy`` Out(1): high from the cycle after ``start`` up to, not including, ``done``.
    - ``done`` Out(1): one-cycle pulse, one cycle after the last write.
    - ``predicted`` Out(I): argmax of the logits, the lowest index among equal maxima.
    - ``correct`` Out(1): ``predicted == label``.
      ``predicted`` and ``correct`` are valid from ``done`` until the next ``done``.
    """

    def __init__(self, max_classes=1024):
        if not 2 <= max_classes <= MAX_WIDTH:
            raise ValueError(f"max_classes {max_classes} is outside 2..{MAX_WIDTH} "
                             "(spec.MAX_WIDTH)")
        self.max_classes = max_classes
        index = range(max_classes)
        super().__init__({
            "start": In(1),
            "classes": In(range(max_classes + 1)),
            "label": In(index),
            "rd_addr": Out(index),
            "rd_en": Out(1),
            "rd_data": In(signed(LOGIT_BITS)),
            "wr_addr": Out(index),
            "wr_data": Out(signed(GRAD_BITS)),
            "wr_en": Out(1),
            "busy": Out(1),
            "done": Out(1),
            "predicted": Out(index),
            "correct": Out(1),
        })

    @staticmethod
    def cycles(classes):
        """Cycles from the ``start`` cycle to the ``done`` cycle for N = ``classes``: the start
        cycle, 2N reads of passes 1 and 2, READ_TO_MULTIPLY to bring the last exponent into S,
        the divider steps that do not overlap pass 3, N reads of pass 3, and READ_TO_MULTIPLY + 1
        up to and including the last write; ``done`` is the cycle after it."""
        return (1 + 2 * classes + READ_TO_MULTIPLY + (DIVIDER_STEPS - READ_TO_MULTIPLY)
                + classes + READ_TO_MULTIPLY + 1)

    def elaborate(self, platform):
        m = Module()
        index = range(self.max_classes)

        classes = Signal.like(self.classes)
        label = Signal.like(self.label)
        read_index = Signal(index)
        second_pass = Signal()       # passes 1 and 2 share one run of reads
        last_read = read_index == classes - 1

        # Tags of the reads in flight, one per pipeline stage. Only pass 1 needs a read's
        # index with it (stage 1, the argmax); pass 3 writes its gradients in index order, so
        # they count their own index (grad_index).
        issue_pass = Signal(_Pass)
        s1_pass, s2_pass, s3_pass, s4_pass = (Signal(_Pass, name=f"s{i}_pass")
                                              for i in (1, 2, 3, 4))
        s1_index = Signal(index)
        grad_index = Signal(index)
        m.d.comb += self.rd_en.eq(issue_pass != _Pass.NONE), self.rd_addr.eq(read_index)
        m.d.sync += [
            s1_pass.eq(issue_pass), s1_index.eq(read_index),
            s2_pass.eq(s1_pass), s3_pass.eq(s2_pass), s4_pass.eq(s3_pass),
        ]

        # Stage 1: the logit arrives. Pass 1 keeps the first maximum; it is registered for
        # passes 2 and 3 (the maximum is final when they use it).
        logit = self.rd_data
        logit_max = Signal(signed(LOGIT_BITS))
        argmax = Signal(index)
        with m.If((s1_pass == _Pass.MAX) & ((s1_index == 0) | (logit > logit_max))):
            m.d.sync += logit_max.eq(logit), argmax.eq(s1_index)
        logit_r = Signal(signed(LOGIT_BITS))
        m.d.sync += logit_r.eq(logit)

        # Stage 2: t = (m - z) * log2(e), 8 fraction bits.
        d = Signal(range(D_MAX + 1))
        t = Signal(range(T_MAX + 1))
        m.d.comb += d.eq(logit_max - logit_r)
        m.d.sync += t.eq((d * LOG2E_NUM) >> LOG2E_SHIFT)

        # Stage 3: e = EXP2_TABLE[fraction] >> whole, where t = whole.fraction.
        whole = t[LOGIT_FRAC_BITS:]
        fraction = t[LOGIT_FRAC_BITS - EXP2_FRAC_BITS:LOGIT_FRAC_BITS]
        table = Array(Const(v, EXP2_BITS) for v in EXP2_TABLE)
        shift_bits = (EXP2_BITS - 1).bit_length()
        exp2 = Signal(EXP2_BITS)
        # whole < EXP2_BITS (a power of two) as its high bits, not a comparator's carry chain
        m.d.sync += exp2.eq(Mux(whole[shift_bits:] == 0, table[fraction] >> whole[:shift_bits],
                                0))

        # Stage 4, pass 2: S += e.
        exp_sum = Signal(range(self.max_classes * EXP2_ONE + 1))
        with m.If(s4_pass == _Pass.SUM):
            m.d.sync += exp_sum.eq(exp_sum + exp2)

        # Stage 4, pass 3: p = (e * r + 2**15) >> 16, g = p - 2**15 * [n == label], saturated.
        recip = Signal(DIVIDER_STEPS)
        prob = Signal(range(EXP2_ONE + 1))
        grad = Signal(signed(GRAD_BITS + 1))
        m.d.comb += [
            prob.eq((exp2 * recip + (1 << (PROB_SHIFT - 1))) >> PROB_SHIFT),
            grad.eq(prob - Mux(grad_index == label, 1 << OUT_GRAD_FRAC_BITS, 0)),
        ]
        with m.If(s4_pass == _Pass.GRAD):
            m.d.sync += grad_index.eq(grad_index + 1)
        # p is at most EXP2_ONE = 2**OUT_GRAD_FRAC_BITS, so g lies in -2**15 .. 2**15 and
        # saturates only at its two ends: equalities, not two comparators' carry chains
        assert EXP2_ONE == 1 << OUT_GRAD_FRAC_BITS == GRAD_LIMIT + 1
        m.d.sync += [
            self.wr_en.eq(s4_pass == _Pass.GRAD),
            self.wr_addr.eq(grad_index),
            self.wr_data.eq(Mux(grad == GRAD_LIMIT + 1, GRAD_LIMIT,
                                Mux(grad == -GRAD_LIMIT - 1, -GRAD_LIMIT, grad))),
        ]

        # Restoring divider, r = floor(2**RECIP_BITS / S): one quotient bit per cycle while
        # divider_steps is non-zero. The dividend's remaining bits are all 0.
        remainder = Signal(range(self.max_classes * EXP2_ONE))
        shifted = Signal(len(remainder) + 1)
        divider_steps = Signal(range(DIVIDER_STEPS + 1))
        # one subtractor: the difference's sign is the compare (shifted >= S)
        difference = Signal(signed(len(shifted) + 1))
        m.d.comb += [shifted.eq(remainder << 1), difference.eq(shifted - exp_sum)]
        with m.If(divider_steps != 0):
            m.d.sync += divider_steps.eq(divider_steps - 1)
            with m.If(difference >= 0):
                m.d.sync += remainder.eq(difference), recip.eq((recip << 1) | 1)
            with m.Else():
                m.d.sync += remainder.eq(shifted), recip.eq(recip << 1)

        m.d.sync += self.done.eq(0)
        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [
                        classes.eq(self.classes),
                        label.eq(self.label),
                        read_index.eq(0),
                        grad_index.eq(0),
                        second_pass.eq(0),
                        exp_sum.eq(0),
                        remainder.eq(DIVIDER_START),
                        recip.eq(0),
                    ]
                    m.next = "READ_MAX_SUM"

            with m.State("READ_MAX_SUM"):
                m.d.comb += self.busy.eq(1)
                with m.If(second_pass):
                    m.d.comb += issue_pass.eq(_Pass.SUM)
                with m.Else():
                    m.d.comb += issue_pass.eq(_Pass.MAX)
                m.d.sync += read_index.eq(read_index + 1)
                with m.If(last_read):
                    m.d.sync += read_index.eq(0), second_pass.eq(1)
                    with m.If(second_pass):
                        m.next = "SUM_DRAIN"

            with m.State("SUM_DRAIN"):
                # The last exponent is in stage 4 once stages 1 to 3 are empty; S is final at
                # the end of this cycle, in time for the divider's first step.
                m.d.comb += self.busy.eq(1)
                with m.If((s1_pass == _Pass.NONE) & (s2_pass == _Pass.NONE)
                          & (s3_pass == _Pass.NONE)):
                    m.d.sync += divider_steps.eq(DIVIDER_STEPS)
                    m.next = "DIVIDE"

            with m.State("DIVIDE"):
                # Pass 3 reads start early enough that r is final when the first exponent
                # reaches the multiplier, READ_TO_MULTIPLY cycles after its read.
                m.d.comb += self.busy.eq(1)
                with m.If(divider_steps == READ_TO_MULTIPLY + 1):
                    m.next = "READ_GRAD"

            with m.State("READ_GRAD"):
                m.d.comb += self.busy.eq(1), issue_pass.eq(_Pass.GRAD)
                m.d.sync += read_index.eq(read_index + 1)
                with m.If(last_read):
                    m.next = "WRITE"

            with m.State("WRITE"):
                # Stages 1-4 empty: the last write is on the port in this cycle.
                m.d.comb += self.busy.eq(1)
                with m.If((s1_pass == _Pass.NONE) & (s2_pass == _Pass.NONE)
                          & (s3_pass == _Pass.NONE) & (s4_pass == _Pass.NONE)):
                    m.d.sync += [
                        self.done.eq(1),
                        self.predicted.eq(argmax),
                        self.correct.eq(argmax == label),
                    ]
                    m.next = "IDLE"

        return m
