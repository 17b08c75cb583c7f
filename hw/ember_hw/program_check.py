"""The program check: engine v2's program memory checked before a command starts.

Golden twin: ``ember.dataflow.verify_verdict`` (``verify`` with the check's name). The unit
accepts exactly the programs it accepts and refuses the others naming the same phase and the
same check of ``dataflow.VERIFY_CHECKS``, so that a hostile host's program is refused before
anything on the device changes (docs/architecture.md, section 2b). The limits are
``dataflow.limits(kind, build)``, the one table the core's loop nest takes too.

It is built small, to sit beside the engine on an iCE40UP5K: the phase's words are read one
a cycle through the program memory's read port, as they are needed (nothing but a phase's
header fields and a generator's running sums is held), and one SerialMultiplier makes every
product. Per generator the levels are walked innermost first with R = 0: the stride is
``stride_i = delta_i + R`` (decode's recovery); at a level of effective bound n_i > 1 (the
run-time levels at their largest, run_time_bounds) the product ``p = (n_i - 1) * stride_i``
is added to R and to the reach above the base or below it, and the range is refused as soon
as the reach leaves 0 .. limit - 1. The channel count of a select phase is multiplied up level
by level and refused once it passes N; the kept channels' weight offset (N - 1) * K is one
product per kept phase. The checks of a phase raise flags; at its end the first flag in
verify's order is the verdict, so a range fault of one generator and a run-time stride of a
later one are reported as verify reports them.

Widths (why every register is narrow): while no range fault is found, the reach above and
below the base stays in 0 .. limit - 1, and a product p >= limit is a range fault by itself
(from any base in 0 .. limit - 1 it leaves the range), so the reach registers hold
limit_bits + 1 bits and a sign. R is held exactly while -2**EXACT_BITS <= R < 2**EXACT_BITS (33: a
delta is 32 bits, and this is the bits above EXACT_BITS all equal to the sign); past that
it is *lost*, and then, by induction over the outer levels (R' = n R + (n - 1) delta with
n >= 1 and |delta| <= 2**31), |R| stays >= 2**33, so every stride outside is nonzero and
above every limit (< 2**32): a run-time level's stride is not 0 and a counting level is out
of range, which is what verify finds with exact integers.

The read data is registered READ_STAGES times before any check uses it (the program memory's
output is a long net on the ULX3S: it also feeds the core's loader), so a word is used
READ_STAGES + 1 cycles after its address; the walk waits for it.

Timing: ``cycles = 3 + sum over the phases checked of (116 + 17 * products)`` from the start
cycle to the done cycle, products being the phase's multiplications: a select phase's outer
bounds other than 1 (until the count passes N), each generator's levels with an effective
bound of 2 or more and a nonzero stride (while its R is exact, a range fault or not: a later
run-time level's stride needs R), and a kept phase's (N - 1) * K (unless a range fault came
first). 116 = 4 header cycles + 3 per level's bound + 4 generators x (3 for the base + 4 per
level + 1) + 1 verdict (86 + 30 x READ_STAGES: one wait per read that has no read before it in
flight); 17 = the multiplier's start and its 16 steps. A phase refused by its header, kept
list or bounds ends after its bounds; the end phase takes 3. Any program: at most
3 + 541 cycles per phase (116 + 17 x 25 products).
"""

from amaranth import Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ember import dataflow, spec
from ember.program import BOUND_BITS, Nest

from .serial_mul import SerialMultiplier

#: R (the sum of the inner levels' products of a generator) is held exactly while in
#: -2**EXACT_BITS .. 2**EXACT_BITS - 1 (module docstring: a lost R is at least this large).
EXACT_BITS = spec.BUS_DATA_BITS + 1
#: The flags of a phase's checks, in verify's order (VERIFY_CHECKS after "end" and "kind").
PHASE_CHECKS = dataflow.VERIFY_CHECKS[2:]
CHECK_INDEX = {name: i + 1 for i, name in enumerate(dataflow.VERIFY_CHECKS)}
#: Registers between the program memory's read data and the checks (module docstring: the
#: timing). The walk issues a read's successor in the cycle after it, so it needs at least one.
READ_STAGES = 1
assert READ_STAGES >= 1


def run_time_levels(kind):
    """dict level -> what the core bounds it by at run time in a phase of `kind`
    (dataflow.run_time_bounds): None for the kept count (at most the layer's N), else the
    bound (PSG's passes)."""
    levels = dataflow.LEVELS
    probe = Nest((1,) * levels, {g: 0 for g in dataflow.GENERATORS},
                 {g: (0,) * levels for g in dataflow.GENERATORS})
    kept = -1                   # the select phase's N, seen in what run_time_bounds returns
    select = dataflow.Phase("select", probe, outputs=kept)
    return {level: None if bound == kept else bound
            for level, bound in dataflow.run_time_bounds(dataflow.Phase(kind, probe),
                                                         select).items()}


class ProgramCheck(wiring.Component):
    """Checks engine v2's program memory against `build` (module docstring).

    build: spec.Build -- its memory sizes (dataflow.limits), program memory
    (Build.program_words), lanes, widest layer and layers.

    Ports (sync domain):

      start:   In(1) -- check the program that begins at word `base` (ignored while busy).
      base:    In(range(build.program_words)) -- its first word, sampled with start (0 for
               TRAIN and EPOCH, INFER_PROGRAM for INFER and EVALUATE).
      rd_addr: Out(ceil_log2(build.program_words)) -- the program word to read;
      rd_data: In(32) -- the word at the rd_addr of the cycle before (a synchronous read
               port); registered READ_STAGES times inside.
      busy:    Out(1) -- from the cycle after start until done (the done cycle included).
      done:    Out(1) -- one cycle: the verdict.
      ok:      Out(1) -- with done: dataflow.verify_verdict would return None.
      check:   Out -- with done: 0 if ok, else 1 + the index in dataflow.VERIFY_CHECKS of
               the failed check.
      phase:   Out -- with done and not ok: the failing phase's index.
    """

    def __init__(self, build):
        self.build = build
        self.limits = {kind: dataflow.limits(kind, build) for kind in dataflow.ADDRESSED}
        largest = max(max(lim.values()) for lim in self.limits.values())
        # a lost R's strides are at least 2**EXACT_BITS - 2**31 (module docstring)
        if largest >= 1 << spec.BUS_DATA_BITS:
            raise ValueError(f"a limit of {largest} does not fit {spec.BUS_DATA_BITS} bits")
        self.limit_bits = largest.bit_length()
        super().__init__({
            "start": In(1),
            "base": In(range(build.program_words)),
            "rd_addr": Out(ceil_log2(build.program_words)),
            "rd_data": In(spec.BUS_DATA_BITS),
            "busy": Out(1),
            "done": Out(1),
            "ok": Out(1),
            "check": Out(range(len(dataflow.VERIFY_CHECKS) + 1)),
            "phase": Out(range(build.program_words // dataflow.PHASE_WORDS + 1)),
        })

    def _kind_tables(self, m, kind_field, kind, level, gen, outputs):
        """What the phase's kind decides, as signals: whether the header's kind is known,
        whether the phase is a kept one, whether `level` is bounded at run time and by what,
        and generator `gen`'s limit and the offset derived_reach adds to its top."""
        bld = self.build
        KINDS = dataflow.KINDS
        GENS = dataflow.GENERATORS
        kept_kinds = [KINDS[k] for k in dataflow.KEPT_LEVEL]
        LB = self.limit_bits
        kind_known = Signal()
        m.d.comb += kind_known.eq(0)
        with m.Switch(kind_field):
            for code in dataflow.build_kinds(bld).values():
                with m.Case(code):
                    m.d.comb += kind_known.eq(1)
        is_kept = Signal()
        m.d.comb += is_kept.eq(0)
        with m.Switch(kind):
            for code in kept_kinds:
                with m.Case(code):
                    m.d.comb += is_kept.eq(1)

        # what the core bounds at run time: whether the level is one, and its largest bound
        run_time = Signal()
        run_time_bound = Signal(BOUND_BITS)
        m.d.comb += [run_time.eq(0), run_time_bound.eq(0)]
        with m.Switch(kind):
            for name, code in KINDS.items():
                if name == "end" or not run_time_levels(name):
                    continue
                with m.Case(code):
                    for lv, most in run_time_levels(name).items():
                        with m.If(level == lv):
                            m.d.comb += [run_time.eq(1),
                                         run_time_bound.eq(outputs if most is None else most)]

        # the generator's limit and the offset derived_reach adds to its top
        limit = Signal(LB)
        offset = Signal(range(max(bld.max_width, bld.lanes) + 1))
        m.d.comb += [limit.eq(0), offset.eq(0)]
        with m.Switch(kind):
            for name, code in KINDS.items():
                if name == "end":
                    continue
                with m.Case(code):
                    with m.Switch(gen):
                        for g_i, g in enumerate(GENS):
                            with m.Case(g_i):
                                m.d.comb += limit.eq(self.limits[name][g])
                                # derived_reach: the kept channel's dY word g + (N - 1), the
                                # dX drain's o + (P - 1), the loss unit's a + (N - 1); the kept
                                # weight w + (N - 1) * K is a product (KEPT_WEIGHTS)
                                if name in dataflow.KEPT_LEVEL and g == "g":
                                    m.d.comb += offset.eq(outputs - 1)
                                if name == "input_grad" and g == "o":
                                    m.d.comb += offset.eq(bld.lanes - 1)
                                if name == "loss" and g == "a":
                                    m.d.comb += offset.eq(outputs - 1)

        return kind_known, is_kept, run_time, run_time_bound, limit, offset

    def _verdict(self, m, check):
        """The check's answer in this cycle: `done`, and ok or the failed check's index."""
        m.d.comb += [self.done.eq(1), self.ok.eq(check is None),
                     self.check.eq(0 if check is None else CHECK_INDEX[check])]

    def _registered_word(self, m):
        """The program word the checks take: the read data, READ_STAGES registers later."""
        word = self.rd_data
        for n in range(1, READ_STAGES + 1):
            later = Signal.like(self.rd_data, name=f"word{n}", reset_less=True)
            m.d.sync += later.eq(word)
            word = later
        return word

    def _wait_for_read(self, m, name, then, successor=()):
        """The FSM states of the READ_STAGES cycles after a read's address before its word
        is in the registered word, then state `then`; `successor`: the next read's address,
        issued in the first of them (the cycle after)."""
        for n in range(1, READ_STAGES + 1):
            with m.State(f"{name}_READ{n}"):
                m.d.comb += self.busy.eq(1)
                if n == 1:
                    m.d.comb += list(successor)
                m.next = f"{name}_READ{n + 1}" if n < READ_STAGES else then

    def _field(self, name):
        """Header field `name` of the word read READ_STAGES + 1 cycles before."""
        _, off, width = dataflow.HEADER_FIELDS[name]
        return self._word[off:off + width]

    def _at_least(self, value, limit):
        """value >= limit with limit < 2**limit_bits: the bits above ORed, the rest compared."""
        LB = self.limit_bits
        return (value[LB:] != 0) | (value[:LB] >= limit)

    def _bound_at(self, level):
        """Level `level`'s bound in the bound word read READ_STAGES + 1 cycles before."""
        return Mux(level[0], self._word[BOUND_BITS:2 * BOUND_BITS], self._word[:BOUND_BITS])

    def elaborate(self, platform):
        m = Module()
        bld = self.build
        LEVELS, INNER = dataflow.LEVELS, dataflow.INNER
        GENS = dataflow.GENERATORS
        KINDS = dataflow.KINDS
        LB = self.limit_bits

        m.submodules.mul = mul = SerialMultiplier(EXACT_BITS + 1, BOUND_BITS)

        word = self._word = self._registered_word(m)

        # -------- the program walk and the phase's header
        at = Signal(range(bld.program_words + dataflow.PHASE_WORDS))
        index = Signal.like(self.phase)
        kind = Signal(dataflow.HEADER_FIELDS["kind"][2])
        layer = Signal(range(bld.max_layers))
        inputs = Signal(range(bld.max_width + 1))
        outputs = Signal(range(bld.max_width + 1))
        # the last select phase's (the kept list's) layer and shape
        select_valid = Signal()
        select_layer = Signal.like(layer)
        select_inputs = Signal.like(inputs)
        select_outputs = Signal.like(outputs)
        faults = Signal(len(PHASE_CHECKS))
        flag = {name: faults[i] for i, name in enumerate(PHASE_CHECKS)}

        # -------- the level walk: a bound pass, then per generator innermost first
        level = Signal(range(LEVELS))
        gen = Signal(range(len(GENS)))
        gen_at = Signal.like(at)            # the word of the generator's base
        channels = Signal(range(bld.max_width + 1))
        bound = Signal(BOUND_BITS)          # the effective bound of the level
        R = Signal(signed(EXACT_BITS + 1))
        lost = Signal()
        stride_negative = Signal()
        hi = Signal(LB + 1)                 # base + the positive reach
        lo = Signal(signed(LB + 2))         # base + the negative reach

        addr = Signal.like(at)
        bound_word = at + dataflow.HEADER_WORDS + (level >> 1)     # the level's bound word
        m.d.comb += [self.rd_addr.eq(addr), self.phase.eq(index)]

        kind_known, is_kept, run_time, run_time_bound, limit, offset = self._kind_tables(
            m, self._field("kind"), kind, level, gen, outputs)

        stride = Signal(signed(EXACT_BITS + 2))
        stride_size = Signal(EXACT_BITS + 1)
        m.d.comb += [stride.eq(word.as_signed() + R),
                     stride_size.eq(Mux(stride < 0, -stride, stride))]
        summed = Signal(signed(EXACT_BITS + 3))         # R with the product added
        m.d.comb += summed.eq(Mux(stride_negative, R - mul.product, R + mul.product))
        reach = mul.product[:LB]                        # when below the limit
        hi_next = Signal.like(hi)
        lo_next = Signal.like(lo)
        m.d.comb += [hi_next.eq(hi + reach), lo_next.eq(lo - reach)]

        def next_bound_level(bound_fault=False):
            # bound_fault: the bound check's flag as it is set in this cycle
            with m.If(level == INNER):
                with m.If(flag["header"] | flag["kept_list"] | flag["bound"] | bound_fault):
                    m.next = "VERDICT"
                with m.Else():
                    m.d.sync += [gen.eq(0),
                                 gen_at.eq(at + dataflow.HEADER_WORDS + dataflow.BOUND_WORDS)]
                    m.next = "BASE_ADDR"
            with m.Else():
                m.d.sync += level.eq(level + 1)
                m.next = "BOUND_ADDR"

        def next_level():
            with m.If(level == 0):
                m.next = "GEN_END"
            with m.Else():
                m.d.sync += level.eq(level - 1)
                m.next = "STEP_BOUND_ADDR"

        def next_gen():
            with m.If(gen == len(GENS) - 1):
                m.next = "VERDICT"
            with m.Else():
                m.d.sync += [gen.eq(gen + 1), gen_at.eq(gen_at + 1 + LEVELS)]
                m.next = "BASE_ADDR"

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [at.eq(self.base), index.eq(0), select_valid.eq(0)]
                    m.next = "HEADER"
            with m.State("HEADER"):
                m.d.comb += self.busy.eq(1)
                with m.If(at > bld.program_words - dataflow.HEADER_WORDS):
                    self._verdict(m, "end")
                    m.next = "IDLE"
                with m.Else():
                    m.d.comb += addr.eq(at)
                    m.next = "HEADER_READ1"
            self._wait_for_read(m, "HEADER", "KIND", successor=[addr.eq(at + 1)])
            with m.State("KIND"):
                # header word 0: kind, shift, layer
                m.d.comb += self.busy.eq(1)
                with m.If(~kind_known):
                    self._verdict(m, "kind")
                    m.next = "IDLE"
                with m.Elif(self._field("kind") == KINDS["end"]):
                    self._verdict(m, None)
                    m.next = "IDLE"
                with m.Elif(at > bld.program_words - dataflow.PHASE_WORDS):
                    self._verdict(m, "end")
                    m.next = "IDLE"
                with m.Else():
                    header = ((self._field("shift") > spec.FORWARD_SHIFT_MAX)
                              | (self._field("layer") >= bld.max_layers))
                    m.d.sync += [kind.eq(self._field("kind")), layer.eq(self._field("layer")),
                                 faults.eq(Mux(header, 1 << PHASE_CHECKS.index("header"), 0))]
                    m.next = "SHAPE"
            with m.State("SHAPE"):
                # header word 1: outputs, inputs
                m.d.comb += self.busy.eq(1)
                n, k = self._field("outputs"), self._field("inputs")
                needs_one = (kind == KINDS["loss"]) | (kind == KINDS["select"])
                header = (n > bld.max_width) | (k > bld.max_width) | (needs_one & (n == 0))
                stale = ~select_valid | (layer != select_layer) | (k != select_inputs) \
                    | (n != select_outputs)
                m.d.sync += [flag["header"].eq(flag["header"] | header),
                             flag["kept_list"].eq(is_kept & stale),
                             outputs.eq(n), inputs.eq(k), channels.eq(1), level.eq(0)]
                m.next = "BOUND_ADDR"
            with m.State("BOUND_ADDR"):
                m.d.comb += [self.busy.eq(1), addr.eq(bound_word)]
                m.next = "BOUND_READ1"
            self._wait_for_read(m, "BOUND", "BOUND")
            with m.State("BOUND"):
                # the bound check; a select phase's channels: its outer bounds' product
                m.d.comb += self.busy.eq(1)
                n = self._bound_at(level)
                # a bound of 0, or one above what the core's counters hold
                bad_bound = ~run_time & ((n == 0) | (n > dataflow.bound_limit(self.build)))
                with m.If(bad_bound):
                    m.d.sync += flag["bound"].eq(1)
                with m.If((kind == KINDS["select"]) & (level != INNER) & ~flag["channel"]
                          & (n != 1)):
                    m.d.comb += [mul.a.eq(channels), mul.b.eq(n), mul.start.eq(1)]
                    m.next = "CHANNEL_PRODUCT"
                with m.Else():
                    next_bound_level(bad_bound)
            with m.State("CHANNEL_PRODUCT"):
                m.d.comb += self.busy.eq(1)
                with m.If(mul.done):
                    with m.If((mul.product[len(outputs):] != 0)
                              | (mul.product[:len(outputs)] > outputs)):
                        m.d.sync += flag["channel"].eq(1)
                    with m.Else():
                        m.d.sync += channels.eq(mul.product)
                    next_bound_level()
            with m.State("BASE_ADDR"):
                m.d.comb += [self.busy.eq(1), addr.eq(gen_at)]
                m.next = "BASE_READ1"
            self._wait_for_read(m, "BASE", "BASE")
            with m.State("BASE"):
                # the base, compared full width
                m.d.comb += self.busy.eq(1)
                with m.If(self._at_least(word, limit)):
                    m.d.sync += flag["range"].eq(1)
                m.d.sync += [hi.eq(word), lo.eq(word), R.eq(0), lost.eq(0),
                             level.eq(INNER)]
                m.next = "STEP_BOUND_ADDR"
            with m.State("STEP_BOUND_ADDR"):
                m.d.comb += [self.busy.eq(1), addr.eq(bound_word)]
                m.next = "STEP_READ1"
            # the delta's address in the cycle after the bound's
            self._wait_for_read(m, "STEP", "STEP_BOUND", successor=[addr.eq(gen_at + 1 + level)])
            with m.State("STEP_BOUND"):
                m.d.comb += self.busy.eq(1)
                m.d.sync += bound.eq(Mux(run_time, run_time_bound, self._bound_at(level)))
                m.next = "STRIDE"
            with m.State("STRIDE"):
                # the delta arrives: stride_i = delta_i + R
                m.d.comb += self.busy.eq(1)
                counts = bound > 1
                with m.If(run_time & (level != 0) & (lost | (stride != 0))):
                    m.d.sync += flag["run_time_stride"].eq(1)
                # |stride| >= limit at a counting level: the reach (n - 1) * stride alone
                # leaves 0 .. limit - 1 from any base in it (and a base outside is refused)
                with m.If(counts & (lost | self._at_least(stride_size, limit))):
                    m.d.sync += flag["range"].eq(1)
                m.d.sync += stride_negative.eq(stride < 0)
                with m.If(counts & ~lost & (stride != 0)):
                    m.d.comb += [mul.a.eq(stride_size), mul.b.eq(bound - 1), mul.start.eq(1)]
                    m.next = "PRODUCT"
                with m.Else():
                    next_level()
            with m.State("PRODUCT"):
                m.d.comb += self.busy.eq(1)
                with m.If(mul.done):
                    with m.If((mul.product >> (EXACT_BITS + 1)) != 0):
                        m.d.sync += lost.eq(1)
                    with m.Elif((summed[EXACT_BITS:] != 0)
                                & (summed[EXACT_BITS:] != (1 << len(summed) - EXACT_BITS) - 1)):
                        m.d.sync += lost.eq(1)
                    with m.Else():
                        m.d.sync += R.eq(summed)
                    with m.If(~flag["range"] & self._at_least(mul.product, limit)):
                        m.d.sync += flag["range"].eq(1)
                    with m.Elif(~flag["range"]):
                        with m.If(stride_negative):
                            m.d.sync += lo.eq(lo_next)
                            with m.If(lo_next < 0):
                                m.d.sync += flag["range"].eq(1)
                        with m.Else():
                            m.d.sync += hi.eq(hi_next)
                            with m.If(self._at_least(hi_next, limit)):
                                m.d.sync += flag["range"].eq(1)
                    next_level()
            with m.State("GEN_END"):
                # the derived addresses from the generator's top (only with its range inside)
                m.d.comb += self.busy.eq(1)
                with m.If(is_kept & (gen == GENS.index("w")) & ~flag["range"]):
                    m.d.comb += [mul.a.eq(inputs), mul.b.eq(outputs - 1), mul.start.eq(1)]
                    m.next = "KEPT_WEIGHTS"
                with m.Else():
                    with m.If(~flag["range"] & self._at_least(hi + offset, limit)):
                        m.d.sync += flag["derived"].eq(1)
                    next_gen()
            with m.State("KEPT_WEIGHTS"):
                m.d.comb += self.busy.eq(1)
                with m.If(mul.done):
                    with m.If(self._at_least(hi + mul.product, limit)):
                        m.d.sync += flag["derived"].eq(1)
                    next_gen()
            with m.State("VERDICT"):
                # the first flag in verify's order
                m.d.comb += self.busy.eq(1)
                with m.If(faults != 0):
                    for i, name in enumerate(PHASE_CHECKS):
                        cond = faults[i] if i == 0 else faults[i] & (faults[:i] == 0)
                        with m.If(cond):
                            self._verdict(m, name)
                    m.next = "IDLE"
                with m.Else():
                    with m.If(kind == KINDS["select"]):
                        m.d.sync += [select_valid.eq(1), select_layer.eq(layer),
                                     select_inputs.eq(inputs), select_outputs.eq(outputs)]
                    m.d.sync += [at.eq(at + dataflow.PHASE_WORDS), index.eq(index + 1)]
                    m.next = "HEADER"
        return m
