"""Engine v2's core: the program runner and the phases of the infer and train commands in the
sample-lane dataflow (issue 13; docs/architecture.md, section 2b).

Golden twin: ``ember.dataflow.execute`` -- the same phases (``ember.dataflow.infer_program``
and ``train_program``, written to the program memory as ``ember.dataflow.encode`` words), the
same memories (``ember.dataflow.Memories``: weights one per word, activations and gradients
in words of P lanes, lane p of sample block s holding sample s * P + p), the same events. Its
arithmetic is the golden model's: ``GoldenModel.infer`` and ``train_batch`` bit for bit.

The core is not on a build yet: v1's ``EngineCore`` is. It has no bus: the test harness (and,
when v2 replaces v1, the memory window and register bank) drives the ports below.

`SampleEngine(build)`. Ports (sync domain):
  start:        In(1) -- run the program from word `program_base` (ignored while busy).
  program_base: In -- the program's first word, sampled with start (the shell gives 0 for a
                train run, INFER_PROGRAM for an inference).
  busy:         Out(1) -- from the cycle after start until the program's "end" phase.
  fault:        Out(1) -- the last run stopped at a phase the engine refused: an unknown kind,
                a bound of 0 or past dataflow.bound_limit, an inputs or outputs field past a
                layer's width register, or an address outside its memory (ember_hw.loopnest,
                and the kept channels' addresses here); sticky until the next start.
  settings:     In -- the step's registers (spec.StepSettings): batch, update_mask,
                lr_shift, zero_skip, psg, psg_relative, psg_tau, psg_step_shift, keep_q8,
                ssprop_random, lfsr_seed. Held from start to the end of the run.
  correct:      Out -- samples the loss phases classified right in the last run.
  gather_word, gather_data, gather_lane, gather_mask, gather_en, gather_bank: In -- (the
                resident data unit's gather, ember_hw.epoch) write up to GATHER_LANES lanes
                of activation word gather_word of input bank gather_bank in one cycle: lane
                gather_lane + j (gather_lane a multiple of GATHER_LANES) takes byte j of
                gather_data where mask bit j is set. While idle, or while the core runs
                with gather_active high; label_wr_* then write the labels of gather_bank.
  gather_stall: Out(1) -- the core writes an activation in this cycle: the gather's write is
                not taken (ember_hw.epoch's ``stall``).
  input_bank:   In(1) -- the input bank the run reads: layer 0's phases read the network's
                input from it, and the loss phase the labels. On a build with the resident
                data unit the activation memory has a second copy of its words from
                2**ceil(log2(act_bytes / P)) and the label memory one from
                2**ceil(log2(max_batch)), for the unit's next batch; the bus and the core's
                own writes use bank 0.
  prog_wr_*, w_wr_*, act_wr_*, label_wr_*: In -- write a program word, a weight, an
                activation byte (at word * P + lane) or a label, while idle.
  w_rd_addr: In; w_rd_data: Out -- a weight, the cycle after its address (while idle).
  prog_rd_addr: In; prog_rd_data: Out -- a program word, the cycle after its address (while
                idle).
  pred_rd_addr: In; pred_rd_data: Out -- a prediction, the cycle after its address.
  label_rd_addr: In; label_rd_data: Out -- a label, the cycle after its address (while idle).
  weight_write: Out(1) -- the run writes a weight in this cycle (the stop unit's: an abort
                never leaves a step half applied).
  layer:        Out -- the layer of the phase running (STOPPED's layer field).
  inc:          Out -- one field per event (EVENTS, ``event_bounds(build)`` sizes each): the
                amount to add to that counter, registered (the events of cycle t are in
                inc in cycle t + 1). The shell's counter file (ember_hw.counters) takes it.
  kind:         Out(4) -- the kind (ember.dataflow.KINDS) of the phase running (while busy):
                the shell's cycle counters by phase.
  ``events``, ``kind_cycles`` (``tally=True`` only, for the tests and figures of the core
                alone): name -> Signal, the events and the busy cycles per phase kind of the
                last run (32-bit, cleared at start, one cycle behind ``inc``).

A phase's program words are loaded (ember.dataflow.PHASE_WORDS cycles: the header and bounds
into registers, each generator's base and deltas into the loop nest's step memories), its
loop nest walked, and the pipeline drained before the next phase starts (the next phase
reads what this one wrote). A backward phase whose layer the SLU mask leaves out is skipped
after its header. The kept channel level's bound is the kept count of the layer's select
phase, and the PSG pass level's bound is 2 under PSG, else 1.

The phases (cycle t: the nest presents the step and it is taken; levels are named outermost
first, each nest padded with bound-1 levels at the outer end to ember.dataflow.LEVELS):

- forward, logits (levels: sample block s, output j, input k): t reads the activation word;
  t+1 gates the lanes whose activation is zero; G = dataflow.pipeline(build).gate registers
  later, t+1+G reads W[j, k] unless every lane is gated; the weight arrives at t+2+G and,
  B = Pipeline.broadcast registers later (the broadcast register, near
  the lanes), t+2+G+B gives it to every lane with its own activation; t+4+G+B accumulates;
  at the last k, t+5+G+B (snap_latency) snapshots the sums and the writeback unit
  requantizes them D = spec.Build.drain_lanes lanes a cycle. A step with the last k waits
  until the writeback unit is free when its sums arrive (P / D + Pipeline.writeback_gap
  cycles apart: a cycle less without the round_output register).
- argmax (s, lane, class n): the first maximum of each sample's logits into the predictions.
- loss (s, lane t of each lane block): Build.drain_lanes (D) softmax-gradient units
  (ember_hw.loss) in lockstep, unit i on sample o + i P/D's logits in place (_loss).
- select (j, s): ssProp's scores (sum over the live lanes of |dY| of channel j, or the LFSR),
  the selector (ember_hw.select), then the kept list: (j, j * K) of each kept channel in
  order, which the input- and weight-gradient phases add to their w and g addresses.
- input_grad (s, k, kept c): W[j, k] to every lane with its sample's dY[b, j] (the gates
  and the kept channel's addresses formed at t+1, read at t+1+G, given to the lanes at
  t+2+G+B as in the forward phase); the lanes whose
  activation is not positive are gated; at the last c the dX drain writes the lanes' raw
  dX (zero where the activation is) to the scratch, spec.Build.drain_lanes (D) lanes a
  cycle into its D banks, and tracks the batch's largest |dX|. A step with the last c waits
  until the drain is free when its sums arrive (P / D + 1 cycles apart).
- requant (s, lane, k): dX through the rounding shifter by the batch's scale into dY of the
  layer below (ember_hw.requant): t reads the scratch word, t+1 gives its D entries to the
  shifters, t+3 has their results, and Pipeline.round_output registers later
  (requant_latency) dY is written.
- weight_grad (kept c, input group, pass, s, input in the group): each lane's
  dY[b, j] * A[b, k] summed across the lanes (an adder tree of
  Pipeline.grad_tree registered levels, the sum in the accumulator at
  t + grad_sum_latency) and the sample blocks into the input's accumulator (one per input of
  the group); the block's dY word is read at the group's first input and held for the
  rest (spec.GRAD_HOLD) in the gradient memory's read register (its read enable is low
  except at the group's first input of each block). At the last s the update: SGD
  through the rounding shifter, or under PSG a first pass of the high bits' products (the
  prediction) and a second pass at full precision only where the prediction is not
  confident; the sign step. The second pass's first step waits for the group's decisions.
  The update reads W[j, k] dataflow.UPDATE_READ_LEAD cycles before the sum and writes it
  dataflow.UPDATE_WRITE_LATENCY cycles after: read and write UPDATE_WRITE_DISTANCE =
  GRAD_HOLD cycles apart, so a group's updates in a row never read and write in one cycle.
- psg_max (the same nest, one pass): PSG's relative threshold, the layer's largest
  |prediction|.

The weight memory (ember_hw.weights.WeightMemory, `wmem`) holds one 16-bit weight per
word, so on a ``Build.weight_spram`` build one SB_SPRAM256KA holds every weight for any lane
count. A SPRAM has one port: a cycle reads or writes. The bus writes only while idle (and
the read port is off in that cycle); the forward and input-gradient phases only read; the
weight-gradient phase reads and writes only in the update, and on such a build an update
step waits while the update issued UPDATE_WRITE_DISTANCE cycles before it would write in
its read cycle (_update_stall; dataflow._update_stalls counts the waits for the cycle
bound: none with two sample blocks or more and full input groups). ``wmem.conflict`` would
record a cycle that did both; tests/test_sample_engine.py runs the schedule on the generic
memory (``SampleEngine(build, spram=False)``) and checks it stays 0, and
tests/test_weight_memory.py runs the SPRAM (Yosys's model) in Verilator against the model.
"""

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.hdl import ResetInserter
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ember import dataflow, spec

from .arith import RoundingShifter, below, clamp_signed, pipelined_tree_sum, popcount
from .lanemem import LaneMemory
from .lanes import MacLanes
from .loopnest import LoopNest
from .loss import SoftmaxGradUnit
from .requant import DxRequantizer
from .select import ChannelSelector, Lfsr16
from .serial_mul import SerialMultiplier
from .weights import WeightMemory
from .writeback import ForwardWriteback

#: Lanes of one activation word the gather's port writes in a cycle: the bytes of one data
#: word of the resident data memory (ember_hw.epoch's 4 x 4 transpose).
GATHER_LANES = spec.DATA_WORD_BYTES

#: The events the core counts (the link's and the cycle counters are the shell's).
EVENTS = tuple(c for c in spec.EXACT_COUNTERS if not c.startswith("link_"))


def event_bounds(build):
    """The most each event can grow by in one cycle (the width of its ``inc`` field and the
    counter file's pre-counter bound): 0 for an event of a unit the build does not have
    (spec.COUNTER_UNITS), which the counter file then does not count."""
    P, bnk = build.lanes, build.max_batch * build.max_width * build.max_width
    bounds = dict.fromkeys(EVENTS, 1)
    bounds.update({name: P for name in (
        "act_reads", "act_msb_reads", "grad_reads", "grad_lane_reads", "grad_msb_lane_reads",
        "mac_forward", "mac_input_grad", "mac_weight_grad", "mac_weight_grad_low",
        "skip_zero")})
    bounds.update(samples=build.max_batch,
                  grad_writes=build.drain_lanes, act_writes=build.drain_lanes,
                  loss_elements=build.max_width * build.drain_lanes,
                  skip_psg=P * build.max_batch, skip_slu=2 * bnk, skip_ssprop=2 * bnk)
    bounds.update({name: 0 for name, unit in spec.COUNTER_UNITS.items()
                   if name in bounds and unit not in build.features})
    return bounds


LEVELS = dataflow.LEVELS
INNER = dataflow.INNER
BLOCK = dataflow.BLOCK_LEVEL


class SampleEngine(wiring.Component):
    """The v2 core (module docstring)."""

    def __init__(self, build=spec.DEFAULT_BUILD, tally=True, spram=None):
        # spram: the weight memory's implementation (ember_hw.weights), the build's unless
        # given; a weight_spram build on the generic memory keeps its single-port schedule,
        # which the Amaranth simulator can then run and check (wmem.conflict)
        spram = build.weight_spram if spram is None else spram
        if spram and not build.weight_spram:
            raise ValueError(f"build '{build.name}': SPRAM weights need the single-port "
                             "schedule of a weight_spram build")
        self.build, self.tally, self.spram = build, tally, spram
        #: the fanout registers of this build's pipelines (ember.dataflow.Pipeline)
        self.pipe = dataflow.pipeline(build)
        #: a kept-list memory only with the ssProp unit: without it every channel is kept, so
        #: the kept channel c is j = c and its weight offset c * K, counted instead of read
        self.kept_list = "ssprop" in build.features
        P = build.lanes
        self.logp = ceil_log2(P)
        self.weight_depth = build.weight_words * P
        self.act_words = build.act_bytes // P
        self.w_bits = ceil_log2(self.weight_depth)
        self.a_bits = a_bits = ceil_log2(self.act_words)
        self.label_bits = ceil_log2(build.max_batch)
        #: The resident data unit's two input banks: the network's input (the activation
        #: words of layer 0's inputs) and the labels, each the memory's words from 0 and a
        #: second copy from 2**bits, so the next batch is gathered while a run reads this one
        self.banked = "resident" in build.features
        g_bits = ceil_log2(build.grad_words)
        self.width_bits = ceil_log2(build.max_width + 1)
        # what each generator addresses depends on the phase kind (ember.dataflow.GENERATORS)
        self.gen_bits = {"w": max(self.w_bits, self.width_bits),
                         "a": max(a_bits, g_bits, ceil_log2(build.scratch_entries)),
                         "g": g_bits,
                         "o": max(a_bits, g_bits, ceil_log2(build.max_batch + 1),
                                  ceil_log2(build.scratch_entries))}
        table = build.settings()
        super().__init__({
            "start": In(1),
            "program_base": In(range(build.program_words)),
            "busy": Out(1),
            "fault": Out(1),
            "batch": In(range(build.max_batch + 1)),
            "update_mask": In(build.max_layers),
            "lr_shift": In(range(spec.UPDATE_SHIFT_MAX + 1)),
            "zero_skip": In(1),
            "psg": In(1),
            "psg_relative": In(1),
            "psg_tau": In(32),
            "psg_step_shift": In(table["psg_step_shift"].bits),
            "keep_q8": In(table["keep_q8"].bits),
            "ssprop_random": In(1),
            "lfsr_seed": In(16),
            "correct": Out(range(build.max_batch + 1)),
            "prog_wr_addr": In(ceil_log2(build.program_words)),
            "prog_wr_data": In(spec.BUS_DATA_BITS),
            "prog_wr_en": In(1),
            "prog_rd_addr": In(ceil_log2(build.program_words)),
            "prog_rd_data": Out(spec.BUS_DATA_BITS),
            "w_wr_addr": In(self.w_bits),
            "w_wr_data": In(spec.WEIGHT_BITS),
            "w_wr_en": In(1),
            "w_rd_addr": In(self.w_bits),
            "w_rd_data": Out(spec.WEIGHT_BITS),
            "act_wr_addr": In(a_bits + self.logp),
            "act_wr_data": In(spec.ACT_BITS),
            "act_wr_en": In(1),
            "gather_word": In(a_bits),
            "gather_data": In(GATHER_LANES * spec.ACT_BITS),
            "gather_lane": In(max(1, self.logp)),
            "gather_mask": In(GATHER_LANES),
            "gather_en": In(1),
            "gather_bank": In(1),
            "gather_active": In(1),
            "gather_stall": Out(1),
            "input_bank": In(1),
            "label_wr_addr": In(ceil_log2(build.max_batch)),
            "label_wr_data": In(spec.LABEL_BITS),
            "label_wr_en": In(1),
            "pred_rd_addr": In(ceil_log2(build.max_batch)),
            "pred_rd_data": Out(spec.LABEL_BITS),
            "label_rd_addr": In(ceil_log2(build.max_batch)),
            "label_rd_data": Out(spec.LABEL_BITS),
            "weight_write": Out(1),
            "layer": Out(range(build.max_layers + 1)),
            "inc": Out(data.StructLayout({name: range(bound + 1)
                                          for name, bound in event_bounds(build).items()})),
            "kind": Out(4),
        })
        if tally:
            self.events = {name: Signal(32, name=f"ev_{name}") for name in EVENTS}
            #: the busy cycles of each phase kind in the last run (loading its words and
            #: draining its pipeline included): what the utilization figures divide by
            self.kind_cycles = {k: Signal(32, name=f"cycles_{k}") for k in dataflow.KINDS}

    def elaborate(self, platform):
        m = Module()
        s = _Core(m, self)
        self._memories(m, s)
        self._phase_registers(m, s)
        self._datapath(m, s)
        self._forward(m, s)
        self._argmax(m, s)
        self._loss(m, s)
        self._select(m, s)
        self._input_grad(m, s)
        self._requant(m, s)
        self._weight_grad(m, s)
        self._update(m, s)
        self._runner(m, s)
        return m

    # ---------------------------------------------------------------- memories
    def _memories(self, m, s):
        bld, P, LOGP = self.build, s.P, self.logp

        def memory(name, shape, depth):
            m.submodules[name] = mem = Memory(shape=shape, depth=depth, init=[])
            return mem.read_port(transparent_for=()), mem.write_port()

        s.prog_rd, s.prog_wr = memory("prog", unsigned(spec.BUS_DATA_BITS), bld.program_words)
        # every weight in one memory of 16-bit words: one SB_SPRAM256KA on a weight_spram
        # build (a read is broadcast to all lanes, so one SPRAM serves any lane count)
        m.submodules.wmem = self.wmem = WeightMemory(1, self.weight_depth, spram=self.spram)
        s.w_rd, s.w_wr = self.wmem.rd, self.wmem.wr
        # the dX scratch in drain_lanes banks (entry e: bank e % D, word e // D), so the
        # input gradient's drain writes D entries a cycle
        s.D, s.logd = bld.drain_lanes, ceil_log2(bld.drain_lanes)
        m.submodules.smem = s.smem = LaneMemory(s.D, bld.scratch_entries // s.D, spec.DX_BITS)
        s.s_rd, s.s_wr = s.smem.rd, s.smem.wr
        s.l_rd, s.l_wr = memory("lmem", unsigned(spec.LABEL_BITS),
                                self._bank_depth(self.label_bits, bld.max_batch))
        s.p_rd, s.p_wr = memory("pmem", unsigned(spec.LABEL_BITS), bld.max_batch)
        # the kept list: (j, j * K) of each kept channel of the current layer
        if self.kept_list:
            s.k_rd, s.k_wr = memory("kmem", unsigned(self.width_bits + self.w_bits),
                                    bld.max_width)
        m.submodules.amem = s.amem = LaneMemory(P, self._bank_depth(self.a_bits, self.act_words),
                                                spec.ACT_BITS,
                                                write_stages=self.pipe.memory_write)
        m.submodules.gmem = s.gmem = LaneMemory(P, bld.grad_words, spec.GRAD_BITS,
                                                write_stages=self.pipe.memory_write)
        # one lane's entry of the gradient word read, for argmax and loss (one P-way
        # multiplexer for both: each gathers every lane's memory into one place). Its select
        # is a register that each phase loads with the lane of its read (the read's address
        # cycle), not a multiplexer of the two by the phase's kind: the select fans out to
        # the whole multiplexer, which feeds both units' compares
        s.pick_lane = Signal(range(P))
        s.lane_value = Signal(signed(spec.GRAD_BITS))
        m.d.comb += s.lane_value.eq(Array(s.gmem.rd.data.word_select(i, spec.GRAD_BITS)
                                          for i in range(P))[s.pick_lane].as_signed())
        idle = ~s.busy
        # the weight memory reads only where a phase asks (below) or the bus while idle, and
        # never in the cycle of a bus write: a SPRAM has one port (ember_hw.weights)
        m.d.comb += s.w_rd.en.eq(idle & ~self.w_wr_en)
        m.d.comb += [s.prog_wr.addr.eq(self.prog_wr_addr), s.prog_wr.data.eq(self.prog_wr_data),
                     s.prog_wr.en.eq(self.prog_wr_en & idle),
                     s.l_wr.addr.eq(self._banked(self.label_wr_addr, self.gather_bank)),
                     s.l_wr.data.eq(self.label_wr_data),
                     s.l_wr.en.eq(self.label_wr_en & (idle | self.gather_active)),
                     s.p_rd.addr.eq(self.pred_rd_addr), self.pred_rd_data.eq(s.p_rd.data),
                     self.w_rd_data.eq(s.w_rd.data), self.prog_rd_data.eq(s.prog_rd.data),
                     s.l_rd.addr.eq(self.label_rd_addr), self.label_rd_data.eq(s.l_rd.data)]
        with m.If(idle):
            m.d.comb += [s.w_wr.addr.eq(self.w_wr_addr), s.w_wr.data.eq(self.w_wr_data),
                         s.w_wr.en.eq(self.w_wr_en), s.w_rd.addr.eq(self.w_rd_addr),
                         s.amem.wr.addr.eq(self.act_wr_addr[LOGP:]),
                         s.amem.wr.data.eq(self.act_wr_data.replicate(P)),
                         s.amem.wr.en.eq(Mux(self.act_wr_en,
                                             Const(1, P) << self.act_wr_addr[:LOGP], 0))]
        with m.If(self.gather_en & (idle | self.gather_active)):
            # lanes gather_lane .. + GATHER_LANES - 1 of one word: lane p takes byte
            # p % GATHER_LANES (on 2 lanes, the low two bytes), into gather_bank; while the
            # core runs, its own activation writes (_datapath, after this) take the port
            # first and gather_stall tells the gather to present its write again
            group = min(P, GATHER_LANES)
            m.d.comb += [s.amem.wr.addr.eq(self._banked(self.gather_word, self.gather_bank)),
                         s.amem.wr.data.eq(self.gather_data[:group * spec.ACT_BITS]
                                           .replicate(P // group)),
                         s.amem.wr.en.eq((self.gather_mask[:group] << self.gather_lane)[:P])]

    # ---------------------------------------------------------------- the phase's registers
    def _phase_registers(self, m, s):
        bld, P = self.build, s.P
        s.kind = Signal(4)
        s.shift = Signal(range(spec.FORWARD_SHIFT_MAX + 1))
        s.layer = Signal(range(bld.max_layers))
        # K and N as wide as a layer's width, the bounds as dataflow.bound_bits: the program
        # words' wider fields are checked as they are loaded (a value that does not fit is
        # refused with `fault`, header_wide and bound_over), not held
        s.N = Signal(self.width_bits)
        s.K = Signal(self.width_bits)
        s.header = {"kind": s.kind, "shift": s.shift, "layer": s.layer, "outputs": s.N,
                    "inputs": s.K}
        s.header_wide = Signal()
        s.bounds = [Signal(dataflow.bound_bits(bld), name=f"bound{i}") for i in range(LEVELS)]
        s.bound_over = Signal(LEVELS)
        # the kind decoded as it is loaded (one register per kind, loaded with s.kind by
        # s.load_kind), not from s.kind: every phase's control starts from these flags. A
        # kind the build does not run (dataflow.build_kinds) is never set: its phase faults
        # as an unknown kind's, and its logic is left out
        kinds = dataflow.build_kinds(bld)
        s.is_ = {name: Signal(name=f"is_{name}", init=code == s.kind.init)
                 for name, code in kinds.items()}
        s.is_.update({name: Const(0) for name in dataflow.KINDS if name not in kinds})
        s.load_kind = lambda value: [s.kind.eq(value)] + [s.is_[name].eq(value == code)
                                                           for name, code in kinds.items()]
        s.forwardish = s.is_["forward"] | s.is_["logits"]
        s.gradish = s.is_["weight_grad"] | s.is_["psg_max"]

        # the nest; its bounds with the run-time ones: the kept count and PSG's passes
        s.abort = Signal()
        # the nest's step memories in block RAM on an iCE40 (a weight_spram build: the iCE40
        # UltraPlus), which has no distributed RAM
        nest = LoopNest(self.gen_bits, levels=LEVELS, bound_bits=dataflow.bound_bits(bld),
                        block_ram=bld.weight_spram)
        m.submodules.nest = s.nest = nest = ResetInserter(s.abort)(nest)
        s.kept_count = Signal(range(bld.max_width + 1))
        s.passes = Signal(range(3))
        m.d.comb += s.passes.eq(Mux(s.is_["weight_grad"] & self.psg, 2, 1))
        eff, over = [], []
        for i, b in enumerate(s.bounds):
            v, run_time = b, Const(0)
            if i == dataflow.KEPT_LEVEL["input_grad"]:
                v, run_time = Mux(s.is_["input_grad"], s.kept_count, v), s.is_["input_grad"]
            if i == dataflow.KEPT_LEVEL["weight_grad"]:
                v, run_time = Mux(s.gradish, s.kept_count, v), run_time | s.gradish
            if i == dataflow.PASS_LEVEL:
                v, run_time = Mux(s.gradish, s.passes, v), run_time | s.gradish
            effective = Signal(len(b), name=f"eff_bound{i}")
            m.d.comb += effective.eq(v)
            eff.append(effective)
            over.append(s.bound_over[i] & ~run_time)
        # a written bound the core counts that does not fit its counters (dataflow.bound_limit)
        s.bound_fault = Signal()
        m.d.comb += [nest.bound.eq(Cat(*eff)), s.nest_done.eq(nest.done),
                     s.bound_fault.eq(Cat(*over).any())]
        limits = {g: self._limit(s, g) for g in s.gens}
        for g in s.gens:
            m.d.comb += getattr(nest, f"limit_{g}").eq(limits[g])
        s.addr = {g: getattr(nest, f"addr_{g}") for g in s.gens}
        s.first, s.last = nest.first, nest.last
        # the step is taken this cycle unless a phase holds it (stall)
        s.stall = Signal()
        s.issue = Signal()
        m.d.comb += [nest.advance.eq(~s.stall), s.issue.eq(nest.valid & ~s.stall)]
        s.all_lanes = Const((1 << P) - 1, P)
        self._live_samples(m, s)

        # the index of the kept channel level (the kept list's address)
        s.c_idx = Signal(range(bld.max_width + 1))
        with m.If(s.issue & s.is_["input_grad"]):
            m.d.sync += s.c_idx.eq(Mux(s.last[INNER], 0, s.c_idx + 1))
        with m.If(s.issue & s.gradish & s.last[1:].all()):
            m.d.sync += s.c_idx.eq(s.c_idx + 1)
        if self.kept_list:
            m.d.comb += s.k_rd.addr.eq(s.c_idx)
            s.kept_j = s.k_rd.data[:self.width_bits]
            s.kept_jk = s.k_rd.data[self.width_bits:]
        else:
            # every channel kept: entry c of the list would be (c, c * K), read a cycle
            # after c_idx is c; c * K is kept beside c_idx (wrapping at w_bits as the list's
            # field does) and both are registered, as the memory's read would be
            c_jk = Signal(self.w_bits)
            with m.If(s.issue & s.is_["input_grad"]):
                m.d.sync += c_jk.eq(Mux(s.last[INNER], 0, c_jk + s.K))
            with m.If(s.issue & s.gradish & s.last[1:].all()):
                m.d.sync += c_jk.eq(c_jk + s.K)
            with m.If(s.phase_started):
                m.d.sync += c_jk.eq(0)
            s.kept_j, s.kept_jk = Signal(self.width_bits), Signal(self.w_bits)
            m.d.sync += [s.kept_j.eq(s.c_idx), s.kept_jk.eq(c_jk)]

    def _live_samples(self, m, s):
        """The lanes of the presented step that hold samples of the batch (the batch
        register; a program runs any batch up to the one it was compiled for): golden twins
        ember.dataflow.block_lanes and step_samples. `left`, the samples the walk has not yet
        passed, is the batch at the phase's start and whenever its sample level wraps, and
        drops by P as a sample block is passed (by 1 as a per-sample kind's sample is)."""
        bld, P = self.build, s.P
        s.left = Signal(range(bld.max_batch + 1))
        advance, wrap = Const(0), Const(0)
        levels = {}                         # (sample level, level of a step's sample) -> kinds
        for kind, level in dataflow.SAMPLE_LEVEL.items():
            levels.setdefault((level, dataflow.LANE_LEVEL.get(kind, level)), []).append(kind)
        for (level, unit), kinds in levels.items():
            on = Cat(*[s.is_[k] for k in kinds]).any()
            passed = s.last[unit + 1:].all() if unit + 1 < LEVELS else Const(1)
            advance = Mux(on, passed, advance)
            wrap = Mux(on, s.last[level:unit + 1].all(), wrap)
        s.per_sample = Cat(*[s.is_[k] for k in dataflow.LANE_LEVEL]).any()
        # a requant and a loss step take drain_lanes samples (dataflow.lane_step)
        size = Mux(s.per_sample, Mux(s.is_["requant"] | s.is_["loss"], s.D, 1), P)
        with m.If(s.phase_started):
            m.d.sync += s.left.eq(self.batch)
        with m.Elif(s.issue & advance):
            m.d.sync += s.left.eq(Mux(wrap, self.batch, Mux(s.left > size, s.left - size, 0)))
        # a sample-block step's live lanes (how many and which), a per-sample step's sample
        s.live_count = Signal(range(P + 1))
        m.d.comb += s.live_count.eq(Mux(below(s.left, P), s.left, P))
        s.live_lanes = Signal(P)
        m.d.comb += s.live_lanes.eq(((Const(1, P + 1) << s.live_count) - 1)[:P])
        s.sample_live = Signal()
        m.d.comb += s.sample_live.eq(s.left != 0)

    def _limit(self, s, g):
        """Generator g's limit in the running phase, by its kind (ember.dataflow.limits, the
        one table of them): the value most kinds share, unless a kind with another runs."""
        kinds_by_limit = {}
        for kind in dataflow.ADDRESSED:
            kinds_by_limit.setdefault(dataflow.limits(kind, self.build)[g], []).append(kind)
        common = max(kinds_by_limit, key=lambda limit: len(kinds_by_limit[limit]))
        value = Const(common, range(common + 1))
        for limit, kinds in kinds_by_limit.items():
            if limit != common:
                value = Mux(Cat(*[s.is_[k] for k in kinds]).any(), limit, value)
        return value

    # ---------------------------------------------------------------- shared datapath
    def _datapath(self, m, s):
        bld, P = self.build, s.P
        # the activation, scratch and gradient memories' read addresses follow generator a
        # unless a phase reads elsewhere: the phases that read them at a (forward, both
        # gradients, requant, argmax) then need no multiplexer, and a read no phase uses
        # is harmless (these memories are written only by the core's units and the bus)
        # layer 0's phases read the network's input from the run's input bank (the
        # resident data unit's; bank 0 otherwise): their activation reads are all of it
        m.d.comb += [s.amem.rd.addr.eq(self._banked(s.addr["a"][:self.a_bits],
                                                    self.input_bank & (s.layer == 0))),
                     s.s_rd.addr.eq(s.addr["a"][s.logd:]), s.gmem.rd.addr.eq(s.addr["a"])]
        OPND = max(spec.WEIGHT_BITS, spec.GRAD_BITS, spec.ACT_BITS + 1)
        # the lanes accumulate forward sums, and the input gradient's sums over the outputs of
        # W x dY (wider: spec.Build.dx_acc_bits); no sum wraps
        s.LACC = LACC = max(bld.lane_acc_bits(), bld.dx_acc_bits())
        # a weight gradient's sum over the batch (spec.Build.lane_acc_bits): the adder tree,
        # the group's accumulators and the update's input need no more
        s.GACC = bld.lane_acc_bits()
        s.GACC_ROUND = max(s.GACC, spec.DX_BITS)
        m.submodules.lanes = s.lanes = MacLanes(P, OPND, LACC, drain=s.D)
        # the weight read for the lanes, Pipeline.broadcast registers after the memory (the
        # update and the bus read the memory's data directly)
        s.w_bcast = s.w_rd.data
        s.w_bcast_regs = []
        for n in range(1, self.pipe.broadcast + 1):
            reg = Signal.like(s.w_rd.data, name=f"w_bcast{n}", reset_less=True)
            m.d.sync += reg.eq(s.w_bcast)
            s.w_bcast = reg
            s.w_bcast_regs.append(reg)
        # what the shifter rounds: forward sums and weight gradients (both within
        # lane_acc_bits) and dX (DX_BITS); the input gradient's wider sums (dx_acc_bits) reach
        # it only as dX, so a head of the lanes' snapshot it takes fits, and is exact, in these
        # (without the round_output registers after them the shifters register their rounded
        # result: what follows, saturation into a memory write, then has no carry chain)
        finish = not self.pipe.round_output
        m.submodules.shifter = s.shifter = RoundingShifter(s.GACC_ROUND, spec.SHIFT_MAX,
                                                           finish_registered=finish)
        # the writeback takes D lanes a cycle: the shared shifter and D - 1 of its own
        wb_shifters = [s.shifter]
        for i in range(1, s.D):
            m.submodules[f"wb_shifter{i}"] = shifter = RoundingShifter(
                s.GACC_ROUND, spec.SHIFT_MAX, finish_registered=finish)
            wb_shifters.append(shifter)
        m.submodules.writeback = s.wb = ForwardWriteback(
            P, s.GACC_ROUND, act_addr_bits=len(self.act_wr_addr), grad_addr_bits=len(s.gmem.wr.addr),
            shift_bits=len(s.shift), drain=s.D, round_output=self.pipe.round_output)
        m.submodules.requant = s.req = DxRequantizer(entries=s.D,
                                                     round_output=self.pipe.round_output)
        # the loss phase's D units in lockstep (dataflow.lane_step)
        m.submodules.loss = s.loss = SoftmaxGradUnit(max_classes=bld.max_width)
        s.loss_units = [s.loss]
        for i in range(1, s.D):
            m.submodules[f"loss{i}"] = unit = SoftmaxGradUnit(max_classes=bld.max_width)
            s.loss_units.append(unit)
        s.has_ssprop = "ssprop" in bld.features
        s.has_psg = "psg" in bld.features
        if s.has_ssprop:
            m.submodules.selector = s.sel = ChannelSelector(max_channels=bld.max_width)
            if "ssprop_random" in bld.features:
                m.submodules.lfsr = s.lfsr = Lfsr16()
        # without the ssProp unit every channel is kept (keep is N, set at BOOK_MUL): the
        # select phase scores nothing, which synthesis cannot see from the keep register
        m.d.comb += s.dense.eq(s.keep >= s.N if s.has_ssprop else 1)
        if s.has_ssprop and "ssprop_random" in bld.features:
            m.d.comb += [s.random.eq(self.ssprop_random), s.lfsr_state.eq(s.lfsr.state)]
        # the writeback unit takes the snapshot's D heads through the shifters
        m.d.comb += [s.wb.rounded[i].eq(sh.out) for i, sh in enumerate(wb_shifters)]
        m.d.comb += [s.req.rounded[i].eq(sh.out) for i, sh in enumerate(wb_shifters)]
        s.shifters = wb_shifters
        with m.If(s.wb.take):
            for i, sh in enumerate(wb_shifters):
                m.d.comb += [sh.en.eq(1), sh.value.eq(s.lanes.heads[i]),
                             sh.shift.eq(s.wb.take_shift)]
            m.d.comb += s.lanes.snap_drain.eq(1)
        m.d.comb += self.gather_stall.eq(s.wb.act_wr_en)
        with m.If(s.wb.act_wr_en):
            # the group's D bytes to lanes act_wr_addr % P .. + D - 1 of one word
            m.d.comb += [s.amem.wr.addr.eq(s.wb.act_wr_addr[self.logp:]),
                         s.amem.wr.data.eq(s.wb.act_wr_data.replicate(P // s.D)),
                         s.amem.wr.en.eq(s.wb.act_wr_mask << s.wb.act_wr_addr[:self.logp])]
            m.d.sync += s.count("act_writes", popcount(s.wb.act_wr_mask))
        with m.If(s.wb.grad_wr_en):
            self._grad_write(m, s, s.wb.grad_wr_word, s.wb.grad_wr_lane, s.wb.grad_wr_value,
                             s.wb.grad_wr_mask)

    def _bank_depth(self, bits, words):
        """The depth of a memory of `words` words whose addresses have `bits` bits, with its
        second input bank from 2**bits on a build with the resident data unit (_banked)."""
        return (1 << bits) + words if self.banked else words

    def _banked(self, addr, bank):
        """A word address of the activation or label memory in `bank` (on a build with the
        resident data unit; `addr` itself on others)."""
        return Cat(addr, bank) if self.banked else addr

    @staticmethod
    def _grad_write(m, s, word, lane, values, mask=None):
        """Write the GRAD_BITS entries side by side in `values` to lanes lane, lane + 1, ...
        of gradient word `word`, where `mask` has a bit set (every entry if None)."""
        n = len(values) // spec.GRAD_BITS
        mask = Const((1 << n) - 1, n) if mask is None else mask
        m.d.comb += [s.gmem.wr.addr.eq(word),
                     s.gmem.wr.data.eq(values.as_unsigned().replicate(s.P // n)),
                     s.gmem.wr.en.eq(mask << lane)]
        m.d.sync += s.count("grad_writes", popcount(mask) if n > 1 else mask)

    @staticmethod
    def _delay(m, s, name, stage, values, stages, valid=None, w=None):
        """`stage` and `values` `stages` registers later (the stage's weight address
        included). `valid`, `w`: what the first register takes for the stage's valid and
        weight address instead of the stage's own (with no registers: what the returned
        stage carries in this cycle). Returns (the stage, the values, whether any of the
        added registers holds a step)."""
        if stages == 0 and (valid is not None or w is not None):
            now = _Stage(m, f"{name}0", s.P, len(stage.w), len(stage.o))
            m.d.comb += [now.valid.eq(stage.valid if valid is None else valid),
                         now.first.eq(stage.first), now.last.eq(stage.last),
                         now.w.eq(stage.w if w is None else w), now.o.eq(stage.o),
                         now.live.eq(stage.live)]
            stage = now
        busy = []
        for n in range(1, stages + 1):
            later = _Stage(m, f"{name}{n}", s.P, len(stage.w), len(stage.o))
            s.chain(m, stage, later)
            m.d.sync += later.w.eq(stage.w if w is None or n > 1 else w)
            if valid is not None and n == 1:
                m.d.sync += later.valid.eq(valid)
            held = [Signal.like(v, name=f"{name}{n}_v{i}") for i, v in enumerate(values)]
            m.d.sync += [h.eq(v) for h, v in zip(held, values)]
            stage, values = later, held
            busy.append(later.valid)
        return stage, values, Cat(*busy).any()

    def _meet_broadcast(self, m, s, name, stage, values):
        """`stage` and `values` (the step's flags and its lanes' operands, taken in the
        cycle the weight memory's data arrives) Pipeline.broadcast cycles later, where they
        meet the weight in the broadcast register (s.w_bcast)."""
        return self._delay(m, s, f"{name}b", stage, values, self.pipe.broadcast)

    # ---------------------------------------------------------------- forward, logits
    def _forward(self, m, s):
        P, LOGP = s.P, self.logp
        on = s.forwardish
        last_k = s.last[INNER]
        with m.If(on & s.nest.valid & last_k & (s.reserve != 0)):
            m.d.comb += s.stall.eq(1)
        with m.If(s.issue & on & last_k):
            m.d.sync += s.reserve.eq(P // s.D + self.pipe.writeback_gap - 1)
        live0 = s.live_lanes
        s1 = _Stage(m, "f1", P, len(s.addr["w"]), len(s.addr["o"]))
        s2 = _Stage(m, "f2", P, 0, len(s.addr["o"]))
        s3 = _Stage(m, "f3", P, 0, len(s.addr["o"]))
        s4 = _Stage(m, "f4", P, 0, len(s.addr["o"]))
        s5 = _Stage(m, "f5", P, 0, len(s.addr["o"]))
        on2, act2 = Signal(P), Signal(P * spec.ACT_BITS)
        m.d.sync += [s1.valid.eq(s.issue & on), s1.first.eq(s.first[INNER]), s1.last.eq(last_k),
                     s1.w.eq(s.addr["w"]), s1.o.eq(s.addr["o"]), s1.live.eq(live0)]
        with m.If(s.issue & on):
            m.d.sync += s.count("act_reads", s.live_count)
        # t+1: gate the zero lanes; t+1+G (G = Pipeline.gate registers later): read the weight
        # unless every lane is gated
        nonzero = Cat(*[s.amem.rd.data.word_select(i, spec.ACT_BITS) != 0 for i in range(P)])
        on1 = s1.live & Mux(self.zero_skip, nonzero, s.all_lanes)
        sg, (on_g, act_g), sg_busy = self._delay(m, s, "fg", s1, [on1, s.amem.rd.data],
                                                 self.pipe.gate)
        with m.If(sg.valid):
            m.d.comb += [s.w_rd.addr.eq(sg.w), s.w_rd.en.eq(on_g != 0)]
        m.d.sync += [s2.valid.eq(sg.valid), s2.first.eq(sg.first), s2.last.eq(sg.last),
                     s2.o.eq(sg.o), s2.live.eq(sg.live), on2.eq(on_g), act2.eq(act_g)]
        with m.If(s2.valid):
            m.d.sync += [s.count("mac_forward", popcount(on2)),
                         s.count("skip_zero", popcount(s2.live & ~on2)),
                         s.count("weight_reads", on2 != 0)]
        # t+2+G: the weight read; t+2+G+B: the weight (the broadcast register's) to every
        # lane, each lane its activation
        sb, (on_b, act_b), sb_busy = self._meet_broadcast(m, s, "f", s2, [on2, act2])
        with m.If(sb.valid):
            for i in range(P):
                m.d.comb += [s.lanes.operand_a(i).eq(s.w_bcast.as_signed()),
                             s.lanes.operand_b(i).eq(act_b.word_select(i, spec.ACT_BITS))]
            m.d.comb += s.lanes.b_zero.eq(~on_b)
        s.in_flight.append(s1.valid | sg_busy | s2.valid | sb_busy | s3.valid | s4.valid
                           | s5.valid)
        s.chain(m, sb, s3)
        s.chain(m, s3, s4)
        m.d.sync += [s5.valid.eq(s4.valid & s4.last), s5.o.eq(s4.o), s5.live.eq(s4.live)]
        # snap_latency - 1: accumulate; snap_latency: the sums to the writeback unit
        with m.If(s4.valid):
            m.d.comb += [s.lanes.acc_add.eq(s.all_lanes), s.lanes.acc_first.eq(s4.first)]
        with m.If(s5.valid):
            m.d.comb += [s.lanes.snap.eq(1), s.wb.start.eq(1), s.wb.last.eq(s.is_["logits"]),
                         s.wb.shift.eq(s.shift), s.wb.lanes_on.eq(s5.live),
                         s.wb.act_addr.eq(s5.o << LOGP), s.wb.grad_word.eq(s5.o)]
        s.in_flight.append(s.wb.busy)

    # ---------------------------------------------------------------- argmax
    def _argmax(self, m, s):
        P, LOGP = s.P, self.logp
        on = s.is_["argmax"]
        v1, v2 = Signal(name="am1_valid"), Signal(name="am2_valid")
        f1, f2, l1, l2 = (Signal(name=f"am_{n}") for n in ("f1", "f2", "l1", "l2"))
        # the class n (generator w) is below max_width and the sample o below max_batch
        # (the nest's limits in this kind, dataflow.limits): the stages carry only those bits
        n1, n2 = Signal(self.width_bits), Signal(self.width_bits)
        o1, o2 = Signal(self.label_bits), Signal(self.label_bits)
        pick = Signal(signed(spec.LOGIT_BITS))
        best = Signal(signed(spec.LOGIT_BITS))
        best_n = Signal(self.width_bits)
        s.in_flight.append(v1 | v2)
        live = s.issue & on & s.sample_live
        m.d.sync += [v1.eq(live), f1.eq(s.first[INNER]), l1.eq(s.last[INNER]),
                     n1.eq(s.addr["w"]), o1.eq(s.addr["o"])]
        with m.If(live):
            m.d.sync += s.count("grad_reads")
        with m.If(on):
            m.d.sync += s.pick_lane.eq(s.addr["o"][:LOGP])
        m.d.sync += [v2.eq(v1), f2.eq(f1), l2.eq(l1), pick.eq(s.lane_value), n2.eq(n1),
                     o2.eq(o1)]
        better = f2 | (pick > best)
        with m.If(v2 & better):
            m.d.sync += [best.eq(pick), best_n.eq(n2)]
        m.d.comb += [s.p_wr.addr.eq(o2), s.p_wr.data.eq(Mux(better, n2, best_n)),
                     s.p_wr.en.eq(v2 & l2)]
        with m.If(v2 & l2):
            m.d.sync += s.count("infer_samples")

    # ---------------------------------------------------------------- loss
    def _loss(self, m, s):
        """D = drain_lanes samples a step in D softmax-gradient units in lockstep, a lane
        block of S = P / D lanes each: step o's unit i takes sample o + i * S, in lane
        i * S + o % S (golden twin: ember.dataflow._loss). Started together on the same N,
        the units read the same logit word, each from its own block's lanes (an S-way
        multiplexer near them), and write their gradients to the same word in the same
        cycles, with a mask of the live samples (those below the batch)."""
        P, D, LOGD = s.P, s.D, s.logd
        S, LOGS = P // D, ceil_log2(P // D)
        on = s.is_["loss"]
        units, lead = s.loss_units, s.loss
        o = s.addr["o"]
        t = o[:LOGS] if LOGS else Const(0, 1)
        # unit i's sample and whether it is in the batch; a step whose first is not is dead
        live = Cat(*[below(o + (i << LOGS), self.batch) if i else below(o, self.batch)
                     for i in range(D)])
        # the D labels, read one a cycle in LABEL (a shift register: the first is labels[0])
        labels = [Signal(spec.LABEL_BITS, name=f"label{i}") for i in range(D)]
        li = Signal(range(D))
        # each unit's logit: its block's lane t of the read word (one P-way multiplexer on
        # one unit, shared with argmax; an S-way one a unit on more)
        pick = Signal(range(S))
        for i, unit in enumerate(units):
            value = s.lane_value if D == 1 else Array(
                s.gmem.rd.data.word_select(i * S + j, spec.GRAD_BITS)
                for j in range(S))[pick].as_signed()
            m.d.comb += [unit.classes.eq(s.N), unit.label.eq(labels[i]),
                         unit.rd_data.eq(value)]
        with m.If(lead.rd_en):
            m.d.sync += [s.count("grad_reads", popcount(live))]
            m.d.sync += s.pick_lane.eq(o[:self.logp]) if D == 1 else pick.eq(t)
        with m.If(on):
            m.d.comb += s.gmem.rd.addr.eq(s.addr["a"] + lead.rd_addr)
        with m.If(lead.wr_en):
            with m.If(s.addr["a"] + lead.wr_addr < self.build.grad_words):
                word = s.addr["a"] + lead.wr_addr
                if D == 1:
                    self._grad_write(m, s, word, o[:self.logp], lead.wr_data)
                else:
                    # each unit's gradient to its block's lanes; lane i * S + t written
                    spread = Cat(*[Cat(live[i], Const(0, S - 1)) for i in range(D)])
                    m.d.comb += [s.gmem.wr.addr.eq(word),
                                 s.gmem.wr.data.eq(Cat(*[units[lane // S].wr_data.as_unsigned()
                                                         for lane in range(P)])),
                                 s.gmem.wr.en.eq(spread << t)]
                    m.d.sync += s.count("grad_writes", popcount(live))
            with m.Else():
                m.d.sync += s.fault.eq(1)
        # the run's labels (in its input bank on a resident build): sample o's read in
        # WAIT, o + (i + 1) * S's in LABEL's cycle i
        in_label = Signal()
        with m.If(on):
            m.d.comb += s.l_rd.addr.eq(self._banked(
                (o + Mux(in_label, (li + 1) << LOGS, 0))[:self.label_bits], self.input_bank))
        with m.FSM(name="loss_steps"):
            with m.State("WAIT"):
                m.d.sync += li.eq(0)
                # every step waits here a cycle, a dead one then taken in DEAD: whether a
                # step is live (a compare with the batch) then decides the next state, not
                # the stall, whose path runs on to the loop nest's step memories
                with m.If(on & s.nest.valid):
                    m.d.comb += s.stall.eq(1)
                    with m.If(live[0]):
                        m.next = "LABEL"
                    with m.Else():
                        m.next = "DEAD"
            with m.State("DEAD"):
                m.next = "WAIT"
            with m.State("LABEL"):
                m.d.comb += [s.stall.eq(1), in_label.eq(1)]
                m.d.sync += [a.eq(b) for a, b in zip(labels, labels[1:] + [s.l_rd.data])]
                m.d.sync += li.eq(li + 1)
                with m.If(li == D - 1):
                    m.next = "GO"
            with m.State("GO"):
                m.d.comb += [s.stall.eq(1)] + [unit.start.eq(1) for unit in units]
                m.next = "RUN"
            with m.State("RUN"):
                with m.If(lead.done):
                    right = Cat(*[unit.correct for unit in units]) & live
                    m.d.sync += [s.correct.eq(s.correct + popcount(right)),
                                 s.count("loss_elements", s.N * popcount(live))]
                    m.next = "WAIT"
                with m.Else():
                    m.d.comb += s.stall.eq(1)

    # ---------------------------------------------------------------- select
    def _select(self, m, s):
        """ssProp's scores and selection, then the kept list (every channel when dense)."""
        bld, P = self.build, s.P
        on = s.is_["select"]
        # scores: sum over the live lanes of |dY| of channel j, accumulated over the blocks
        v1, v2, v3 = Signal(name="sc1_valid"), Signal(name="sc2_valid"), Signal(name="sc3_valid")
        last1, last2, first1, first2 = (Signal(name=f"sc_{n}") for n in ("l1", "l2", "f1", "f2"))
        live1 = Signal(P)
        j = Signal(range(bld.max_width + 1))
        score = Signal(32)
        scoring = on & ~s.dense
        with m.If(scoring):
            m.d.comb += s.gmem.rd.addr.eq(s.addr["g"])
        m.d.sync += [v1.eq(s.issue & scoring), first1.eq(s.first[INNER]),
                     last1.eq(s.last[INNER]), live1.eq(s.live_lanes)]
        mags = [Mux(live1[i], abs(s.gmem.rd.data.word_select(i, spec.GRAD_BITS).as_signed()), 0)
                for i in range(P)]
        # the live lanes' sum in dataflow.SCORE_TREE_STAGES registered levels; the step's
        # flags wait for it
        total = pipelined_tree_sum(m, mags, dataflow.SCORE_TREE_STAGES, score.shape(),
                                   "sc_tree")
        flags, waiting = (v1, first1, last1), []
        for n in range(1, dataflow.SCORE_TREE_STAGES):
            later = tuple(Signal(name=f"sc1_{n}_{f}") for f in ("valid", "f", "l"))
            m.d.sync += [b.eq(a) for a, b in zip(flags, later)]
            flags = later
            waiting.append(later[0])
        m.d.sync += [v2.eq(flags[0]), first2.eq(flags[1]), last2.eq(flags[2])]
        scoring_busy = Signal()
        m.d.comb += scoring_busy.eq(Cat(v1, v2, v3, *waiting).any())
        s.in_flight.append(scoring_busy)
        with m.If(v1 & ~s.random):
            m.d.sync += s.count("grad_reads", popcount(live1))
        with m.If(v2):
            m.d.sync += score.eq(Mux(first2, 0, score) + total)
        m.d.sync += v3.eq(v2 & last2)
        if s.has_ssprop:
            sel = s.sel
            m.d.comb += [sel.channels.eq(s.N), sel.keep.eq(s.keep)]
            with m.If(v3):
                m.d.comb += [sel.score_index.eq(j), sel.score_we.eq(1),
                             sel.score_data.eq(Mux(s.random, s.lfsr_state, score))]
                m.d.sync += j.eq(j + 1)
            if hasattr(s, "lfsr"):
                m.d.comb += s.lfsr.step.eq(v2 & last2 & s.random)
        # after the walk: the selector, then the kept list
        lj = Signal(range(bld.max_width + 2))        # to N + 1, past the last channel
        lj_valid = Signal()
        jk = Signal(self.w_bits + 1)
        kept_bit = Signal()
        with m.FSM(name="select_steps"):
            with m.State("WALK"):
                with m.If(on & s.phase_started):
                    m.d.sync += [j.eq(0), lj.eq(0), lj_valid.eq(0), jk.eq(0),
                                 s.kept_count.eq(0)]
                    m.next = "SCORES"
            with m.State("SCORES"):
                with m.If(~s.busy | s.fault):
                    m.next = "WALK"
                with m.Elif(~s.nest.busy & ~s.nest.valid & ~scoring_busy):
                    if s.has_ssprop:
                        m.d.comb += s.sel.start.eq(1)
                        m.next = "CHOOSE"
                    else:
                        m.next = "LIST"
            if s.has_ssprop:
                with m.State("CHOOSE"):
                    with m.If(s.sel.done):
                        m.next = "LIST"
                    with m.If(~s.busy):
                        m.next = "WALK"
            with m.State("LIST"):
                # channel lj's mask bit is read this cycle, the previous one's arrives
                if s.has_ssprop:
                    m.d.comb += [s.sel.kept_index.eq(lj), kept_bit.eq(s.sel.kept)]
                else:
                    m.d.comb += kept_bit.eq(1)
                m.d.sync += [lj.eq(lj + 1), lj_valid.eq(below(lj, s.N))]
                with m.If(lj_valid):
                    with m.If(kept_bit):
                        if self.kept_list:
                            m.d.comb += [s.k_wr.addr.eq(s.kept_count),
                                         s.k_wr.data.eq(Cat((lj - 1)[:self.width_bits],
                                                            jk[:self.w_bits])),
                                         s.k_wr.en.eq(1)]
                        m.d.sync += s.kept_count.eq(s.kept_count + 1)
                    if self.kept_list:
                        m.d.sync += jk.eq(jk + s.K)
                with m.If(~lj_valid & (lj > s.N)):
                    m.d.comb += s.select_done.eq(1)
                    m.next = "WALK"

    # ---------------------------------------------------------------- input gradient
    def _input_grad(self, m, s):
        P = s.P
        on = s.is_["input_grad"]
        with m.If(on & s.nest.valid & s.last[INNER] & (s.reserve != 0)):
            m.d.comb += s.stall.eq(1)
        with m.If(s.issue & on & s.last[INNER]):
            m.d.sync += s.reserve.eq(P // s.D)
        i1 = _Stage(m, "ig1", P, len(s.addr["w"]), len(s.addr["o"]))
        g1 = Signal(len(s.addr["g"]))
        i2 = _Stage(m, "ig2", P, 0, len(s.addr["o"]))
        i3 = _Stage(m, "ig3", P, 0, len(s.addr["o"]))
        i4 = _Stage(m, "ig4", P, 0, len(s.addr["o"]))
        i5 = _Stage(m, "ig5", P, 0, len(s.addr["o"]))
        relu = Signal(P)                    # the lanes whose activation is positive, per (s, k)
        on2 = Signal(P)
        relu2, relu3, relu4, relu5 = (Signal(P, name=f"ig_relu{n}") for n in range(2, 6))
        s.in_flight.append(i1.valid | i2.valid | i3.valid | i4.valid | i5.valid)
        m.d.sync += [i1.valid.eq(s.issue & on), i1.first.eq(s.first[INNER]),
                     i1.last.eq(s.last[INNER]),
                     i1.w.eq(s.addr["w"]), g1.eq(s.addr["g"]), i1.o.eq(s.addr["o"]),
                     i1.live.eq(s.live_lanes)]
        # t+1: the kept channel's j and j*K; the activation word's signs at the first c
        positive = Cat(*[s.amem.rd.data.word_select(i, spec.ACT_BITS) != 0 for i in range(P)])
        relu_now = Mux(i1.first, positive, relu)
        with m.If(i1.valid & i1.first):
            m.d.sync += [relu.eq(positive), s.count("act_reads", popcount(i1.live))]
        on1 = i1.live & Mux(self.zero_skip, relu_now, s.all_lanes)
        w_final = i1.w + s.kept_jk
        g_final = g1 + s.kept_j
        with m.If(i1.valid):
            with m.If((w_final >= self.weight_depth) | (g_final >= self.build.grad_words)):
                m.d.comb += s.bad_address.eq(1)
        # t+1+G: W[j, k] (unless every lane is gated) and dY read, from registers
        ig, (on_g, relu_g, g_g), ig_busy = self._delay(
            m, s, "igg", i1, [on1, relu_now, g_final[:len(g1)]], self.pipe.gate,
            valid=i1.valid & ~s.bad_address, w=w_final)
        s.in_flight.append(ig_busy)
        with m.If(ig.valid):
            m.d.comb += [s.w_rd.addr.eq(ig.w), s.w_rd.en.eq(on_g != 0),
                         s.gmem.rd.addr.eq(g_g)]
        m.d.sync += [i2.valid.eq(ig.valid), i2.first.eq(ig.first), i2.last.eq(ig.last),
                     i2.o.eq(ig.o), i2.live.eq(ig.live), on2.eq(on_g), relu2.eq(relu_g)]
        with m.If(i2.valid):
            m.d.sync += [s.count("mac_input_grad", popcount(on2)),
                         s.count("skip_zero", popcount(i2.live & ~on2)),
                         s.count("weight_reads", on2 != 0),
                         s.count("grad_lane_reads", popcount(on2))]
        # t+2+G: W[j, k] and dY; t+2+G+B: the weight (the broadcast register's) to every
        # lane with its sample's dY[b, j]
        ib, (on_b, relu_b, dy_b), ib_busy = self._meet_broadcast(
            m, s, "ig", i2, [on2, relu2, s.gmem.rd.data])
        s.in_flight.append(ib_busy)
        with m.If(ib.valid):
            for i in range(P):
                m.d.comb += [s.lanes.operand_a(i).eq(s.w_bcast.as_signed()),
                             s.lanes.operand_b(i).eq(
                                 dy_b.word_select(i, spec.GRAD_BITS).as_signed())]
            m.d.comb += s.lanes.b_zero.eq(~on_b)
        s.chain(m, ib, i3)
        s.chain(m, i3, i4)
        m.d.sync += [relu3.eq(relu_b), relu4.eq(relu3), i5.valid.eq(i4.valid & i4.last),
                     i5.o.eq(i4.o), i5.live.eq(i4.live), relu5.eq(relu4)]
        with m.If(i4.valid):
            m.d.comb += [s.lanes.acc_add.eq(s.all_lanes), s.lanes.acc_first.eq(i4.first)]
        # snap_latency: the sums into the snapshot; the drain writes D lanes a cycle, lanes
        # cD .. cD + D - 1 to the entries from o rounded down to a multiple of D (the
        # compiler's o is a multiple of P): word o // D + c of the D scratch banks
        D, LOGD = s.D, s.logd
        d_busy = Signal()
        d_block = Signal(range(P // D))
        d_relu, d_live = Signal(P), Signal(P)
        d_addr = Signal(len(s.addr["o"]) - LOGD)
        s.in_flight.append(d_busy)
        with m.If(i5.valid):
            m.d.comb += s.lanes.snap.eq(1)
            m.d.sync += [d_busy.eq(1), d_block.eq(0), d_relu.eq(relu5), d_live.eq(i5.live),
                         d_addr.eq(i5.o[LOGD:])]
        dx = [Mux(d_relu[i], clamp_signed(s.lanes.heads[i], spec.DX_BITS), 0)
              for i in range(D)]
        live = d_live[:D]
        with m.If(d_busy):
            m.d.comb += [s.lanes.snap_drain.eq(1), s.req.track.eq(live)]
            m.d.comb += [s.req.dx[i].eq(dx[i]) for i in range(D)]
            with m.If(live != 0):
                with m.If(d_addr + d_block < self.build.scratch_entries // D):
                    m.d.comb += [s.s_wr.addr.eq(d_addr + d_block),
                                 s.s_wr.data.eq(Cat(*[v.as_unsigned() for v in dx])),
                                 s.s_wr.en.eq(live)]
                with m.Else():
                    m.d.sync += s.fault.eq(1)
                m.d.sync += s.count("grad_writes", popcount(live))
            m.d.sync += [d_block.eq(d_block + 1), d_relu.eq(d_relu >> D),
                         d_live.eq(d_live >> D)]
            with m.If(d_block == P // D - 1):
                m.d.sync += d_busy.eq(0)

    # ---------------------------------------------------------------- requantize
    def _requant(self, m, s):
        """D = drain_lanes samples a step: the D scratch entries of one bank word (entries
        a .. a + D - 1, a rounded down to a multiple of D) through D shifters into lanes
        a % P .. + D - 1 of gradient word o; the samples past the batch are masked."""
        P, D, LOGD = s.P, s.D, s.logd
        on = s.is_["requant"]
        # a stage per cycle from the read data to the write (Pipeline.requant_latency)
        stages = [(Signal(D, name=f"rq{n}_live"), Signal(len(s.addr["o"]), name=f"rq{n}_o"),
                   Signal(range(P), name=f"rq{n}_lane"))
                  for n in range(1, self.pipe.requant_latency + 1)]
        s.in_flight.append(Cat(*[v for v, _, _ in stages]) != 0)
        v1, o1, lane1 = stages[0]
        m.d.sync += [v1.eq(Mux(s.issue & on, s.live_lanes[:D], 0)), o1.eq(s.addr["o"]),
                     lane1.eq(s.addr["a"][LOGD:self.logp] << LOGD)]
        for (va, oa, la), (vb, ob, lb) in zip(stages, stages[1:]):
            m.d.sync += [vb.eq(va), ob.eq(oa), lb.eq(la)]
        with m.If(v1 != 0):
            for i, shifter in enumerate(s.shifters):
                entry = s.s_rd.data.word_select(i, spec.DX_BITS).as_signed()
                m.d.comb += [shifter.en.eq(1), shifter.value.eq(entry),
                             shifter.shift.eq(s.req.shift)]
            m.d.sync += s.count("grad_reads", popcount(v1))
        # requant_latency cycles after the step: the requantizer's dY of its entries
        v_wr, o_wr, lane_wr = stages[-1]
        with m.If(v_wr != 0):
            self._grad_write(m, s, o_wr, lane_wr, Cat(*[dy.as_unsigned() for dy in s.req.dy]),
                             v_wr)

    # ---------------------------------------------------------------- weight gradient
    def _weight_grad(self, m, s):
        """The weight gradient of each (j, k) of a group of GRAD_HOLD inputs across the lanes
        and blocks (the block's dY word read once for the group); PSG's passes."""
        P, R = s.P, spec.GRAD_HOLD
        on = s.gradish
        BL, PL = dataflow.GRAD_BLOCK_LEVEL, dataflow.PASS_LEVEL
        low_mode = s.is_["psg_max"] | (self.psg & ~s.pass1_at)
        # t: the kept channel (c_idx) and the activation word; o is the input's place in
        # its group (its accumulator)
        # o is below GRAD_HOLD (the nest's limit of o in these kinds, dataflow.limits), so
        # the stages carry its low bits only: each stage bit is a logic cell on the iCE40
        if {dataflow.limits(k, self.build)["o"] for k in ("weight_grad", "psg_max")} != {R}:
            raise ValueError("the weight gradient's o must be limited to its group's inputs")
        o_bits = ceil_log2(R)
        w1 = _Stage(m, "wg1", P, len(s.addr["w"]), o_bits)
        g1 = Signal(len(s.addr["g"]))
        p1, low1, fb1, lb1 = (Signal(name=f"wg1_{n}") for n in ("pass", "low", "fb", "lb"))
        # the second pass's first step waits for the decisions of the group's first
        pass1 = s.last[PL] & (s.passes == 2)
        group_start = s.first[BL] & s.first[INNER]
        with m.If(on & s.nest.valid & pass1 & group_start & ~s.decided):
            m.d.comb += s.stall.eq(1)
        with m.If(s.issue & on & pass1 & group_start):
            m.d.sync += s.decided.eq(0)
        m.d.comb += s.pass1_at.eq(pass1)
        m.d.sync += [w1.valid.eq(s.issue & on), w1.first.eq(s.first[INNER]),
                     w1.last.eq(s.last[INNER]), w1.w.eq(s.addr["w"]), g1.eq(s.addr["g"]),
                     w1.o.eq(s.addr["o"]), w1.live.eq(s.live_lanes),
                     p1.eq(pass1), low1.eq(low_mode), fb1.eq(s.first[BL]), lb1.eq(s.last[BL])]
        # t+1: dY's word of the kept channel (the group's first input of a block); the gates
        g_final = g1 + s.kept_j
        w_final = w1.w + s.kept_jk
        nonzero = Cat(*[s.amem.rd.data.word_select(i, spec.ACT_BITS) != 0 for i in range(P)])
        skipped = p1 & s.confident.bit_select(w1.o, 1)     # a confident (j, k): no 2nd pass
        on1 = Mux(skipped, 0, w1.live & Mux(self.zero_skip, nonzero, s.all_lanes))
        with m.If(w1.valid):
            m.d.comb += s.gmem.rd.addr.eq(g_final)
            with m.If((w_final >= self.weight_depth) | (g_final >= self.build.grad_words)):
                m.d.comb += s.bad_address.eq(1)
        # the gradient memory reads only at a group's first input of a block: its read
        # register then holds the block's dY word for the group's other inputs (no copy)
        with m.If(on):
            m.d.comb += s.gmem.rd.en.eq(w1.valid & w1.first)
        w2 = _Stage(m, "wg2", P, len(s.addr["w"]), o_bits)
        on2, act2 = Signal(P), Signal(P * spec.ACT_BITS)
        p2, low2, skip2, fb2, lb2 = (Signal(name=f"wg2_{n}")
                                     for n in ("pass", "low", "skip", "fb", "lb"))
        m.d.sync += [w2.valid.eq(w1.valid & ~s.bad_address), w2.first.eq(w1.first),
                     w2.last.eq(w1.last), w2.w.eq(w_final), w2.o.eq(w1.o), w2.live.eq(w1.live),
                     on2.eq(on1), act2.eq(s.amem.rd.data), p2.eq(p1), low2.eq(low1),
                     skip2.eq(skipped), fb2.eq(fb1), lb2.eq(lb1)]
        # t+2: the dY word (read at the group's first input of the block, held by the
        # memory since); operands: dY[b, j] and A[b, k], or their high bits (PSG's prediction)
        dy_word = s.gmem.rd.data
        with m.If(w2.valid & w2.first):
            # counted when a pass needs the word: PSG's second pass of a group that is
            # confident everywhere reads nothing
            with m.If(~(p2 & ~s.uncertain_any)):
                with m.If(low2):
                    m.d.sync += s.count("grad_msb_lane_reads", popcount(w2.live))
                with m.Else():
                    m.d.sync += s.count("grad_lane_reads", popcount(w2.live))
        with m.If(w2.valid):
            for i in range(P):
                dy = dy_word.word_select(i, spec.GRAD_BITS).as_signed()
                a = act2.word_select(i, spec.ACT_BITS)
                mag = (abs(dy) >> (spec.GRAD_BITS - spec.PSG_GRAD_MSBS)).as_signed()
                hi_dy = Mux(dy < 0, -mag, mag)
                hi_a = a >> (spec.ACT_BITS - spec.PSG_ACT_MSBS)
                m.d.comb += [s.lanes.operand_a(i).eq(Mux(low2, hi_dy, dy)),
                             s.lanes.operand_b(i).eq(Mux(low2, hi_a, a))]
            m.d.comb += s.lanes.b_zero.eq(~on2)
            with m.If(~skip2):
                lanes_live = popcount(w2.live)
                with m.If(low2):
                    m.d.sync += [s.count("mac_weight_grad_low", popcount(on2)),
                                 s.count("act_msb_reads", lanes_live)]
                with m.Else():
                    m.d.sync += [s.count("mac_weight_grad", popcount(on2)),
                                 s.count("act_reads", lanes_live)]
            # zero skips: once per (j, k), in its first pass (not in psg_max)
            with m.If(~p2 & s.is_["weight_grad"]):
                m.d.sync += s.count("skip_zero", popcount(w2.live & ~on2))
        # t+3, t+4: the products; the tree's levels; the sum at t + grad_sum_latency
        fields = (("valid", 1), ("fb", 1), ("lb", 1), ("last", 1), ("w", len(s.addr["w"])),
                  ("o", max(o_bits, 1)), ("pass", 1), ("on", range(P + 1)))
        stages = [{f: Signal(shape, name=f"wg{n}_{f}") for f, shape in fields}
                  for n in range(3, self.pipe.grad_sum_latency + 1)]
        first_values = {"valid": w2.valid, "fb": fb2, "lb": lb2, "last": w2.last, "w": w2.w,
                        "o": w2.o, "pass": p2, "on": popcount(on2)}
        m.d.sync += [stages[0][f].eq(v) for f, v in first_values.items()]
        for sa, sb in zip(stages, stages[1:]):
            m.d.sync += [sb[f].eq(sa[f]) for f, _ in fields]
        s.in_flight.append(w1.valid | w2.valid | Cat(*[st["valid"] for st in stages]).any())
        summed = stages[-1]
        # the update reads W[j, k] UPDATE_READ_LEAD cycles before its sum, so its read and
        # its write (3 cycles after the sum) are GRAD_HOLD cycles apart: a group's GRAD_HOLD
        # updates in a row then read and write in separate cycles (_update_stall)
        lead = dataflow.UPDATE_READ_LEAD
        if not 0 <= lead <= self.pipe.grad_sum_latency - 3:
            raise ValueError(f"the update's read {lead} cycles before the weight gradient's "
                             f"sum is not in a stage that holds its address")
        early = stages[-1 - lead]
        m.d.comb += [s.upd_read.eq(early["valid"] & early["lb"] & s.is_["weight_grad"]
                                   & (~self.psg | early["pass"])),
                     s.upd_read_addr.eq(early["w"])]
        self._update_stall(m, s, s.is_["weight_grad"] & s.last[BL] & (~self.psg | pass1))
        tree = pipelined_tree_sum(m, [s.lanes.product(i) for i in range(P)],
                                  self.pipe.grad_tree, signed(s.GACC), "wg_tree")
        # t + grad_sum_latency: the input's accumulator over the blocks, and its live MACs
        # (PSG's skips)
        g_now = Signal(signed(s.GACC), name="wg_total")
        m.d.comb += g_now.eq(Mux(summed["fb"], 0, self._accumulator(m, s, stages, g_now))
                             + tree)
        macs = Array(Signal(range(2 * self.build.max_batch + 1), name=f"wg_macs{i}")
                     for i in range(R))
        macs_now = Mux(summed["fb"], 0, macs[summed["o"]]) + summed["on"]
        with m.If(summed["valid"]):
            m.d.sync += macs[summed["o"]].eq(macs_now)
        # the end of a pass over the blocks of (j, k)
        with m.If(summed["valid"] & summed["lb"]):
            with m.If(s.is_["psg_max"]):
                with m.If(abs(g_now) > s.largest):
                    m.d.sync += s.largest.eq(abs(g_now))
            with m.Elif(self.psg & ~summed["pass"]):
                # the prediction: confident where |pred| > tau (the sign steps it next pass)
                sure = abs(g_now) > s.tau
                m.d.sync += [s.confident.bit_select(summed["o"], 1).eq(sure),
                             s.pred_negative.bit_select(summed["o"], 1).eq(g_now < 0),
                             s.uncertain_any.eq(Mux(summed["o"] == 0, 0, s.uncertain_any) | ~sure)]
                with m.If(sure):
                    m.d.sync += s.count("skip_psg", macs_now)
                with m.If(summed["last"]):
                    m.d.sync += s.decided.eq(1)
            with m.Else():
                m.d.comb += [s.upd_start.eq(1), s.upd_addr.eq(summed["w"]), s.upd_value.eq(g_now),
                             s.upd_sure.eq(s.confident.bit_select(summed["o"], 1)),
                             s.upd_pred_negative.eq(s.pred_negative.bit_select(summed["o"], 1))]

    def _accumulator(self, m, s, stages, g_now):
        """The sum so far of the summed stage's input (its o, one of GRAD_HOLD accumulators)
        over the blocks before this one; `g_now`, the sum with this block's, is written back
        where the stage is valid.

        On a build whose step memories are block RAM (the iCE40's, ``Build.weight_spram``) the
        accumulators are the words of a block RAM, since GRAD_HOLD x GACC flip-flops loaded
        from one adder each take a logic cell of their own. The word is read a cycle ahead,
        at the stage before the sum's (the stages move every cycle, so that stage's o is the
        summed stage's in the next cycle). A read of the word written in the same cycle (a
        group of one input) takes the written sum from a register instead, since the block
        RAM then answers with the word before the write. Other builds keep registers."""
        R, summed = spec.GRAD_HOLD, stages[-1]
        if not self.build.weight_spram:
            acc = Array(Signal(signed(s.GACC), name=f"wg_sum{i}") for i in range(R))
            with m.If(summed["valid"]):
                m.d.sync += acc[summed["o"]].eq(g_now)
            return acc[summed["o"]]
        if len(stages) < 2:
            raise ValueError("the weight gradient's accumulators in block RAM are read at "
                             "the stage before the sum's")
        before = stages[-2]
        m.submodules.wg_acc = mem = Memory(shape=signed(s.GACC), depth=R, init=[],
                                           attrs={"ram_style": "block"})
        wr, rd = mem.write_port(), mem.read_port(transparent_for=())
        m.d.comb += [rd.addr.eq(before["o"]), wr.addr.eq(summed["o"]), wr.data.eq(g_now),
                     wr.en.eq(summed["valid"])]
        written = Signal.like(g_now, name="wg_written", reset_less=True)
        rewritten = Signal(name="wg_rewritten")
        m.d.sync += [written.eq(g_now),
                     rewritten.eq(summed["valid"] & (summed["o"] == before["o"]))]
        return Mux(rewritten, written, rd.data)

    def _update_stall(self, m, s, update_step):
        """The single-port rule on a weight_spram build: a weight-gradient step that ends in
        an update (`update_step`, at the nest) waits while the update issued
        dataflow.UPDATE_WRITE_DISTANCE cycles before it would write in the cycle this one
        reads. A group's updates (at most GRAD_HOLD in a row, then the next group's other
        blocks or first pass) never wait; one block of samples, or a remainder group, costs
        at most a cycle per update (dataflow.phase_cycle_bound)."""
        if not self.build.weight_spram:
            return                      # a generic memory reads and writes in one cycle
        distance = dataflow.UPDATE_WRITE_DISTANCE
        recent = Signal(distance)       # bit i: an update step was issued i + 1 cycles ago
        m.d.sync += recent.eq(Cat(s.issue & update_step, recent[:-1]))
        with m.If(s.nest.valid & update_step & recent[distance - 1]):
            m.d.comb += s.stall.eq(1)

    # ---------------------------------------------------------------- update
    def _update(self, m, s):
        """W[j, k] from its gradient: SGD W - round_shift(G, shift), or PSG's sign step
        W - sign * 2**step (the prediction's sign where it was confident); only a changed
        weight is written."""
        u1, u2, u3 = (Signal(name=f"up{n}_valid") for n in range(1, 4))
        a1, a2, a3 = (Signal(self.w_bits, name=f"up{n}_addr") for n in range(1, 4))
        neg1, neg2, zero1, zero2 = (Signal(name=f"up_{n}") for n in ("n1", "n2", "z1", "z2"))
        new3 = Signal(spec.WEIGHT_BITS)
        changed3 = Signal()
        s.in_flight.append(u1 | u2 | u3)
        with m.If(s.upd_start & ~self.psg):
            m.d.comb += [s.shifter.en.eq(1), s.shifter.value.eq(s.upd_value),
                         s.shifter.shift.eq(s.upd_shift)]
        m.d.sync += [u1.eq(s.upd_start), a1.eq(s.upd_addr),
                     neg1.eq(Mux(s.upd_sure, s.upd_pred_negative, s.upd_value < 0)),
                     zero1.eq(~s.upd_sure & (s.upd_value == 0)),
                     u2.eq(u1), a2.eq(a1), neg2.eq(neg1), zero2.eq(zero1), a3.eq(a2)]
        # the weight, read UPDATE_READ_LEAD cycles before upd_start, held until u2 (the
        # broadcast registers, idle in this phase, hold it first); u2: the new weight
        with m.If(s.upd_read):
            m.d.comb += [s.w_rd.addr.eq(s.upd_read_addr), s.w_rd.en.eq(1)]
            m.d.sync += s.count("weight_reads")
        old = s.w_rd.data
        for n in range(dataflow.UPDATE_READ_LEAD + 1):
            if n < len(s.w_bcast_regs):
                old = s.w_bcast_regs[n]
            else:
                reg = Signal.like(s.w_rd.data, name=f"up_old{n}", reset_less=True)
                m.d.sync += reg.eq(old)
                old = reg
        old = old.as_signed()
        step = Const(1, signed(spec.WEIGHT_BITS + 2)) << self.psg_step_shift
        sign_step = Mux(zero2, 0, Mux(neg2, -step, step))
        delta = Mux(self.psg, sign_step, s.shifter.out)
        new = clamp_signed(old - delta, spec.WEIGHT_BITS)
        # new != old, formed beside the saturation rather than after it: the weight stays
        # where it was only for a step of 0, or a step past the end the weight already is at
        top = (1 << (spec.WEIGHT_BITS - 1)) - 1
        changed = ((delta != 0) & ~((old == top) & (delta < 0))
                   & ~((old == -top - 1) & (delta > 0)))
        m.d.sync += [u3.eq(u2), new3.eq(new), changed3.eq(changed)]
        m.d.comb += s.upd_write.eq(u3 & changed3)
        with m.If(s.upd_write):
            m.d.comb += [s.w_wr.addr.eq(a3), s.w_wr.data.eq(new3), s.w_wr.en.eq(1)]
            m.d.sync += s.count("weight_writes")

    # ---------------------------------------------------------------- the program runner
    def _runner(self, m, s):
        bld = self.build
        ld = Signal(range(dataflow.PHASE_WORDS + 1))
        booked = Signal()                   # the select phase's bookkeeping is done
        trained = Signal()                  # the program ran a loss phase: a training step
        # while idle the bus reads the program (the memory window's program region)
        m.d.comb += s.prog_rd.addr.eq(Mux(s.busy, s.pc + ld, self.prog_rd_addr))
        # the phase's program words into its registers (the header and bounds) and the loop
        # nest's step memories (each generator's base and deltas): word i arrives when
        # ld = i + 1
        targets = [None] * (dataflow.HEADER_WORDS + dataflow.BOUND_WORDS)
        for g in s.gens:
            index = list(s.nest.generators).index(g)
            targets += [(index, s.nest.BASE_SLOT)] + [(index, i) for i in range(LEVELS)]
        word = s.prog_rd.data
        m.d.comb += s.nest.cfg_data.eq(word)
        layer_bit = (self.update_mask >> s.layer)[0]
        below = (self.update_mask & ((Const(1, bld.max_layers + 1) << s.layer) - 1)) != 0
        wgrad, igrad = layer_bit, (s.layer != 0) & below
        need = {"w": wgrad, "x": igrad}
        runs = Const(1)
        for kind, needs in dataflow.BACKWARD_KINDS.items():
            runs = Mux(s.is_[kind], Cat(*[need[n] for n in needs]).any(), runs)
        known = Cat(*[s.is_[k] for k in dataflow.build_kinds(bld) if k != "end"]).any()
        # the layer's bulk skips (SLU, ssProp), counted at its select phase, and the ssProp
        # keep count: products of two signals, on a serial multiplier (ember_hw.serial_mul)
        bk_max = bld.max_batch * bld.max_width
        b_bits = dataflow.book_multiplier_bits(bld)
        m.submodules.book_mul = mul = SerialMultiplier(max(bk_max.bit_length(), 16), b_bits)
        bk = Signal(range(bk_max + 1))
        dropped = Signal(range(bk_max * bld.max_width + 1))
        book_step = Signal(range(9))
        with m.FSM(name="runner"):
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [s.busy.eq(1), s.fault.eq(0), s.pc.eq(self.program_base),
                                 ld.eq(0), s.correct.eq(0), s.correction.eq(0),
                                 s.pending.eq(0)]
                    if hasattr(s, "lfsr"):
                        m.d.comb += [s.lfsr.load.eq(1), s.lfsr.seed.eq(self.lfsr_seed)]
                    m.next = "LOAD"
            with m.State("LOAD"):
                m.d.sync += ld.eq(ld + 1)
                with m.Switch(ld):
                    for w in range(dataflow.HEADER_WORDS):
                        with m.Case(1 + w):
                            wide = []
                            for name, (at, off, width) in dataflow.HEADER_FIELDS.items():
                                if at == w and name == "kind":
                                    m.d.sync += s.load_kind(word[off:off + width])
                                elif at == w:
                                    m.d.sync += s.header[name].eq(word[off:off + width])
                                if at == w and name in ("outputs", "inputs"):
                                    held = len(s.header[name])
                                    wide.append(word[off + held:off + width] != 0)
                            if wide:
                                m.d.sync += s.header_wide.eq(Cat(*wide).any())
                    B = dataflow.BOUND_BITS
                    for i in range(dataflow.BOUND_WORDS):
                        with m.Case(1 + dataflow.HEADER_WORDS + i):
                            for half, level in enumerate((2 * i, 2 * i + 1)):
                                if level < LEVELS:
                                    bound = word[half * B:(half + 1) * B]
                                    held = len(s.bounds[level])
                                    m.d.sync += [s.bounds[level].eq(bound),
                                                 s.bound_over[level].eq(bound[held:] != 0)]
                    for i, target in enumerate(targets):
                        if target is not None:
                            with m.Case(i + 1):
                                m.d.comb += [s.nest.cfg_en.eq(1),
                                             s.nest.cfg_gen.eq(target[0]),
                                             s.nest.cfg_slot.eq(target[1])]
                with m.If(ld == dataflow.HEADER_WORDS + 1):
                    # the header is in: the end, a kind this core refuses, a layer to skip
                    with m.If(s.is_["end"]):
                        m.next = "FINISH"
                    with m.Elif(~known | s.header_wide):
                        m.d.sync += s.fault.eq(1)
                        m.next = "FINISH"
                    with m.Elif(s.is_["select"] & ~booked):
                        m.next = "BOOK"
                    with m.Elif(~runs):
                        m.next = "NEXT"
                with m.If(ld == dataflow.PHASE_WORDS):
                    with m.If(s.bound_fault):
                        m.d.sync += s.fault.eq(1)
                        m.next = "FINISH"
                    with m.Else():
                        m.next = "START"
            with m.State("BOOK"):
                # a layer's backward pass begins: the correction of the layer above, and
                # its bulk skips: batch * N * K for each pass SLU leaves out, and
                # batch * (N - keep) * K for each pass ssProp thins; the products on the
                # serial multiplier, one after another (book_step: start, then wait)
                m.d.sync += [s.correction.eq(s.correction + s.pending), s.pending.eq(0),
                             s.largest.eq(0), book_step.eq(0)]
                m.next = "BOOK_MUL"
            with m.State("BOOK_MUL"):
                # (a, b) of each product, and what takes it when it is done; without the
                # ssProp unit every channel is kept, so neither the keep count nor the
                # dropped work is formed (dataflow.book_products)
                # batch * N * K is counted as it is formed, once for each pass SLU leaves out
                # (the input gradient's of layer 0 is never a pass)
                full = mul.product
                steps = [(s.K, self.batch, lambda: bk.eq(mul.product)),
                         (bk, s.N, lambda: s.count("skip_slu", Mux(wgrad, 0, full) + Mux(
                             igrad | (s.layer == 0), 0, full)))]
                if s.has_ssprop:
                    keep_raw = mul.product[8:]
                    keep = Mux(self.keep_q8 >= spec.KEEP_ONE, s.N,
                               Mux(keep_raw == 0, 1, keep_raw))
                    steps = ([(s.N, self.keep_q8, lambda: s.keep.eq(keep))] + steps
                             + [(bk, s.N - s.keep, lambda: dropped.eq(mul.product))])
                with m.Switch(book_step):
                    for i, (a, b, take) in enumerate(steps):
                        with m.Case(2 * i):
                            m.d.comb += [mul.a.eq(a), mul.b.eq(b), mul.start.eq(1)]
                            m.d.sync += book_step.eq(book_step + 1)
                        with m.Case(2 * i + 1):
                            with m.If(mul.done):
                                m.d.sync += [take(), book_step.eq(book_step + 1)]
                                if i == len(steps) - 1:
                                    m.next = "BOOK3"
            with m.State("BOOK3"):
                if s.has_ssprop:
                    with m.If(wgrad | igrad):
                        m.d.sync += s.count("skip_ssprop",
                                            Mux(wgrad & igrad, dropped << 1, dropped))
                m.next = "BOOK4"
            with m.State("BOOK4"):
                # the select phase runs if either pass does: its words again from the start
                m.d.sync += [ld.eq(0), booked.eq(1)]
                with m.If(runs):
                    m.next = "LOAD"
                with m.Else():
                    m.next = "NEXT"
            with m.State("START"):
                m.d.comb += [s.nest.start.eq(1), s.phase_started.eq(1)]
                m.d.sync += [s.c_idx.eq(0), s.decided.eq(0)]
                with m.If(s.is_["input_grad"]):
                    m.d.comb += s.req.clear.eq(1)
                with m.If(s.is_["requant"]):
                    m.d.comb += s.req.latch.eq(1)
                with m.If(s.is_["loss"]):
                    m.d.sync += trained.eq(1)
                m.next = "RUN"
            with m.State("RUN"):
                with m.If(s.nest_done):
                    with m.If(s.nest.fault):
                        m.d.sync += s.fault.eq(1)
                        m.next = "DRAIN"
                    with m.Elif(~s.is_["select"]):
                        m.next = "DRAIN"
                with m.If(s.select_done):
                    m.next = "DRAIN"
                with m.If(s.fault):
                    # a unit refused a step (the loss unit's write, the dX drain's entry):
                    # the walk stops here too, as for a kept channel's address
                    m.d.comb += s.abort.eq(1)
                    m.next = "DRAIN"
            with m.State("DRAIN"):
                with m.If(~s.busy_units):
                    with m.If(s.is_["requant"]):
                        m.d.sync += s.pending.eq(spec.WEIGHT_FRAC_BITS - s.req.shift)
                    with m.If(s.is_["psg_max"]):
                        m.d.sync += s.tau_relative.eq(s.largest >> self.psg_tau[:6])
                    m.next = "NEXT"
            with m.State("NEXT"):
                m.d.sync += [s.pc.eq(s.pc + dataflow.PHASE_WORDS), ld.eq(0), booked.eq(0)]
                with m.If(s.fault):
                    m.next = "FINISH"
                with m.Else():
                    m.next = "LOAD"
            with m.State("FINISH"):
                m.d.sync += [s.busy.eq(0), trained.eq(0)]
                with m.If(trained & ~s.fault):
                    m.d.sync += [s.count("batches"), s.count("samples", self.batch)]
                m.next = "IDLE"
        m.d.comb += [self.kind.eq(s.kind), self.layer.eq(s.layer)]
        # the update's own write, not the weight memory's enable: that one is the bus's while
        # idle, which would put the bus in the path of the stop unit's stop, which resets the
        # whole core (a net to every register of it)
        m.d.comb += self.weight_write.eq(s.upd_write & s.busy)
        if self.tally:
            self._tally(m, s)
        # a step whose kept channel leaves a memory: the walk stops, the step dies in its
        # stage (nothing is read or written for it), the run ends after the drain
        with m.If(s.bad_address):
            m.d.comb += s.abort.eq(1)
            m.d.sync += s.fault.eq(1)
        m.d.comb += [self.busy.eq(s.busy), self.fault.eq(s.fault), self.correct.eq(s.correct),
                     s.busy_units.eq(Cat(*s.in_flight).any())]

    def _tally(self, m, s):
        """The events and cycles per kind of the last run, for the core alone."""
        for name, ev in self.events.items():
            m.d.sync += ev.eq(ev + getattr(self.inc, name))
        for kind, cycles in self.kind_cycles.items():
            with m.If(s.busy & s.is_[kind]):
                m.d.sync += cycles.eq(cycles + 1)
        with m.If(self.start & ~s.busy):
            m.d.sync += [e.eq(0) for e in self.events.values()]
            m.d.sync += [c.eq(0) for c in self.kind_cycles.values()]


class _Core:
    """The signals the core's parts share."""

    def __init__(self, m, engine):
        bld = engine.build
        self.P = bld.lanes
        self.gens = dataflow.GENERATORS
        # the events of this cycle, registered into the inc port: every count() below
        # overrides this default (the statements that follow take priority)
        self.inc = engine.inc
        m.d.sync += self.inc.eq(0)
        self.busy, self.fault = Signal(), Signal()
        self.pc = Signal(ceil_log2(bld.program_words + 1))
        self.correct = Signal(range(bld.max_batch + 1))
        self.in_flight = []
        self.busy_units = Signal()
        self.reserve = Signal(range(self.P + engine.pipe.writeback_gap))
        with m.If(self.reserve != 0):
            m.d.sync += self.reserve.eq(self.reserve - 1)
        self.phase_started = Signal()
        self.nest_done = Signal()
        self.select_done = Signal()
        self.bad_address = Signal()
        self.keep = Signal(range(bld.max_width + 1))
        self.dense = Signal()
        self.random = Signal()
        self.lfsr_state = Signal(16)
        # the update-shift correction (WEIGHT_FRAC_BITS - dX shift of each layer above)
        span = bld.max_layers * max(spec.WEIGHT_FRAC_BITS, spec.DX_SHIFT_MAX) + 1
        self.correction = Signal(range(-span, span))
        self.pending = Signal(range(-span, span))
        self.upd_shift = Signal(range(spec.UPDATE_SHIFT_MAX + 1))
        shift = engine.lr_shift + self.correction
        m.d.comb += self.upd_shift.eq(Mux(shift < 0, 0, Mux(shift > spec.UPDATE_SHIFT_MAX,
                                                             spec.UPDATE_SHIFT_MAX, shift)))
        # PSG: the decision of the (j, k) in flight; the relative threshold
        self.decided = Signal()
        self.confident = Signal(spec.GRAD_HOLD)        # per input of the group in flight
        self.pred_negative = Signal(spec.GRAD_HOLD)
        self.uncertain_any = Signal()
        self.upd_sure, self.upd_pred_negative = Signal(), Signal()
        self.pass1_at = Signal()
        lacc = max(bld.lane_acc_bits(), bld.dx_acc_bits())
        self.largest = Signal(lacc)
        self.tau_relative = Signal(lacc)
        self.tau = Signal(max(lacc, 32))
        m.d.comb += self.tau.eq(Mux(engine.psg_relative, self.tau_relative, engine.psg_tau))
        self.upd_start = Signal()
        self.upd_read = Signal()            # the update's weight read (before upd_start)
        self.upd_read_addr = Signal(engine.w_bits)
        self.upd_addr = Signal(engine.w_bits)
        self.upd_value = Signal(signed(bld.lane_acc_bits()))
        self.upd_write = Signal()           # the update writes a weight in this cycle

    def count(self, name, amount=1):
        """A sync statement: `amount` of event `name` in this cycle."""
        return getattr(self.inc, name).eq(amount)

    @staticmethod
    def chain(m, a, b):
        m.d.sync += [b.valid.eq(a.valid), b.first.eq(a.first), b.last.eq(a.last),
                     b.o.eq(a.o), b.live.eq(a.live)]


class _Stage:
    """The flags and addresses one pipeline stage carries."""

    def __init__(self, m, name, lanes, w_bits, o_bits):
        self.valid = Signal(name=f"{name}_valid")
        self.first = Signal(name=f"{name}_first")
        self.last = Signal(name=f"{name}_last")
        self.w = Signal(max(w_bits, 1), name=f"{name}_w")
        self.o = Signal(max(o_bits, 1), name=f"{name}_o")
        self.live = Signal(max(lanes, 1), name=f"{name}_live")
