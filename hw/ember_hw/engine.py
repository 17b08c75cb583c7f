"""The training engine core: memories, MAC lanes, sequencer, event counters and register bank.

`EngineCore` is a bus slave (ember_hw.bus.BusSignature, flipped). The host (through the link
bridge) writes the layer descriptors, settings, weights, an input batch and its labels, then
writes CONTROL; the sequencer runs the command and the host polls STATUS. Everything it computes
and counts follows docs/numerics.md and the golden model (ember.golden) exactly.

Datapath, for a build with P lanes (spec.Build):

- weight memory: P lanes x 16 bits per word; layer l's block j (outputs jP..jP+P-1) for input k
  is word weight_base + j*K + k (ember_hw.weights: block RAM, or one SPRAM per lane on the
  iCE40UP, never read and written in the same cycle);
- activation memory: bytes; layer l's input for sample b, index k at act_base + b*K + k;
- gradient memory: P lanes x 16 bits, two halves; dY of a layer for sample b, block j at word
  half_base + b*ceil(N/P) + j (the output layer's logits sit there too, and the loss unit
  overwrites them in place with dY);
- dX scratch: 32-bit raw input gradients, entry b*K + k;
- P lane multipliers (16 x 16 signed) shared by every phase, P accumulators sized from the
  build (spec.Build.lane_acc_bits), an adder tree for the input-gradient pass, one shared
  round/shift/saturate unit for requantization and updates (lanes are written back one per
  cycle).

Addresses come from running row pointers that the loops step by addition, and the few products
of two signals needed once per layer or command (bulk event counts, the ssProp keep count, the
bus write limit of the input batch) from one serial multiplier: the only combinational
multipliers are the P lanes' (and the loss unit's).

Sequencer phases of a training command: forward (per layer, sample, block), loss (per sample),
then per layer from the top: ssProp scoring and selection, input gradient, dX requantization,
weight gradient (SGD, or PSG prediction, decision and recompute) and update.
"""

from contextlib import contextmanager

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.hdl import ResetInserter
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ember import spec

from .arith import RoundingShifter, clamp_signed, popcount, tree_sum
from .bus import BusSignature, engine_members
from .counters import CounterFile
from .lanemem import LaneMemory
from .lanes import MacLanes
from .regbank import RegisterBank
from .requant import DxRequantizer
from .loss import SoftmaxGradUnit
from .memwindow import MemoryWindow
from .select import ChannelSelector, Lfsr16
from .serial_mul import SerialMultiplier
from .stopper import CommandStop
from .update import UpdateUnit
from .weights import WeightMemory
from .writeback import ForwardWriteback


def _bits(n):
    return max(1, (n - 1).bit_length())


class EngineCore(wiring.Component):
    """The engine behind the bus.

    Ports:
      bus:     In(BusSignature()) -- register, counter and memory access (see spec.ADDRESS_MAP);
               answers `busy` to memory and setting writes while a command runs. An
               activation write just after a command or a write of `batch` or layer 0's
               inputs waits a few cycles for the input batch's size (a serial product).
      link_rx, link_tx: In(1) -- one pulse per link byte received / sent (counted).
      busy:    Out(1) -- a command is running.

    Attribute ``states``: the sequencer's state names, once elaborated (a build without an
    optional unit has none of its UNIT_STATES).
    Attribute ``wmem``: the weight memory (ember_hw.weights; SPRAM if build.weight_spram).
    Attribute ``read_collision``: a sticky flag for simulations, set by a cycle in which a
    command reads a memory word (a gradient memory lane) that the same cycle writes and uses
    what it read ("Memory collisions" below); nothing reads it on a board, where it is
    optimized away.
    """

    def __init__(self, build=spec.BUILDS["v1"]):
        if build.dataflow != "outputs":
            raise spec.ConfigError(f"build '{build.name}' has dataflow {build.dataflow!r}: "
                                   "EngineCore is engine v1 (dataflow 'outputs'); engine v2 "
                                   "is ember_hw.sample_core.SampleCore")
        self.build = build
        self.wmem = WeightMemory(build.lanes, build.weight_words, spram=build.weight_spram)
        self.read_collision = Signal()
        super().__init__(engine_members())

    def elaborate(self, platform):
        m = Module()
        s = _Sequencer(m, self.build)
        self._memories(m, s)
        self._register_bank(m, s)
        self._counters(m, s)
        self._bus_slave(m, s)
        self._sequencer_registers(m, s)
        self._lane_datapath(m, s)

        # --------------------------------------------------------------------- the FSM
        # each phase adds its states, in this order (the FSM's encoding follows it); the
        # statements of every method keep their order, since later assignments take priority
        with m.FSM(name="seq") as fsm:
            self._idle(m, s)
            self._forward(m, s)
            self._loss(m, s)
            self._backward_layer(m, s)
            self._input_grad(m, s)
            self._weight_grad(m, s)
            self._update_and_next(m, s)
        s.fsm = fsm
        self.states = tuple(fsm.encoding)
        self._input_grad_pipeline(m, s)
        self._writeback_and_update(m, s)
        self._shifter_and_lanes(m, s)
        self._cycle_counters(m, s)
        self._stopping(m, s)
        self._collisions(m, s)
        return m

    def _memories(self, m, s):
        """The memories and their ports, the units a stopped command resets."""
        m.submodules.wmem = wmem = self.wmem
        m.submodules.amem = amem = Memory(shape=unsigned(spec.ACT_BITS), depth=s.bld.act_bytes,
                                          init=[])
        # banked per lane (ember_hw.lanemem), like the weights: each lane's entries in memory
        # of its own
        m.submodules.gmem = gmem = LaneMemory(s.P, s.bld.grad_words, spec.GRAD_BITS)
        m.submodules.smem = smem = Memory(shape=signed(spec.DX_BITS),
                                          depth=max(1, s.bld.scratch_entries), init=[])
        m.submodules.lmem = lmem = Memory(shape=unsigned(spec.LABEL_BITS), depth=s.bld.max_batch,
                                          init=[])
        m.submodules.pmem = pmem = Memory(shape=unsigned(spec.LABEL_BITS), depth=s.bld.max_batch,
                                          init=[])
        # optional units (spec.FEATURES): a build without PSG or ssProp leaves their
        # registers, states and memories out; the host never asks for them (FEATURES register)
        s.has_psg = "psg" in s.bld.features
        s.has_ssprop = "ssprop" in s.bld.features
        s.has_random = "ssprop_random" in s.bld.features
        for unit in ("zero_skip", "slu"):
            if unit not in s.bld.features:
                raise ValueError(f"build '{s.bld.name}': the engine always has the {unit} unit")
        if s.has_ssprop:
            m.submodules.kmem = kmem = Memory(shape=unsigned(s.P),
                                              depth=s.bld.blocks(s.bld.max_width), init=[])
            k_rd, k_wr = kmem.read_port(), kmem.write_port()
            s.k_rd, s.k_wr = k_rd, k_wr
        s.w_rd, s.w_wr = wmem.rd, wmem.wr
        a_rd, a_wr = amem.read_port(), amem.write_port()
        s.g_rd, s.g_wr = gmem.rd, gmem.wr
        s_rd, s_wr = smem.read_port(), smem.write_port()
        l_rd, l_wr = lmem.read_port(), lmem.write_port()
        p_rd, p_wr = pmem.read_port(), pmem.write_port()
        # (a port's signals take their names from a local variable: assigned in a tuple to
        # attributes, the write port's would be left unnamed)
        s.a_rd, s.a_wr, s.s_rd, s.s_wr = a_rd, a_wr, s_rd, s_wr
        s.l_rd, s.l_wr, s.p_rd, s.p_wr = l_rd, l_wr, p_rd, p_wr

        # a stopped command (abort or watchdog: _stopping) resets the units
        # it may leave half way; their memories keep their contents
        s.stop = Signal()
        s.loss = SoftmaxGradUnit(max_classes=s.bld.max_width)
        m.submodules.loss = ResetInserter(s.stop)(s.loss)
        if s.has_ssprop:
            s.sel = ChannelSelector(max_channels=s.bld.max_width)
            m.submodules.selector = ResetInserter(s.stop)(s.sel)
        if s.has_random:
            m.submodules.lfsr = s.lfsr = Lfsr16()

    def _register_bank(self, m, s):
        """The register bank and its settings; the serial multiplier."""
        # the settings, layer descriptors and CONTROL (ember_hw.regbank, from spec's tables);
        # a build without an optional unit has no register for its settings (they read as
        # their init, constantly)
        m.submodules.regs = s.regs = RegisterBank(s.bld)
        s.settings = settings = s.regs.settings
        s.batch, s.n_layers, s.update_mask = settings.batch, settings.layers, settings.update_mask
        s.lr_shift, flags, s.psg_tau = settings.lr_shift, settings.flags, settings.psg_tau
        s.psg_step, s.keep_q8, s.lfsr_seed = (settings.psg_step_shift, settings.keep_q8,
                                              settings.lfsr_seed)
        s.zero_skip_reg, s.psg_on, s.psg_rel, s.ss_random = (
            flags[spec.FLAG_BITS.index(name)]
            for name in ("zero_skip", "psg", "psg_relative", "ssprop_random"))
        off = Const(0, 1)
        if not s.has_psg:
            s.psg_on = s.psg_rel = off
        if not s.has_random:
            s.ss_random = off
        # The sequencer loads the current layer's descriptor into registers (K, N, wbase,
        # abase, shift, and next_abase: layer l + 1's act_base) each time it moves to another
        # layer (DESC_FWD, DESC_BWD). Layer L's words are never written (always 0). Layer 0's
        # input count (inputs0) is a factor of the input batch's size.
        s.field_bits = {name: f.bits for name, f in s.regs.fields.items()}
        inputs0 = s.regs.inputs0
        s.correct = Signal.like(s.regs.correct)
        s.label = Signal(spec.LABEL_BITS)
        m.d.comb += s.regs.correct.eq(s.correct)

        # a serial multiplier for the products of two signals needed once per layer or
        # command (b is always a layer width). A command uses it for its per-layer products
        # (bulk counters, the ssProp keep count); while idle it holds the input batch's bytes,
        # batch * inputs of layer 0, the bus write limit of the activation region, recomputed
        # after a write of either register and after each command
        m.submodules.mul = s.mul = SerialMultiplier(max(s.BATCH + s.WIDTH, len(s.keep_q8)),
                                                    s.WIDTH)
        s.limit_start = Signal()
        m.d.sync += s.limit_start.eq(s.regs.limit_changed)
        m.d.comb += [s.mul.start.eq(s.limit_start), s.mul.a.eq(s.batch), s.mul.b.eq(inputs0)]

    def _counters(self, m, s):
        """The event counters."""
        # the largest amount each counter can take in one cycle sizes its pre-counter
        bnk = s.bld.max_batch * s.bld.max_width * s.bld.max_width
        bounds = {name: 1 for name in spec.COUNTERS}
        bounds.update({name: s.P for name in (
            "mac_forward", "mac_input_grad", "mac_weight_grad", "mac_weight_grad_low",
            "weight_reads", "weight_writes", "grad_lane_reads", "grad_msb_lane_reads")})
        bounds.update(samples=s.bld.max_batch, infer_samples=s.bld.max_batch,
                      loss_elements=s.bld.max_width, skip_zero=max(s.P, s.bld.max_width),
                      skip_psg=s.P * s.bld.max_batch, skip_slu=2 * bnk, skip_ssprop=2 * bnk)
        m.submodules.counters = s.counters = CounterFile(bounds)
        s.inc = {name: getattr(s.counters.inc, name) for name in spec.COUNTERS}
        m.d.comb += [s.counters.clear.eq(s.regs.clear_counters),
                     s.inc["link_rx_bytes"].eq(self.link_rx),
                     s.inc["link_tx_bytes"].eq(self.link_tx)]

    def _bus_slave(self, m, s):
        """The command state; the bus slave (register bank and memory window)."""
        s.busy = Signal()
        s.infer_mode = Signal()
        m.d.comb += self.busy.eq(s.busy)
        # a CONTROL write registers its strobes (one cycle each): the sequencer and the
        # counters act on them in the next cycle
        s.start_train, s.start_infer = s.regs.start_train, s.regs.start_infer
        m.d.comb += s.regs.busy.eq(s.busy)
        # the end of a command, for the bridge's deferred answer (how it ended: _stopping)
        busy_was = Signal()
        m.d.sync += busy_was.eq(s.busy)
        m.d.comb += self.bus.cmd_done.eq(busy_was & ~s.busy)

        # ---------------------------------------------------------------- bus slave
        # the "regs" region is the register bank's, the memory regions the memory window's
        # (ember_hw.memwindow)
        region = self.bus.addr[spec.REGION_BITS:]
        offset = self.bus.addr[:spec.REGION_BITS]
        s.desc_loading = Signal()           # the sequencer has the descriptor read port
        s.desc_addr = Signal.like(s.regs.desc_addr)
        m.d.comb += [s.regs.desc_loading.eq(s.desc_loading), s.regs.desc_addr.eq(s.desc_addr),
                     s.counters.read_req.eq(s.regs.counter_req),
                     s.counters.read_index.eq(s.regs.counter_index),
                     s.regs.counter_valid.eq(s.counters.read_valid),
                     s.regs.counter_data.eq(s.counters.read_data)]

        # the answer to an access is registered: decided in one cycle (answer_*), on the bus
        # in the next, so that no path runs from the master's address through the decoding
        # here and back into the master
        answer_ack, answer_err, answer_defer = Signal(), Signal(), Signal()
        answer_data = Signal.like(self.bus.r_data)
        m.d.sync += [self.bus.ack.eq(answer_ack), self.bus.err.eq(answer_err),
                     self.bus.r_data.eq(answer_data), self.bus.defer.eq(answer_defer)]
        m.d.comb += s.regs.owing.eq(self.bus.owing)

        # the master drops its strobe in the cycle after the answer (bus contract); the answer
        # is on the bus a cycle after it is decided, and in that cycle the access is over
        active = Signal()
        m.d.comb += active.eq((self.bus.w_stb | self.bus.r_stb) & ~self.bus.ack & ~self.bus.err)
        wr = self.bus.w_stb
        m.d.comb += [s.regs.sel.eq(active & (region == 0)), s.regs.addr.eq(offset),
                     s.regs.write.eq(wr), s.regs.w_data.eq(self.bus.w_data)]
        m.submodules.window = win = MemoryWindow(s.bld)
        m.d.comb += [win.sel.eq(active & (region != 0)), win.addr.eq(self.bus.addr),
                     win.write.eq(wr), win.w_data.eq(self.bus.w_data), win.busy.eq(s.busy),
                     win.act_limit.eq(s.mul.product),
                     win.limit_ready.eq(~s.limit_start & s.mul.done),
                     win.classes.eq(s.regs.classes)]
        with m.If(active):
            with m.If(region == 0):
                m.d.comb += [answer_ack.eq(s.regs.ack), answer_err.eq(s.regs.err),
                             answer_data.eq(s.regs.data), answer_defer.eq(s.regs.defer)]
            with m.Else():
                m.d.comb += [answer_ack.eq(win.ack), answer_err.eq(win.err),
                             answer_data.eq(win.data)]
        # memory ports driven by the window when idle (it requests nothing while busy; the
        # sequencer's states, the phases' methods, drive them then)
        s.bus_w_addr = win.w_rd_addr
        s.bus_w_rd = win.w_rd               # the bus reads a weight word (w_rd.en when idle)
        # (the lanes' data registers are reset_less: every phase writes them before it reads
        # them, and a reset net to thousands of flip-flops only costs routing)
        s.u_word = Signal(s.P * s.W, reset_less=True)  # a weight word, shifted down a lane a cycle
        s.u_word_load = Signal()            # u_word <- the weight word read last cycle
        s.u_word_shift = Signal()           # u_word shifts down one lane
        m.d.comb += [s.w_wr.addr.eq(win.w_wr_addr), s.w_wr.data.eq(win.w_wr_data),
                     s.w_wr.en.eq(win.w_wr_en),
                     s.u_word_load.eq(win.u_word_load), s.u_word_shift.eq(win.u_word_shift),
                     win.u_word_low.eq(s.u_word[:spec.BUS_DATA_BITS]),
                     s.a_wr.addr.eq(win.act_wr_addr), s.a_wr.data.eq(win.act_wr_data),
                     s.a_wr.en.eq(win.act_wr_en), s.count("act_writes", win.act_wr_en),
                     s.l_wr.addr.eq(win.label_wr_addr), s.l_wr.data.eq(win.label_wr_data),
                     s.l_wr.en.eq(win.label_wr_en),
                     s.regs.label_word.eq(win.label_word),
                     s.regs.label_written.eq(win.label_written),
                     s.l_rd.addr.eq(win.label_rd_addr), s.p_rd.addr.eq(win.label_rd_addr),
                     win.label_rd_data.eq(s.l_rd.data), win.pred_rd_data.eq(s.p_rd.data)]

    def _sequencer_registers(self, m, s):
        """The sequencer's loop indices, the current layer's descriptor
        registers and its running pointers."""
        s.l = Signal(range(s.L + 1))        # current layer
        s.b = Signal(s.BATCH)
        s.j = Signal(s.WIDTH)
        s.k = Signal(s.WIDTH)
        s.n = Signal(s.WIDTH)
        s.p = Signal(range(s.P + 1))
        # layer l's descriptor, loaded from dmem (DESC_FWD, DESC_BWD)
        s.K = Signal(s.field_bits["inputs"])
        s.N = Signal(s.field_bits["outputs"])
        s.wbase = Signal(s.field_bits["weight_base"])
        s.abase = Signal(s.field_bits["act_base"])
        s.shift = Signal(s.field_bits["shift"])
        s.next_abase = Signal(s.field_bits["act_base"])
        s.desc_regs = [s.K, s.N, s.wbase, s.abase, s.shift, s.next_abase]  # in the order they load
        s.desc_step = Signal(range(len(s.desc_regs) + 1))
        # blocks of the current layer's outputs (N) and of its inputs (K: the outputs of the
        # layer below), loaded with N and K
        s.nb, s.nb_below = Signal(s.WIDTH), Signal(s.WIDTH)
        s.last_layer = Signal()
        m.d.comb += s.last_layer.eq(s.l == s.n_layers - 1)
        half = s.bld.grad_words // 2
        s.cur_half = Signal()               # which half of gmem holds the current dY
        s.gbase = Signal(_bits(s.bld.grad_words))
        s.gbase_below = Signal(_bits(s.bld.grad_words))
        m.d.comb += [s.gbase.eq(Mux(s.cur_half, half, 0)),
                     s.gbase_below.eq(Mux(s.cur_half, 0, half))]
        s.zs = Signal()
        m.d.comb += s.zs.eq(s.zero_skip_reg | s.infer_mode)

        # running pointers, stepped by addition as the loops advance (no products of two
        # signals outside the MAC lanes); each phase sets them up and steps them in its order
        s.a_row = Signal.like(s.abase)      # act address of (b, k=0) of the current layer's input
        s.o_row = Signal.like(s.abase)      # forward: act address of (b, 0) of its output
        s.w_row = Signal.like(s.wbase)      # weight word of (j, k=0)
        # gradient word of (b, j=0) (REQ: the half below)
        s.g_row = Signal(_bits(s.bld.grad_words))

    def _lane_datapath(self, m, s):
        """The lanes' datapath, the shared shifter and the scalar helpers
        the phases share; the memory ports' defaults."""
        # accumulators as wide as this build's largest sums (spec.Build.*_bits)
        LACC, s.DACC, s.PRED = s.bld.lane_acc_bits(), s.bld.dx_acc_bits(), s.bld.pred_bits()
        assert s.PRED <= LACC, "the PSG prediction is accumulated in the lane accumulators"
        # each phase chooses the lanes' operands (mul_a, mul_b); the lanes (ember_hw.lanes)
        # register them before the multiplier, so that a memory read, the operand choice and a
        # multiply are not one path: products reach prod_r two cycles after their operands are
        # chosen (operands: a weight or dY, and an activation or dY; signed)
        OPND = max(s.W, spec.GRAD_BITS, spec.ACT_BITS + 1)
        m.submodules.lanes = s.lanes = MacLanes(s.P, OPND, LACC)
        acc = [s.lanes.accumulator(i) for i in range(s.P)]
        s.prod_r = [s.lanes.product(i) for i in range(s.P)]
        s.mul_a = [Signal(signed(OPND), name=f"mul_a{i}") for i in range(s.P)]
        s.mul_b = [Signal(signed(OPND), name=f"mul_b{i}") for i in range(s.P)]
        s.w_lane = [s.w_rd.data.word_select(i, s.W).as_signed() for i in range(s.P)]
        s.g_lane = [s.g_rd.data.word_select(i, spec.GRAD_BITS).as_signed() for i in range(s.P)]
        # gradient memory writes are one lane at a time (loss unit, dX requantizer, logits):
        # one 16-bit value goes to every lane and the lane's write enable picks it (so the
        # writers' multiplexer is 16 bits wide, not P * 16)
        assert spec.LOGIT_BITS == spec.GRAD_BITS, "logits and dY share the gradient memory"
        s.g_wr_value = Signal(spec.GRAD_BITS)
        s.g_wr_lane = Signal(range(s.P))
        s.g_wr_on = Signal()
        m.d.comb += [s.g_wr.data.eq(s.g_wr_value.replicate(s.P)),
                     s.g_wr.en.eq(Mux(s.g_wr_on, Const(1, s.P) << s.g_wr_lane, 0))]

        # pipeline registers of the streaming loops: stage 1 has the operands read in stage 0
        s.s1_valid, s.s2_valid = Signal(), Signal(name="s2_valid")
        s.s1_last, s.s2_last = Signal(), Signal(name="s2_last")
        s.s2_live = Signal()
        # forward and weight-gradient loops: stage 2 chooses the operands (m2: registered
        # operands), stage 3 has the registered products (m3), accumulated into the lanes of
        # m3_gate; the m2 flags follow into m3 every cycle unless a state sets them
        s.m2_valid, s.m2_last, s.m2_gate = Signal(), Signal(), Signal(s.P, name="m2_gate")
        s.m3_valid, s.m3_last = Signal(), Signal(name="m3_last")
        s.m3_gate = Signal(s.P)
        m.d.sync += [s.m3_valid.eq(s.m2_valid), s.m3_last.eq(s.m2_last), s.m3_gate.eq(s.m2_gate)]
        s.ig_keep = Signal(s.P)             # input gradient: the lanes whose products count
        s.s2_act = Signal(spec.ACT_BITS)
        # the lanes' registers are stepped in one place (_shifter_and_lanes) by these strobes
        s.acc_clear = Signal()              # accumulators to 0
        s.acc_zero = Signal(s.P)            # these lanes' accumulators to 0
        s.acc_add = Signal()                # acc += prod_r in the lanes of m3_gate
        s.u_load = Signal()                 # the lanes' snapshot <- acc (MacLanes.snap)
        s.u_shift_down = Signal()           # the snapshot moves down a lane: its head was taken
        s.lanes_on = Signal(s.P)            # kept lanes of the current block
        s.s1_lanes = Signal(s.P)

        # one rounding shifter (ember_hw.arith), shared by the three units that requantize and
        # never run at the same time: the forward writeback (ember_hw.writeback), the dX
        # requantizer (ember_hw.requant, in REQ_RUN) and the update unit (ember_hw.update). The
        # writeback and update units take the head lane of the lanes' snapshot (rq_take_head,
        # with their shift in rq_head_shift), the requantizer a dX entry (rq_take_dx). rq_twice
        # has round_shift_twice(value) (its sign is the value's) the cycle after the take,
        # rq_out the rounded value two cycles after it
        m.submodules.shifter = s.shifter = RoundingShifter(max(LACC, spec.DX_BITS),
                                                           spec.SHIFT_MAX)
        s.rq_twice, s.rq_out = s.shifter.twice, s.shifter.out
        s.rq_take_head, s.rq_take_dx = Signal(), Signal(name="rq_take_dx")
        s.rq_head_shift = Signal.like(s.shifter.shift)

        # scalar helpers
        s.dx_acc = Signal(signed(s.DACC))
        # the dX requantizer: the batch's largest |dX|, its scale, and the saturation to dY
        s.requant = DxRequantizer()
        m.submodules.requant = ResetInserter(s.stop)(s.requant)
        s.dx_shift = s.requant.shift
        # the update shift's correction: WEIGHT_FRAC_BITS - dx_shift for each layer above
        s.correction = Signal(range(-(s.L - 1) * max(0, spec.DX_SHIFT_MAX - spec.WEIGHT_FRAC_BITS),
                                    (s.L - 1) * spec.WEIGHT_FRAC_BITS + 1))
        s.keep = Signal(s.WIDTH)
        s.batch_k = Signal(s.BATCH + s.WIDTH)  # batch * K of the current layer
        s.do_wgrad, s.do_igrad = Signal(), Signal(name="do_igrad")
        s.live_count = Signal(s.BATCH)      # PSG: live samples of the low pass of (j, k)
        s.psg_max = Signal(s.PRED)
        # the threshold of PSG_DECIDE, set in WG_K; no |prediction| exceeds 2**(PRED-1),
        # so larger thresholds are held as that
        s.psg_thr = Signal(s.PRED)
        s.psg_pass_a = Signal()             # relative mode: first pass, finds the maximum
        # the PSG prediction is accumulated in the lane's accumulator (it fits PRED bits); the
        # uncertain lanes' are cleared for the recompute, the confident lanes' kept
        s.pred = [a[:s.PRED].as_signed() for a in acc]
        s.confident = Signal(s.P)
        s.uncertain = Signal(s.P)
        # the update unit's copy of one (j, k): gradient sources, kept lanes, address, shift
        s.upd = UpdateUnit(s.P, LACC, addr_bits=len(s.wbase), live_bits=s.BATCH,
                           step_bits=len(s.psg_step))
        m.submodules.update = ResetInserter(s.stop)(s.upd)
        s.u_busy = s.upd.busy
        # the forward writeback unit (it takes the lanes' snapshot a lane a cycle)
        s.wb = ForwardWriteback(s.P, LACC, act_addr_bits=len(s.abase),
                                grad_addr_bits=_bits(s.bld.grad_words), shift_bits=len(s.shift))
        m.submodules.writeback = ResetInserter(s.stop)(s.wb)
        s.wb_busy = s.wb.busy
        s.score = Signal(len(s.sel.score_data) if s.has_ssprop else 1)
        s.packed = Signal(s.P)

        s.kept_dense = Signal(s.P)          # lanes of block j that exist
        remaining = Signal(signed(s.WIDTH + 1))
        m.d.comb += remaining.eq(s.N - (s.j << s.LOGP))
        # lanes 0 .. remaining - 1, as a thermometer code (no comparator per lane)
        thermometer = (((Const(1, s.P + 1) << remaining[:s.LOGP]) - 1)[:s.P] if s.LOGP
                       else Const(0, 1))
        m.d.comb += s.kept_dense.eq(Mux(remaining[-1] | (remaining == 0), 0,
                                        Mux(remaining[s.LOGP:-1] != 0, (1 << s.P) - 1,
                                            thermometer)))
        s.dense = Signal()
        m.d.comb += s.dense.eq(s.keep >= s.N if s.has_ssprop else 1)

        # memory port defaults: the bus drives them when idle
        with m.If(~s.busy):
            m.d.comb += s.w_rd.addr.eq(s.bus_w_addr)

    def _idle(self, m, s):
        """IDLE and DESC_FWD: start a command, load layer l's descriptor."""
        with s.seq_state("IDLE"):
            with m.If(s.start_train | s.start_infer):
                # (desc_step: a stopped command may have left a descriptor half loaded)
                m.d.sync += [s.busy.eq(1), s.infer_mode.eq(s.start_infer), s.b.eq(0), s.l.eq(0),
                             s.j.eq(0), s.correct.eq(0), s.correction.eq(0), s.cur_half.eq(0),
                             s.desc_step.eq(0)]
                if s.has_random:
                    m.d.comb += [s.lfsr.load.eq(1), s.lfsr.seed.eq(s.lfsr_seed)]
                m.next = "DESC_FWD"

        with s.seq_state("DESC_FWD"):
            self._load_descriptor(m, s, "FWD_LAYER")

    def _load_descriptor(self, m, s, then):
        """Layer l's descriptor into K, N, ... (one read a cycle), then on to state `then`
        (DESC_FWD, DESC_BWD)."""
        m.d.comb += s.desc_loading.eq(1)
        fields = [s.l * spec.LAYER_STRIDE + f for f in range(len(spec.LAYER_FIELDS))]
        fields.append((s.l + 1) * spec.LAYER_STRIDE + spec.LAYER_FIELDS.index("act_base"))
        m.d.comb += s.desc_addr.eq(Array(fields)[s.desc_step])
        blocks = (s.regs.desc_data + s.P - 1) >> s.LOGP
        with m.Switch(s.desc_step):
            for i, reg in enumerate(s.desc_regs):
                with m.Case(i + 1):
                    m.d.sync += reg.eq(s.regs.desc_data)
                    if reg is s.N:
                        m.d.sync += s.nb.eq(blocks)
                    elif reg is s.K:
                        m.d.sync += s.nb_below.eq(blocks)
        m.d.sync += s.desc_step.eq(s.desc_step + 1)
        with m.If(s.desc_step == len(s.desc_regs)):
            m.d.sync += s.desc_step.eq(0)
            m.next = then

    def _forward(self, m, s):
        """FWD_*: the forward pass; INF_*: inference's argmax per sample."""
        # ---------------- forward: for l, for b, for j: acc = W[j] . A[b]; write back
        # (layer by layer over the batch, so that the row pointers step by the layer's
        # strides K, N and nb)
        with s.seq_state("FWD_LAYER"):
            # layer l reads the layer below's outputs: wait until the writeback unit has
            # written the last of them, then point at sample 0, block 0
            with m.If(~s.wb_busy):
                m.d.sync += [s.a_row.eq(s.abase), s.o_row.eq(s.next_abase), s.w_row.eq(s.wbase),
                             s.g_row.eq(s.gbase)]
                m.next = "FWD_ROW"
        with s.seq_state("FWD_ROW"):
            m.d.sync += [s.k.eq(0), s.s1_valid.eq(0), s.s2_valid.eq(0), s.m2_valid.eq(0),
                         s.m2_last.eq(0), s.m3_valid.eq(0), s.m3_last.eq(0)]
            m.d.comb += s.acc_clear.eq(1)
            m.next = "FWD_RUN"
        with s.seq_state("FWD_RUN"):
            # stage 0: read A[b, k]
            m.d.comb += [s.a_rd.addr.eq(s.a_row + s.k), s.count("act_reads", s.k < s.K)]
            m.d.sync += [s.s1_valid.eq(s.k < s.K), s.s1_last.eq(s.k == s.K - 1)]
            with m.If(s.k < s.K):
                m.d.sync += s.k.eq(s.k + 1)
            # stage 1: A known; read the weight word unless A is zero and skipping
            a_val = s.a_rd.data
            live1 = (a_val != 0) | ~s.zs
            m.d.comb += s.w_rd.addr.eq(s.w_row + s.k - 1)
            lanes_valid = Signal(s.P)
            m.d.comb += lanes_valid.eq(s.kept_dense)
            with m.If(s.s1_valid):
                with m.If(live1):
                    m.d.comb += s.count("weight_reads", popcount(lanes_valid))
                with m.Else():
                    m.d.comb += s.count("skip_zero", popcount(lanes_valid))
            m.d.sync += [s.s2_valid.eq(s.s1_valid), s.s2_live.eq(live1), s.s2_act.eq(a_val),
                         s.s2_last.eq(s.s1_last)]
            # stage 2: multiply
            for i in range(s.P):
                m.d.comb += [s.mul_a[i].eq(s.w_lane[i]), s.mul_b[i].eq(s.s2_act)]
            m.d.sync += [s.m2_valid.eq(s.s2_valid & s.s2_live),
                         s.m2_last.eq(s.s2_valid & s.s2_last), s.m2_gate.eq(lanes_valid)]
            with m.If(s.s2_valid & s.s2_live):
                m.d.comb += s.count("mac_forward", popcount(lanes_valid))
            # stage 3: accumulate
            m.d.comb += s.acc_add.eq(s.m3_valid)
            with m.If(s.m3_last):
                m.next = "FWD_HANDOFF"
        with s.seq_state("FWD_HANDOFF"):
            # the writeback unit requantizes and writes this block while the next block
            # accumulates; the next layer (which reads these outputs) and the loss wait
            with m.If(~s.wb_busy):
                m.d.comb += [s.wb.start.eq(1), s.wb.last.eq(s.last_layer), s.wb.shift.eq(s.shift),
                             s.wb.lanes_on.eq(s.kept_dense),
                             s.wb.act_addr.eq(s.o_row + (s.j << s.LOGP)),
                             s.wb.grad_word.eq(s.g_row + s.j)]
                m.d.comb += s.u_load.eq(1)
                with m.If(s.j + 1 < s.nb):
                    m.d.sync += [s.j.eq(s.j + 1), s.w_row.eq(s.w_row + s.K)]
                    m.next = "FWD_ROW"
                with m.Elif(s.b + 1 < s.batch):
                    m.d.sync += [s.j.eq(0), s.b.eq(s.b + 1), s.w_row.eq(s.wbase),
                                 s.a_row.eq(s.a_row + s.K), s.o_row.eq(s.o_row + s.N),
                                 s.g_row.eq(s.g_row + s.nb)]
                    m.next = "FWD_ROW"
                with m.Elif(~s.last_layer):
                    m.d.sync += [s.j.eq(0), s.b.eq(0), s.l.eq(s.l + 1)]
                    m.next = "DESC_FWD"
                with m.Else():
                    m.d.sync += s.b.eq(0)
                    m.next = "FWD_END"
        with s.seq_state("FWD_END"):
            with m.If(~s.wb_busy):
                m.next = "AFTER_FWD"
        with s.seq_state("AFTER_FWD"):
            # the logits of sample 0 (the output layer's dY after the loss)
            m.d.sync += [s.b.eq(0), s.g_row.eq(s.gbase)]
            with m.If(s.infer_mode):
                m.d.sync += s.n.eq(0)
                m.next = "INF_ROW"
            with m.Else():
                m.next = "LOSS_START"

        # ---------------- inference: argmax of the logits per sample
        best = Signal(signed(spec.LOGIT_BITS))
        best_n = Signal(s.WIDTH)
        # the scalar readers of the gradient memory (inference, ssProp scores) register the
        # lane they read (g_pick) before using it
        s.g_pick = Signal(signed(spec.GRAD_BITS))
        s2_first = Signal()
        s.s2_index = Signal(s.WIDTH)
        with s.seq_state("INF_ROW"):
            m.d.sync += [s.n.eq(0), s.s1_valid.eq(0), s.s2_valid.eq(0), best_n.eq(0)]
            m.next = "INF_RUN"
        with s.seq_state("INF_RUN"):
            # stage 0: read logit n; stage 1: its lane into g_pick; stage 2: compare
            m.d.comb += [s.g_rd.addr.eq(s.g_row + (s.n >> s.LOGP)),
                         s.count("grad_reads", s.n < s.N)]
            m.d.sync += [s.s1_valid.eq(s.n < s.N), s.s1_last.eq(s.n == s.N - 1),
                         s.p.eq(s.n[:s.LOGP] if s.LOGP else 0)]
            with m.If(s.n < s.N):
                m.d.sync += s.n.eq(s.n + 1)
            m.d.sync += [s.g_pick.eq(Array(s.g_lane)[s.p]), s.s2_valid.eq(s.s1_valid),
                         s.s2_last.eq(s.s1_last), s2_first.eq(s.n == 1), s.s2_index.eq(s.n - 1)]
            with m.If(s.s2_valid):
                with m.If(s2_first | (s.g_pick > best)):
                    m.d.sync += [best.eq(s.g_pick), best_n.eq(s.s2_index)]
                with m.If(s.s2_last):
                    m.next = "INF_WRITE"
        with s.seq_state("INF_WRITE"):
            m.d.comb += [s.p_wr.addr.eq(s.b), s.p_wr.data.eq(best_n), s.p_wr.en.eq(1)]
            with m.If(s.b + 1 < s.batch):
                m.d.sync += [s.b.eq(s.b + 1), s.g_row.eq(s.g_row + s.nb)]
                m.next = "INF_ROW"
            with m.Else():
                m.d.comb += s.count("infer_samples", s.batch)
                m.d.sync += [s.busy.eq(0), s.limit_start.eq(1)]
                m.next = "IDLE"

    def _loss(self, m, s):
        """LOSS_*: the softmax-gradient unit, one sample at a time."""
        with s.seq_state("LOSS_START"):
            m.d.comb += [s.l_rd.addr.eq(s.b)]
            m.next = "LOSS_GO"
        with s.seq_state("LOSS_GO"):
            m.d.sync += s.label.eq(s.l_rd.data)
            m.next = "LOSS_GO2"
        with s.seq_state("LOSS_GO2"):
            m.d.comb += [s.loss.start.eq(1), s.loss.classes.eq(s.N), s.loss.label.eq(s.label)]
            m.d.sync += s.p.eq(0)
            m.next = "LOSS_RUN"
        with s.seq_state("LOSS_RUN"):
            m.d.comb += [s.loss.classes.eq(s.N), s.loss.label.eq(s.label),
                         s.g_rd.addr.eq(s.g_row + (s.loss.rd_addr >> s.LOGP))]
            m.d.sync += s.p.eq(s.loss.rd_addr[:s.LOGP] if s.LOGP else 0)
            m.d.comb += s.loss.rd_data.eq(Array(s.g_lane)[s.p])
            with m.If(s.loss.rd_en):
                m.d.comb += s.count("grad_reads")
            with m.If(s.loss.wr_en):
                m.d.comb += [s.g_wr.addr.eq(s.g_row + (s.loss.wr_addr >> s.LOGP)),
                             s.g_wr_value.eq(s.loss.wr_data), s.g_wr_on.eq(1),
                             s.g_wr_lane.eq(s.loss.wr_addr[:s.LOGP]),
                             s.count("grad_writes")]
            with m.If(s.loss.done):
                m.d.comb += s.count("loss_elements", s.N)
                m.d.sync += s.correct.eq(s.correct + s.loss.correct)
                with m.If(s.b + 1 < s.batch):
                    m.d.sync += [s.b.eq(s.b + 1), s.g_row.eq(s.g_row + s.nb)]
                    m.next = "LOSS_START"
                with m.Else():
                    m.next = "BWD_LAYER"

    def _backward_layer(self, m, s):
        """BWD_*: a layer's backward set-up; SCORE_*, SELECT*, PACK: ssProp's
        scoring and selection; the kept lanes of block j."""
        # ---------------- backward, one layer at a time from the top
        any_below = Signal()
        m.d.comb += any_below.eq((s.update_mask & ((Const(1, s.L + 1) << s.l) - 1)[:s.L]) != 0)
        # the layer's setup: which passes run, and four products on the serial
        # multiplier (keep, batch*K, batch*N*K, batch*(N-keep)*K), one state each
        with s.seq_state("BWD_LAYER"):
            m.d.sync += [s.do_wgrad.eq(s.update_mask.bit_select(s.l, 1)),
                         s.do_igrad.eq((s.l != 0) & any_below)]
            m.d.comb += [s.mul.start.eq(1), s.mul.a.eq(s.keep_q8), s.mul.b.eq(s.N)]
            m.next = "BWD_KEEP"
        with s.seq_state("BWD_KEEP"):
            # ssProp keeps N * keep_q8 / KEEP_ONE channels, at least 1 (all at KEEP_ONE)
            kept = s.mul.product >> (spec.KEEP_ONE.bit_length() - 1)
            with m.If(s.mul.done):
                if s.has_ssprop:
                    m.d.sync += s.keep.eq(Mux(s.keep_q8 >= spec.KEEP_ONE, s.N,
                                              Mux(kept == 0, 1, kept)))
                else:
                    m.d.sync += s.keep.eq(s.N)
                m.d.comb += [s.mul.start.eq(1), s.mul.a.eq(s.batch), s.mul.b.eq(s.K)]
                m.next = "BWD_BK"
        with s.seq_state("BWD_BK"):
            with m.If(s.mul.done):
                m.d.sync += s.batch_k.eq(s.mul.product)
                m.d.comb += [s.mul.start.eq(1), s.mul.a.eq(s.mul.product), s.mul.b.eq(s.N)]
                m.next = "BWD_BNK"
        with s.seq_state("BWD_BNK"):
            # batch*N*K MACs per pass: SLU skips the weight gradient of a frozen layer
            # and the input gradient below the lowest updated one
            bnk = s.mul.product
            with m.If(s.mul.done):
                m.d.comb += s.count("skip_slu", Mux(s.do_wgrad, 0, bnk) +
                                    Mux((s.l != 0) & ~s.do_igrad, bnk, 0))
                m.d.comb += [s.mul.start.eq(1), s.mul.a.eq(s.batch_k), s.mul.b.eq(s.N - s.keep)]
                m.next = "BWD_LAYER2"
        with s.seq_state("BWD_LAYER2"):
            # batch*(N-keep)*K MACs that ssProp skips in each pass that runs
            with m.If(s.mul.done):
                ssprop = s.mul.product
                if s.has_ssprop:        # (without ssProp the product is 0)
                    m.d.comb += s.count("skip_ssprop",
                                        Mux(s.do_wgrad & s.do_igrad, ssprop << 1,
                                            Mux(s.do_wgrad | s.do_igrad, ssprop, 0)))
                m.d.sync += [s.n.eq(0), s.b.eq(0), s.score.eq(0), s.s1_valid.eq(0),
                             s.s2_valid.eq(0), s.g_row.eq(s.gbase)]
                with m.If(~(s.do_wgrad | s.do_igrad)):
                    m.next = "BWD_NEXT"
                with m.Elif(s.dense):
                    m.next = "IG_START"
                if s.has_random:
                    with m.Elif(s.ss_random):
                        m.next = "SCORE_RANDOM"
                if s.has_ssprop:
                    with m.Else():
                        m.next = "SCORE_TOPK"

        if s.has_ssprop:
            # ssProp scores: sum over the batch of |dY[b, n]|, or LFSR states
            with s.seq_state("SCORE_TOPK"):
                m.d.comb += [s.g_rd.addr.eq(s.g_row + (s.n >> s.LOGP)),
                             s.count("grad_reads", s.n < s.N)]
                m.d.sync += [s.s1_valid.eq(s.n < s.N), s.s1_last.eq(s.b == s.batch - 1),
                             s.p.eq(s.n[:s.LOGP] if s.LOGP else 0)]
                with m.If(s.n < s.N):
                    with m.If(s.b == s.batch - 1):
                        m.d.sync += [s.b.eq(0), s.n.eq(s.n + 1), s.g_row.eq(s.gbase)]
                    with m.Else():
                        m.d.sync += [s.b.eq(s.b + 1), s.g_row.eq(s.g_row + s.nb)]
                # stage 1: the lane into g_pick; stage 2: add its magnitude
                m.d.sync += [s.g_pick.eq(Array(s.g_lane)[s.p]), s.s2_valid.eq(s.s1_valid),
                             s.s2_last.eq(s.s1_last), s.s2_index.eq(s.n - 1)]
                mag = Mux(s.g_pick < 0, -s.g_pick, s.g_pick)
                with m.If(s.s2_valid):
                    with m.If(s.s2_last):
                        m.d.comb += [s.sel.score_we.eq(1), s.sel.score_index.eq(s.s2_index),
                                     s.sel.score_data.eq(s.score + mag)]
                        m.d.sync += s.score.eq(0)
                    with m.Else():
                        m.d.sync += s.score.eq(s.score + mag)
                with m.If(s.s2_valid & s.s2_last & (s.s2_index == s.N - 1)):
                    m.next = "SELECT"
            with s.seq_state("SELECT"):
                m.d.comb += [s.sel.start.eq(1), s.sel.channels.eq(s.N), s.sel.keep.eq(s.keep)]
                m.next = "SELECT_WAIT"
            with s.seq_state("SELECT_WAIT"):
                m.d.comb += [s.sel.channels.eq(s.N), s.sel.keep.eq(s.keep)]
                with m.If(s.sel.done):
                    m.d.sync += [s.n.eq(0), s.s1_valid.eq(0), s.packed.eq(0)]
                    m.next = "PACK"
            with s.seq_state("PACK"):
                # the kept mask as one P-bit word per block
                m.d.comb += s.sel.kept_index.eq(s.n)
                m.d.sync += [s.s1_valid.eq(s.n < s.N), s.n.eq(Mux(s.n < s.N, s.n + 1, s.n))]
                idx = s.n - 1
                with m.If(s.s1_valid):
                    word = s.packed | (s.sel.kept << idx[:s.LOGP])
                    m.d.sync += s.packed.eq(word)
                    with m.If((idx[:s.LOGP] == s.P - 1) | (idx == s.N - 1)):
                        m.d.comb += [s.k_wr.addr.eq(idx >> s.LOGP), s.k_wr.data.eq(word),
                                     s.k_wr.en.eq(1)]
                        m.d.sync += s.packed.eq(0)
                with m.If((s.n == s.N) & s.s1_valid):
                    m.next = "IG_START"

        if s.has_random:
            with s.seq_state("SCORE_RANDOM"):
                # step the LFSR in one cycle, write its new state in the next
                m.d.comb += s.lfsr.step.eq(s.n < s.N)
                m.d.sync += [s.s1_valid.eq(s.n < s.N), s.n.eq(Mux(s.n < s.N, s.n + 1, s.n))]
                with m.If(s.s1_valid):
                    m.d.comb += [s.sel.score_we.eq(1), s.sel.score_index.eq(s.n - 1),
                                 s.sel.score_data.eq(s.lfsr.state)]
                with m.If((s.n == s.N) & s.s1_valid):
                    m.next = "SELECT"
        # kept lanes of block j: from the selector, or every existing lane when dense
        s.kept_j = Signal(s.P)
        if s.has_ssprop:
            m.d.comb += [s.kept_j.eq(Mux(s.dense, s.kept_dense, s.k_rd.data)), s.k_rd.addr.eq(s.j)]
        else:
            m.d.comb += s.kept_j.eq(s.kept_dense)

    def _input_grad(self, m, s):
        """IG_*: the input gradient dX; REQ_*: its requantization into dY of the
        layer below."""
        # ---------------- input gradient: for b, k: dX = sum over kept n of W * dY
        with s.seq_state("IG_START"):
            m.d.sync += [s.b.eq(0), s.k.eq(0), s.n.eq(0)]
            m.d.comb += s.requant.clear.eq(1)
            with m.If(s.do_igrad):
                m.next = "IG_A"
            with m.Else():
                m.next = "WG_START"
        # Pipelined over (b, k) with j innermost: one issue slot per block (one slot for
        # a (b, k) skipped as zero); A of the next (b, k) is read while the current one's
        # slots run. Stage 1 has the operands (registered in stage 1b), stage 2 the kept
        # lanes' products, which it adds (adder tree) into dX, written at the (b, k)'s last
        # slot; stage 3 keeps max |dX|.
        sidx = Signal(range(s.bld.scratch_entries + 1))     # b*K + k of the current slot
        relu_cur = Signal()
        s.s1_relu, s.s1_live = Signal(), Signal(name="s1_live")
        s.s1b_valid, s.s1b_last, s.s1b_relu = Signal(), Signal(), Signal(name="s1b_relu")
        s.s2_relu = Signal()
        # stage 2t: the lanes' sum, registered (the P-way adder tree is one stage, the
        # accumulation into dX the next)
        s.s2t_valid, s.s2t_last, s.s2t_relu = Signal(), Signal(), Signal(name="s2t_relu")
        # dX entries are written in order, one per (b, k): the write index counts them
        # (rather than b*K + k travelling down the pipeline with each slot)
        s.dx_wr_idx = Signal.like(sidx)
        s.s2t_sum = Signal(signed(s.DACC))
        s.s3_valid = Signal()
        s.s3_dx = Signal(signed(spec.DX_BITS))
        s.ig_pipe = Signal()                # IG_RUN or IG_DRAIN: stages 1 to 3 run
        with s.seq_state("IG_A"):
            m.d.comb += s.a_rd.addr.eq(s.abase)
            m.d.sync += [s.j.eq(0), s.dx_acc.eq(0), s.s1_valid.eq(0), s.s1b_valid.eq(0),
                         s.s2_valid.eq(0), s.s2t_valid.eq(0), s.s3_valid.eq(0), sidx.eq(0),
                         s.dx_wr_idx.eq(0),
                         s.w_row.eq(s.wbase),
                         s.g_row.eq(s.gbase)]
            m.next = "IG_RUN"
        with s.seq_state("IG_DRAIN"):
            m.d.comb += s.ig_pipe.eq(1)
            m.d.sync += s.s1_valid.eq(0)
            with m.If(~s.s1_valid & ~s.s1b_valid & ~s.s2_valid & ~s.s2t_valid & ~s.s3_valid):
                m.next = "REQ_START"
        with s.seq_state("IG_RUN"):
            m.d.comb += s.ig_pipe.eq(1)
            # stage 0: slot j of (b, k); A[b, k] arrived in slot 0
            first = s.j == 0
            relu_now = Mux(first, s.a_rd.data != 0, relu_cur)
            live_now = relu_now | ~s.zs
            last_slot = ~live_now | (s.j == s.nb - 1)
            m.d.comb += s.a_rd.addr.eq(s.abase + sidx + 1)   # the next (b, k)
            with m.If(first):
                m.d.sync += relu_cur.eq(s.a_rd.data != 0)
                m.d.comb += s.count("act_reads")
                with m.If(~live_now):
                    m.d.comb += s.count("skip_zero", s.keep)
            # the operands' addresses do not wait for the activation: a slot whose
            # activation is zero reads them too and its products are dropped (ig_keep),
            # which keeps the activation memory's output off the paths to every lane's
            # memories (docs/boards.md, the ULX3S critical path)
            m.d.comb += [s.w_rd.addr.eq(s.w_row + s.k), s.g_rd.addr.eq(s.g_row + s.j)]
            m.d.sync += [s.s1_valid.eq(1), s.s1_last.eq(last_slot), s.s1_live.eq(live_now),
                         s.s1_relu.eq(relu_now),
                         s.s1_lanes.eq(s.kept_dense)]
            with m.If(last_slot):
                m.d.sync += [s.j.eq(0), sidx.eq(sidx + 1), s.w_row.eq(s.wbase)]
                with m.If(s.k + 1 < s.K):
                    m.d.sync += s.k.eq(s.k + 1)
                with m.Else():
                    m.d.sync += [s.k.eq(0), s.b.eq(s.b + 1), s.g_row.eq(s.g_row + s.nb)]
                with m.If((s.b == s.batch - 1) & (s.k == s.K - 1)):
                    m.next = "IG_DRAIN"
            with m.Else():
                m.d.sync += [s.j.eq(s.j + 1), s.w_row.eq(s.w_row + s.K)]

        # ---------------- dX -> dY of the layer below, with the batch's power-of-two scale
        ridx = Signal(range(s.bld.scratch_entries + 1))    # b*K + k, up to the batch's
        req_s3_valid, req_s4_valid = Signal(), Signal()
        with s.seq_state("REQ_START"):
            m.d.comb += s.requant.latch.eq(1)
            m.d.sync += [s.b.eq(0), s.k.eq(0),
                         ridx.eq(0), s.s1_valid.eq(0), s.s2_valid.eq(0), req_s3_valid.eq(0),
                         req_s4_valid.eq(0), s.g_row.eq(s.gbase_below)]
            m.next = "REQ_RUN"
        with s.seq_state("REQ_RUN"):
            # stage 0: read scratch entry ridx = b*K + k (all batch*K of them, in order);
            # stage 1: into the shifter's input; stages 2 and 3: shift and round it (the
            # requantizer registers it); stage 4: saturate and write dY_below at (b, k),
            # which step with the writes
            issue = ridx < s.batch_k
            m.d.comb += [s.s_rd.addr.eq(ridx), s.count("grad_reads", issue)]
            m.d.sync += [s.s1_valid.eq(issue), s.s2_valid.eq(s.s1_valid),
                         req_s3_valid.eq(s.s2_valid), req_s4_valid.eq(req_s3_valid)]
            with m.If(issue):
                m.d.sync += ridx.eq(ridx + 1)
            m.d.comb += s.rq_take_dx.eq(1)
            with m.If(req_s4_valid):
                m.d.comb += [s.g_wr.addr.eq(s.g_row + (s.k >> s.LOGP)),
                             s.g_wr_value.eq(s.requant.dy[0]), s.g_wr_on.eq(1),
                             s.g_wr_lane.eq(s.k[:s.LOGP]), s.count("grad_writes")]
                with m.If(s.k + 1 < s.K):
                    m.d.sync += s.k.eq(s.k + 1)
                with m.Else():
                    m.d.sync += [s.k.eq(0), s.b.eq(s.b + 1), s.g_row.eq(s.g_row + s.nb_below)]
            with m.If(s.b == s.batch):
                m.next = "WG_START"

    def _weight_grad(self, m, s):
        """WG_*, PSG_*: the weight gradient (SGD, or PSG's prediction and
        recompute)."""
        # ---------------- weight gradient and update, per block j and input k
        with s.seq_state("WG_START"):
            m.d.sync += [s.j.eq(0), s.k.eq(0), s.w_row.eq(s.wbase), s.psg_max.eq(0),
                         s.psg_pass_a.eq(s.psg_on & s.psg_rel)]
            with m.If(s.do_wgrad):
                m.next = "WG_BLOCK"
            with m.Else():
                m.next = "BWD_NEXT"
        with s.seq_state("WG_BLOCK"):
            # kept word of block j is being read (k_rd.addr = j); skip empty blocks
            m.next = "WG_BLOCK2"
        with s.seq_state("WG_BLOCK2"):
            m.d.sync += s.lanes_on.eq(s.kept_j)
            with m.If(s.kept_j == 0):
                m.next = "WG_NEXT_BLOCK"
            with m.Else():
                m.d.sync += s.k.eq(0)
                m.next = "WG_K"
        with s.seq_state("WG_K"):
            m.d.sync += [s.b.eq(0), s.s1_valid.eq(0), s.s2_valid.eq(0), s.live_count.eq(0),
                         s.m2_valid.eq(0), s.m2_last.eq(0), s.m3_valid.eq(0), s.m3_last.eq(0),
                         s.a_row.eq(s.abase), s.g_row.eq(s.gbase)]
            m.d.comb += s.acc_clear.eq(1)
            if s.has_psg:
                thr = Mux(s.psg_rel, s.psg_max >> s.psg_tau[:6], s.psg_tau)
                m.d.sync += s.psg_thr.eq(Mux(thr >= 1 << (s.PRED - 1), 1 << (s.PRED - 1), thr))
                with m.If(s.psg_on):
                    m.next = "WG_LOW"
                with m.Else():
                    m.next = "WG_FULL"
            else:
                m.next = "WG_FULL"
        # full-precision pass over the batch (SGD, or the PSG recompute of uncertain
        # lanes), and the PSG predictor's low-precision pass
        passes = (("WG_FULL", False), ("WG_LOW", True)) if s.has_psg else (("WG_FULL", False),)
        for state, low in passes:
            with s.seq_state(state):
                recompute = s.psg_on & ~s.psg_pass_a if not low else None
                gate = Signal(s.P, name=f"gate_{state}")
                if low:
                    m.d.comb += gate.eq(s.lanes_on)
                else:
                    m.d.comb += gate.eq(Mux(s.psg_on, s.uncertain, s.lanes_on))
                # stage 0: A[b, k]
                m.d.comb += s.a_rd.addr.eq(s.a_row + s.k)
                with m.If(s.b < s.batch):
                    m.d.comb += s.count("act_msb_reads" if low else "act_reads")
                    m.d.sync += [s.b.eq(s.b + 1), s.a_row.eq(s.a_row + s.K)]
                m.d.sync += [s.s1_valid.eq(s.b < s.batch), s.s1_last.eq(s.b == s.batch - 1)]
                # stage 1: dY word (b, j) unless A is zero and skipping (g_row follows
                # the sample in stage 1)
                av = s.a_rd.data
                live1 = (av != 0) | ~s.zs
                m.d.comb += s.g_rd.addr.eq(s.g_row + s.j)
                with m.If(s.s1_valid):
                    m.d.sync += s.g_row.eq(s.g_row + s.nb)
                    with m.If(live1):
                        m.d.comb += s.count("grad_msb_lane_reads" if low else
                                            "grad_lane_reads", popcount(gate))
                        if low:
                            # live samples: each confident lane skips their full MACs
                            m.d.sync += s.live_count.eq(s.live_count + 1)
                    if low:
                        with m.Elif(~(s.psg_rel & ~s.psg_pass_a)):
                            m.d.comb += s.count("skip_zero", popcount(gate))
                    else:
                        with m.Elif(~s.psg_on):
                            m.d.comb += s.count("skip_zero", popcount(gate))
                m.d.sync += [s.s2_valid.eq(s.s1_valid), s.s2_live.eq(live1), s.s2_act.eq(av),
                             s.s2_last.eq(s.s1_last)]
                # stage 2: multiply
                drop = spec.GRAD_BITS - spec.PSG_GRAD_MSBS
                for i in range(s.P):
                    if low:
                        # the top bits of the magnitude with the sign: dY / 2**drop
                        # truncated toward zero, (g + (2**drop - 1 if g < 0)) >> drop,
                        # which is g's top bits plus the carry out of its low bits
                        gi = s.g_lane[i]
                        hi = gi[drop:].as_signed() + (gi[-1] & (gi[:drop] != 0))
                        m.d.comb += [s.mul_a[i].eq(hi),
                                     s.mul_b[i].eq(s.s2_act >> (spec.ACT_BITS -
                                                                spec.PSG_ACT_MSBS))]
                    else:
                        m.d.comb += [s.mul_a[i].eq(s.g_lane[i]), s.mul_b[i].eq(s.s2_act)]
                    m.d.sync += [s.m2_valid.eq(s.s2_valid & s.s2_live),
                                 s.m2_last.eq(s.s2_valid & s.s2_last), s.m2_gate.eq(gate)]
                with m.If(s.s2_valid & s.s2_live):
                    m.d.comb += s.count("mac_weight_grad_low" if low else "mac_weight_grad",
                                        popcount(gate))
                # stage 3: accumulate
                m.d.comb += s.acc_add.eq(s.m3_valid)
                with m.If(s.m3_last):
                    if low:
                        m.next = "PSG_DECIDE"
                    else:
                        m.next = "UPD_HANDOFF"
        if s.has_psg:
            with s.seq_state("PSG_DECIDE"):
                # |q| > thr without the negation: q > thr if q >= 0, else ~q = -q - 1 >= thr;
                # both are Cat(sign, q ^ sign) > Cat(0, thr), one comparator per lane
                def exceeds(q):
                    sign = q[-1]
                    folded = (q.as_unsigned() ^ sign.replicate(len(q)))[:len(q) - 1]
                    return Cat(sign, folded) > Cat(Const(0, 1), s.psg_thr)
                conf = Cat(*[s.lanes_on[i] & exceeds(s.pred[i]) for i in range(s.P)])
                with m.If(s.psg_pass_a):
                    # relative mode, first pass: only the maximum over kept lanes, found
                    # one lane per cycle
                    m.d.sync += s.p.eq(0)
                    m.next = "PSG_MAX"
                with m.Else():
                    # skip_psg, live_count per confident lane, is counted by the update
                    # unit, one lane per cycle
                    m.d.sync += [s.confident.eq(conf), s.uncertain.eq(s.lanes_on & ~conf)]
                    with m.If((s.lanes_on & ~conf) != 0):
                        m.d.comb += s.acc_zero.eq(s.lanes_on & ~conf)
                        m.d.sync += [s.b.eq(0), s.s1_valid.eq(0), s.s2_valid.eq(0),
                                     s.m2_valid.eq(0), s.m2_last.eq(0),
                                     s.m3_valid.eq(0), s.m3_last.eq(0),
                                     s.a_row.eq(s.abase), s.g_row.eq(s.gbase)]
                        m.next = "WG_FULL"
                    with m.Else():
                        m.next = "UPD_HANDOFF"
            with s.seq_state("PSG_MAX"):
                q = Array(s.pred)[s.p]
                mag_p = Mux(q < 0, -q, q).as_unsigned()
                with m.If(s.lanes_on.bit_select(s.p, 1) & (mag_p > s.psg_max)):
                    m.d.sync += s.psg_max.eq(mag_p)
                m.d.sync += s.p.eq(s.p + 1)
                with m.If(s.p == s.P - 1):
                    m.next = "WG_NEXT_K"

    def _update_and_next(self, m, s):
        """UPD_HANDOFF: the update hand-off; WG_WAIT, WG_NEXT_*: the loops over k
        and j; BWD_NEXT, DESC_BWD: the next layer down."""
        with s.seq_state("UPD_HANDOFF"):
            # hand (j, k)'s gradient to the update unit, which writes it back while the
            # next (j, k) accumulates; wait only if it is still busy with the last one
            with m.If(~s.u_busy):
                u = s.correction + s.lr_shift
                m.d.comb += [s.upd.start.eq(1), s.upd.lanes_on.eq(s.lanes_on),
                             s.upd.addr.eq(s.w_row + s.k),
                             s.upd.shift.eq(Mux(u < 0, 0, Mux(u > spec.UPDATE_SHIFT_MAX,
                                                              spec.UPDATE_SHIFT_MAX, u))),
                             s.upd.skip.eq(Mux(s.psg_on, s.confident, 0)),
                             s.upd.live.eq(s.live_count)]
                # PSG needs only a sign: the prediction's where it was confident
                m.d.comb += s.u_load.eq(1)
                with m.If(s.k + 1 < s.K):
                    m.d.sync += s.k.eq(s.k + 1)
                    m.next = "WG_K"
                with m.Else():
                    m.next = "WG_NEXT_BLOCK"
        with s.seq_state("WG_WAIT"):
            with m.If(~s.u_busy):
                m.next = "BWD_NEXT"
        with s.seq_state("WG_NEXT_K"):
            with m.If(s.k + 1 < s.K):
                m.d.sync += s.k.eq(s.k + 1)
                m.next = "WG_K"
            with m.Else():
                m.next = "WG_NEXT_BLOCK"
        with s.seq_state("WG_NEXT_BLOCK"):
            with m.If(s.j + 1 < s.nb):
                m.d.sync += [s.j.eq(s.j + 1), s.w_row.eq(s.w_row + s.K)]
                m.next = "WG_BLOCK"
            with m.Elif(s.psg_pass_a):
                m.d.sync += [s.psg_pass_a.eq(0), s.j.eq(0), s.w_row.eq(s.wbase)]
                m.next = "WG_BLOCK"
            with m.Else():
                m.next = "WG_WAIT"

        with s.seq_state("BWD_NEXT"):
            with m.If(s.do_igrad):
                m.d.sync += [s.correction.eq(s.correction + spec.WEIGHT_FRAC_BITS - s.dx_shift),
                             s.cur_half.eq(~s.cur_half)]
            with m.If(s.l == 0):
                m.d.comb += [s.count("batches"), s.count("samples", s.batch)]
                m.d.sync += [s.busy.eq(0), s.limit_start.eq(1)]
                m.next = "IDLE"
            with m.Else():
                m.d.sync += s.l.eq(s.l - 1)
                m.next = "DESC_BWD"
        with s.seq_state("DESC_BWD"):
            self._load_descriptor(m, s, "BWD_LAYER")

    def _input_grad_pipeline(self, m, s):
        """Stages 1 to 3 of the input-gradient pipeline."""
        # stages 1 to 3 of the input-gradient pipeline (IG_RUN issues, IG_DRAIN empties it)
        with m.If(s.ig_pipe):
            # stage 1: the products of the kept lanes of the block read last cycle
            kept1 = Signal(s.P, name="ig_kept1")
            m.d.comb += kept1.eq(Mux(s.dense, s.s1_lanes, s.k_rd.data) if s.has_ssprop
                                 else s.s1_lanes)
            for i in range(s.P):
                m.d.comb += [s.mul_a[i].eq(s.w_lane[i]), s.mul_b[i].eq(s.g_lane[i])]
            m.d.comb += s.ig_keep.eq(Mux(s.s1_valid & s.s1_live, kept1, 0))
            # stage 1b: the operands are registered; stage 2 has their products in prod_r
            m.d.sync += [s.s1b_valid.eq(s.s1_valid), s.s1b_last.eq(s.s1_last),
                         s.s1b_relu.eq(s.s1_relu)]
            m.d.sync += [s.s2_valid.eq(s.s1b_valid), s.s2_last.eq(s.s1b_last),
                         s.s2_relu.eq(s.s1b_relu)]
            with m.If(s.s1_valid & s.s1_live):
                m.d.comb += [s.count("mac_input_grad", popcount(kept1)),
                             s.count("weight_reads", popcount(kept1)),
                             s.count("grad_lane_reads", popcount(kept1))]
            # stage 2: the sum of the lanes' products
            m.d.sync += [s.s2t_valid.eq(s.s2_valid), s.s2t_last.eq(s.s2_last),
                         s.s2t_relu.eq(s.s2_relu), s.s2t_sum.eq(tree_sum(s.prod_r))]
            # stage 2t: sum into dX; written at the last slot of its (b, k)
            total = Signal(signed(s.DACC), name="dx_total")
            m.d.comb += total.eq(s.dx_acc + s.s2t_sum)
            dx = Signal(signed(spec.DX_BITS), name="dx")
            m.d.comb += dx.eq(Mux(s.s2t_relu, clamp_signed(total, spec.DX_BITS), 0))
            m.d.sync += [s.s3_valid.eq(s.s2t_valid & s.s2t_last), s.s3_dx.eq(dx)]
            with m.If(s.s2t_valid):
                with m.If(s.s2t_last):
                    m.d.comb += [s.s_wr.addr.eq(s.dx_wr_idx), s.s_wr.data.eq(dx),
                                 s.s_wr.en.eq(1), s.count("grad_writes")]
                    m.d.sync += [s.dx_acc.eq(0), s.dx_wr_idx.eq(s.dx_wr_idx + 1)]
                with m.Else():
                    m.d.sync += s.dx_acc.eq(total)
            # stage 3: the largest |dX| of the batch sets its scale (REQ_START)
            m.d.comb += s.requant.track.eq(s.s3_valid)

    def _writeback_and_update(self, m, s):
        """The writeback unit's and the update unit's wiring."""
        # forward outputs of one block, a lane a cycle through the shared shifter: UQ2.6 bytes
        # into the activation memory, or Q7.8 logits into the gradient memory
        m.d.comb += [s.wb.rounded[0].eq(s.rq_out), s.requant.rounded[0].eq(s.rq_out)]
        # (the entry is not gated by the phase: only `track` is, so that no path runs from the
        # sequencer's state through |dX| and its comparison into the maximum's enable)
        m.d.comb += s.requant.dx[0].eq(s.s3_dx)
        with m.If(s.wb.take):
            m.d.comb += [s.u_shift_down.eq(1), s.rq_take_head.eq(1),
                         s.rq_head_shift.eq(s.wb.take_shift)]
        with m.If(s.wb.grad_wr_en):
            m.d.comb += [s.g_wr.addr.eq(s.wb.grad_wr_word), s.g_wr_value.eq(s.wb.grad_wr_value),
                         s.g_wr_on.eq(1), s.g_wr_lane.eq(s.wb.grad_wr_lane),
                         s.count("grad_writes")]
        with m.If(s.wb.act_wr_en):
            m.d.comb += [s.a_wr.addr.eq(s.wb.act_wr_addr), s.a_wr.data.eq(s.wb.act_wr_data),
                         s.a_wr.en.eq(1), s.count("act_writes")]

        # ---------------------------------------------------------------- update unit
        # W[j, k] <- W - round(G >> shift) (SGD) or W - sign * 2**step (PSG), a lane a cycle
        # through the shared shifter, the old weights from u_word; only changed lanes are
        # written (the weight memory is written a lane at a time; nothing reads it while the
        # update unit runs)
        m.d.comb += [s.upd.psg.eq(s.psg_on), s.upd.step_shift.eq(s.psg_step),
                     s.upd.old_weight.eq(s.u_word[:s.W]), s.upd.twice.eq(s.rq_twice),
                     s.upd.rounded.eq(s.rq_out), s.count("skip_psg", s.upd.skipped)]
        with m.If(s.upd.wr_en):
            m.d.comb += [s.w_wr.addr.eq(s.upd.word_addr),
                         s.w_wr.data.eq(s.upd.wr_value.replicate(s.P)),
                         s.w_wr.en.eq(Const(1, s.P) << s.upd.wr_lane), s.count("weight_writes")]
        with m.If(s.upd.rd_en):
            m.d.comb += [s.w_rd.addr.eq(s.upd.word_addr),
                         s.count("weight_reads", popcount(s.upd.rd_lanes))]
        with m.If(s.upd.word_load):
            m.d.comb += s.u_word_load.eq(1)
        with m.If(s.upd.take):
            m.d.comb += [s.u_word_shift.eq(1), s.u_shift_down.eq(1), s.rq_take_head.eq(1),
                         s.rq_head_shift.eq(s.upd.take_shift)]

    def _shifter_and_lanes(self, m, s):
        """The shared shifter's input, the lanes' controls, u_word and the
        weight reads' enable."""
        m.d.comb += [s.shifter.en.eq(s.rq_take_dx | s.rq_take_head),
                     s.shifter.value.eq(Mux(s.rq_take_dx, s.s_rd.data, s.lanes.head)),
                     s.shifter.shift.eq(Mux(s.rq_take_dx, s.dx_shift, s.rq_head_shift))]

        # ---------------------------------------------------------------- lanes
        # The input-gradient pass zeroes the operand of each lane whose product does not count
        # (ig_keep), so that its adder tree sums all P products (MacLanes.b_zero: a
        # synchronous reset of the operand register, which Yosys packs into the SB_MAC16)
        for i in range(s.P):
            m.d.comb += [s.lanes.operand_a(i).eq(s.mul_a[i]), s.lanes.operand_b(i).eq(s.mul_b[i])]
        m.d.comb += [s.lanes.b_zero.eq(Mux(s.ig_pipe, ~s.ig_keep, 0)),
                     s.lanes.acc_clear.eq(s.acc_clear), s.lanes.acc_zero.eq(s.acc_zero),
                     s.lanes.acc_add.eq(Mux(s.acc_add, s.m3_gate, 0)),
                     s.lanes.snap.eq(s.u_load), s.lanes.snap_shift.eq(s.u_shift_down)]
        with m.If(s.u_word_load):
            m.d.sync += s.u_word.eq(s.w_rd.data)
        with m.Elif(s.u_word_shift):
            m.d.sync += s.u_word.eq(s.u_word >> s.W)

        # weight reads: w_rd.en marks every cycle whose read data is used in the next cycle
        # (without it the data is unspecified). The weight memory may be single-ported (SPRAM,
        # ember_hw.weights), so no such cycle may write weights, and none does:
        # - weights are written only by a bus write while idle (a command answers bus
        #   accesses to memory with `busy`) and by the update unit's stage D (UpdateUnit.wr_en);
        # - they are read by the bus while idle (a read, never in a cycle with a write: one bus
        #   access at a time), by FWD_RUN and IG_RUN, and by the update unit (UpdateUnit.rd_en);
        # - the update unit runs only between the weight-gradient phase's first UPD_HANDOFF and
        #   WG_WAIT, which waits for it to finish; no state in between reads weights (WG_*,
        #   PSG_* and UPD_HANDOFF read activations, dY and the kept mask), and the unit reads a
        #   word before its first write (stage D of the first lane). FWD_RUN and IG_RUN come
        #   only after it (next layer, next command), and the bus only once the command has
        #   finished.
        # WeightMemory.conflict records any cycle with both; the simulation tests check it.
        m.d.comb += s.w_rd.en.eq(Mux(s.busy, s.fsm.ongoing("FWD_RUN") | s.fsm.ongoing("IG_RUN") |
                                     s.upd.rd_en, s.bus_w_rd))

    def _cycle_counters(self, m, s):
        """The cycle counters of the phases."""
        # cycle counters: every busy cycle, and each phase by the states it runs in
        phases = {
            "cycles_forward": ("DESC_FWD", "FWD_LAYER", "FWD_ROW", "FWD_RUN", "FWD_HANDOFF",
                               "FWD_END", "AFTER_FWD",
                               "INF_ROW", "INF_RUN", "INF_WRITE"),
            "cycles_loss": ("LOSS_START", "LOSS_GO", "LOSS_GO2", "LOSS_RUN"),
            "cycles_select": ("DESC_BWD", "BWD_LAYER", "BWD_KEEP", "BWD_BK", "BWD_BNK",
                              "BWD_LAYER2", "SCORE_TOPK", "SCORE_RANDOM",
                              "SELECT", "SELECT_WAIT", "PACK", "BWD_NEXT"),
            "cycles_input_grad": ("IG_START", "IG_A", "IG_RUN", "IG_DRAIN",
                                  "REQ_START", "REQ_RUN"),
            "cycles_weight_grad": ("WG_START", "WG_BLOCK", "WG_BLOCK2", "WG_K", "WG_FULL",
                                   "WG_LOW", "PSG_DECIDE", "PSG_MAX", "WG_NEXT_K",
                                   "WG_NEXT_BLOCK"),
            "cycles_update": ("UPD_HANDOFF", "WG_WAIT"),
        }
        m.d.comb += s.count("cycles", s.busy)
        for name, states in phases.items():
            m.d.comb += s.count(name, sum(s.fsm.ongoing(st) for st in s.present(*states)) != 0)

    def _stopping(self, m, s):
        """Stopping a command (ember_hw.stopper)."""
        # (docs/protocol.md section 10) When a command stops (an abort before its first weight
        # write, or the watchdog: ember_hw.stopper decides, and keeps STOPPED and the
        # command's answer), the sequencer goes to IDLE (_Sequencer.seq_state) and the units
        # that may be half way through something are reset (ResetInserter in _memories and
        # _lane_datapath). The memories keep their contents; of what a command writes, only
        # the weights outlive it (every phase sets up its pointers, accumulators and units
        # before it uses them), so the next command runs as on an engine that never ran the
        # stopped one (tests/test_liveness.py).
        m.submodules.stopper = stopper = CommandStop(s.bld)
        m.d.comb += [stopper.start.eq(s.fsm.ongoing("IDLE") & (s.start_train | s.start_infer)),
                     stopper.busy.eq(s.busy), stopper.abort.eq(s.regs.abort),
                     stopper.weight_write.eq(s.upd.wr_en), stopper.layer.eq(s.l),
                     stopper.watchdog.eq(s.settings.watchdog),
                     s.stop.eq(stopper.stop), s.regs.stopped.eq(stopper.stopped),
                     self.bus.cmd_status.eq(stopper.cmd_status)]
        with m.If(s.stop):
            m.d.sync += [s.busy.eq(0), s.limit_start.eq(1)]

    def _collisions(self, m, s):
        """The memory collision flag for simulations."""
        # No command uses what a memory read returns for a word written in the same cycle
        # (the board builds let such reads return anything: ember_boards.common.
        # read_collision_script). The states that read each memory, and use the data, are
        # below; the forward pass reads layer l's inputs while the writeback unit writes its
        # outputs, which lie elsewhere; the loss unit's pass 3 reads logit n while it writes
        # the gradient of logit n - READ_TO_MULTIPLY - 1, which may share n's word but not its
        # lane, and it uses only n's lane; the other readers run while nothing writes their
        # memory. Idle, the bus reads only labels and predictions, never in the cycle it
        # writes one. The weight memory checks itself (wmem.conflict).
        def reading(*states):
            return Cat(*(s.fsm.ongoing(st) for st in s.present(*states))).any()
        g_used = Signal(s.P)        # the lanes whose gradient-memory reads are used
        with m.If(s.fsm.ongoing("LOSS_RUN")):
            m.d.comb += g_used.eq(Const(1, s.P) << s.loss.rd_addr[:s.LOGP])
        with m.Elif(reading("INF_RUN", "SCORE_TOPK", "IG_RUN", "WG_FULL", "WG_LOW")):
            m.d.comb += g_used.eq((1 << s.P) - 1)
        collisions = [(s.g_wr.en & g_used).any() & (s.g_rd.addr == s.g_wr.addr)]
        readers = [(s.a_rd, s.a_wr, ("FWD_RUN", "IG_A", "IG_RUN", "WG_FULL", "WG_LOW")),
                   (s.s_rd, s.s_wr, ("REQ_RUN",)), (s.l_rd, s.l_wr, ("LOSS_START",))]
        if s.has_ssprop:
            readers.append((s.k_rd, s.k_wr, ("IG_RUN", "WG_BLOCK")))
        collisions += [reading(*states) & wr.en.any() & (rd.addr == wr.addr)
                       for rd, wr, states in readers]
        with m.If(Cat(*collisions).any()):
            m.d.sync += self.read_collision.eq(1)


#: The sequencer states that exist only with an optional unit (spec.FEATURES): a build without
#: the unit has none of them. Every other state name is in every build.
UNIT_STATES = {
    "psg": ("WG_LOW", "PSG_DECIDE", "PSG_MAX"),
    "ssprop": ("SCORE_TOPK", "SELECT", "SELECT_WAIT", "PACK"),
    "ssprop_random": ("SCORE_RANDOM",),
}


class _Sequencer:
    """EngineCore's state, shared by the phases of its elaborate: the build's sizes, the
    memories' ports, the units, the register bank's fields, the sequencer's registers, the
    lanes' datapath signals and the helpers below. EngineCore's phase methods
    (EngineCore._memories ... _collisions) set the attributes up and use them, in elaborate's
    order.

    A signal takes its name from the attribute it is assigned to (``s.K = Signal()`` is
    ``K``). A tuple assignment names only its last signal, and only when it is assigned to a
    plain local variable: to an attribute that name is passed as ``name=``, and memory ports
    are made as locals first, so the netlist keeps the names it had."""

    def __init__(self, m, build):
        self.m = m
        self.bld = bld = build
        self.P = bld.lanes
        self.LOGP = self.P.bit_length() - 1
        self.W = spec.WEIGHT_BITS
        # widths of layer-width and batch-size values: those of their registers (spec's table)
        self.WIDTH = bld.descriptor_fields()["inputs"].bits
        self.BATCH = bld.settings()["batch"].bits
        self.L = bld.max_layers

    def present(self, *states):
        """Those of `states` this build's sequencer has. A name that is neither one of its
        states nor a state of a unit it leaves out (UNIT_STATES) raises ValueError, so that
        a misspelled state is not silently dropped."""
        absent = {st for unit, names in UNIT_STATES.items() if unit not in self.bld.features
                  for st in names}
        for st in states:
            if st not in self.fsm.encoding and st not in absent:
                raise ValueError(f"no sequencer state {st!r} in build '{self.bld.name}'")
        return [st for st in states if st in self.fsm.encoding]

    def count(self, name, amount=1):
        """Counter `name` counts `amount` this cycle (a comb statement)."""
        return self.inc[name].eq(amount)

    @contextmanager
    def seq_state(self, name):
        """A sequencer state; each but IDLE leaves for IDLE when the command is stopped."""
        m = self.m
        with m.State(name):
            yield
            if name != "IDLE":
                with m.If(self.stop):
                    m.next = "IDLE"
