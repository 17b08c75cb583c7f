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
from .bus import BusSignature
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

    Attribute ``wmem``: the weight memory (ember_hw.weights; SPRAM if build.weight_spram).
    Attribute ``read_collision``: a sticky flag for simulations, set by a cycle in which a
    command reads a memory word (a gradient memory lane) that the same cycle writes and uses
    what it read ("Memory collisions" below); nothing reads it on a board, where it is
    optimized away.
    """

    def __init__(self, build=spec.DEFAULT_BUILD):
        self.build = build
        self.wmem = WeightMemory(build.lanes, build.weight_words, spram=build.weight_spram)
        self.read_collision = Signal()
        super().__init__({
            "bus": In(BusSignature()),
            "link_rx": In(1),
            "link_tx": In(1),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        bld = self.build
        P = bld.lanes
        LOGP = P.bit_length() - 1
        W = spec.WEIGHT_BITS
        # widths of layer-width and batch-size values: those of their registers (spec's table)
        WIDTH = bld.descriptor_fields()["inputs"].bits
        BATCH = bld.settings()["batch"].bits
        L = bld.max_layers
        bus = self.bus

        # ---------------------------------------------------------------- memories
        m.submodules.wmem = wmem = self.wmem
        m.submodules.amem = amem = Memory(shape=unsigned(spec.ACT_BITS), depth=bld.act_bytes,
                                          init=[])
        # banked per lane (ember_hw.lanemem), like the weights: each lane's entries in memory
        # of its own
        m.submodules.gmem = gmem = LaneMemory(P, bld.grad_words, spec.GRAD_BITS)
        m.submodules.smem = smem = Memory(shape=signed(spec.DX_BITS),
                                          depth=max(1, bld.scratch_entries), init=[])
        m.submodules.lmem = lmem = Memory(shape=unsigned(spec.LABEL_BITS), depth=bld.max_batch,
                                          init=[])
        m.submodules.pmem = pmem = Memory(shape=unsigned(spec.LABEL_BITS), depth=bld.max_batch,
                                          init=[])
        # optional units (spec.FEATURES): a build without PSG or ssProp leaves their
        # registers, states and memories out; the host never asks for them (FEATURES register)
        has_psg = "psg" in bld.features
        has_ssprop = "ssprop" in bld.features
        has_random = "ssprop_random" in bld.features
        for unit in ("zero_skip", "slu"):
            if unit not in bld.features:
                raise ValueError(f"build '{bld.name}': the engine always has the {unit} unit")
        if has_ssprop:
            m.submodules.kmem = kmem = Memory(shape=unsigned(P), depth=bld.blocks(bld.max_width),
                                              init=[])
            k_rd, k_wr = kmem.read_port(), kmem.write_port()
        w_rd, w_wr = wmem.rd, wmem.wr
        a_rd, a_wr = amem.read_port(), amem.write_port()
        g_rd, g_wr = gmem.rd, gmem.wr
        s_rd, s_wr = smem.read_port(), smem.write_port()
        l_rd, l_wr = lmem.read_port(), lmem.write_port()
        p_rd, p_wr = pmem.read_port(), pmem.write_port()

        # a stopped command (abort or watchdog, "stopping a command" below) resets the units
        # it may leave half way; their memories keep their contents
        stop = Signal()
        loss = SoftmaxGradUnit(max_classes=bld.max_width)
        m.submodules.loss = ResetInserter(stop)(loss)
        if has_ssprop:
            sel = ChannelSelector(max_channels=bld.max_width)
            m.submodules.selector = ResetInserter(stop)(sel)
        if has_random:
            m.submodules.lfsr = lfsr = Lfsr16()

        # ---------------------------------------------------------------- register bank
        # the settings, layer descriptors and CONTROL (ember_hw.regbank, from spec's tables);
        # a build without an optional unit has no register for its settings (they read as
        # their init, constantly)
        m.submodules.regs = regs = RegisterBank(bld)
        settings = regs.settings
        batch, n_layers, update_mask = settings.batch, settings.layers, settings.update_mask
        lr_shift, flags, psg_tau = settings.lr_shift, settings.flags, settings.psg_tau
        psg_step, keep_q8, lfsr_seed = (settings.psg_step_shift, settings.keep_q8,
                                        settings.lfsr_seed)
        zero_skip_reg, psg_on, psg_rel, ss_random = (flags[spec.FLAG_BITS.index(name)] for name in
                                                     ("zero_skip", "psg", "psg_relative",
                                                      "ssprop_random"))
        off = Const(0, 1)
        if not has_psg:
            psg_on = psg_rel = off
        if not has_random:
            ss_random = off
        # The sequencer loads the current layer's descriptor into registers (K, N, wbase,
        # abase, shift, and next_abase: layer l + 1's act_base) each time it moves to another
        # layer (DESC_FWD, DESC_BWD). Layer L's words are never written (always 0). Layer 0's
        # input count (inputs0) is a factor of the input batch's size.
        field_bits = {name: f.bits for name, f in regs.fields.items()}
        inputs0 = regs.inputs0
        correct = Signal.like(regs.correct)
        label = Signal(spec.LABEL_BITS)
        m.d.comb += regs.correct.eq(correct)

        # a serial multiplier for the products of two signals needed once per layer or
        # command (b is always a layer width). A command uses it for its per-layer products
        # (bulk counters, the ssProp keep count); while idle it holds the input batch's bytes,
        # batch * inputs of layer 0, the bus write limit of the activation region, recomputed
        # after a write of either register and after each command
        m.submodules.mul = mul = SerialMultiplier(max(BATCH + WIDTH, len(keep_q8)), WIDTH)
        limit_start = Signal()
        m.d.sync += limit_start.eq(regs.limit_changed)
        m.d.comb += [mul.start.eq(limit_start), mul.a.eq(batch), mul.b.eq(inputs0)]

        # ---------------------------------------------------------------- counters
        # the largest amount each counter can take in one cycle sizes its pre-counter
        bnk = bld.max_batch * bld.max_width * bld.max_width
        bounds = {name: 1 for name in spec.COUNTERS}
        bounds.update({name: P for name in (
            "mac_forward", "mac_input_grad", "mac_weight_grad", "mac_weight_grad_low",
            "weight_reads", "weight_writes", "grad_lane_reads", "grad_msb_lane_reads")})
        bounds.update(samples=bld.max_batch, infer_samples=bld.max_batch,
                      loss_elements=bld.max_width, skip_zero=max(P, bld.max_width),
                      skip_psg=P * bld.max_batch, skip_slu=2 * bnk, skip_ssprop=2 * bnk)
        m.submodules.counters = counters = CounterFile(bounds)
        inc = {name: getattr(counters.inc, name) for name in spec.COUNTERS}
        m.d.comb += [counters.clear.eq(regs.clear_counters),
                     inc["link_rx_bytes"].eq(self.link_rx), inc["link_tx_bytes"].eq(self.link_tx)]

        def count(name, amount=1):
            return inc[name].eq(amount)

        # ---------------------------------------------------------------- command state
        busy = Signal()
        infer_mode = Signal()
        m.d.comb += self.busy.eq(busy)
        # a CONTROL write registers its strobes (one cycle each): the sequencer and the
        # counters act on them in the next cycle
        start_train, start_infer = regs.start_train, regs.start_infer
        m.d.comb += regs.busy.eq(busy)
        # the end of a command, for the bridge's deferred answer (how it ended: below)
        busy_was = Signal()
        m.d.sync += busy_was.eq(busy)
        m.d.comb += bus.cmd_done.eq(busy_was & ~busy)

        # ---------------------------------------------------------------- bus slave
        # the "regs" region is the register bank's, the memory regions the memory window's
        # (ember_hw.memwindow)
        region = bus.addr[spec.REGION_BITS:]
        offset = bus.addr[:spec.REGION_BITS]
        desc_loading = Signal()             # the sequencer has the descriptor read port
        desc_addr = Signal.like(regs.desc_addr)
        m.d.comb += [regs.desc_loading.eq(desc_loading), regs.desc_addr.eq(desc_addr),
                     counters.read_req.eq(regs.counter_req),
                     counters.read_index.eq(regs.counter_index),
                     regs.counter_valid.eq(counters.read_valid),
                     regs.counter_data.eq(counters.read_data)]

        # the answer to an access is registered: decided in one cycle (answer_*), on the bus
        # in the next, so that no path runs from the master's address through the decoding
        # here and back into the master
        answer_ack, answer_err, answer_defer = Signal(), Signal(), Signal()
        answer_data = Signal.like(bus.r_data)
        m.d.sync += [bus.ack.eq(answer_ack), bus.err.eq(answer_err),
                     bus.r_data.eq(answer_data), bus.defer.eq(answer_defer)]
        m.d.comb += regs.owing.eq(bus.owing)

        # the master drops its strobe in the cycle after the answer (bus contract); the answer
        # is on the bus a cycle after it is decided, and in that cycle the access is over
        active = Signal()
        m.d.comb += active.eq((bus.w_stb | bus.r_stb) & ~bus.ack & ~bus.err)
        wr = bus.w_stb
        m.d.comb += [regs.sel.eq(active & (region == 0)), regs.addr.eq(offset),
                     regs.write.eq(wr), regs.w_data.eq(bus.w_data)]
        m.submodules.window = win = MemoryWindow(bld)
        m.d.comb += [win.sel.eq(active & (region != 0)), win.addr.eq(bus.addr),
                     win.write.eq(wr), win.w_data.eq(bus.w_data), win.busy.eq(busy),
                     win.act_limit.eq(mul.product), win.limit_ready.eq(~limit_start & mul.done),
                     win.classes.eq(regs.classes)]
        with m.If(active):
            with m.If(region == 0):
                m.d.comb += [answer_ack.eq(regs.ack), answer_err.eq(regs.err),
                             answer_data.eq(regs.data), answer_defer.eq(regs.defer)]
            with m.Else():
                m.d.comb += [answer_ack.eq(win.ack), answer_err.eq(win.err),
                             answer_data.eq(win.data)]
        # memory ports driven by the window when idle (it requests nothing while busy; the
        # sequencer's states, below, drive them then)
        bus_w_addr = win.w_rd_addr
        bus_w_rd = win.w_rd                 # the bus reads a weight word (w_rd.en when idle)
        # (the lanes' data registers are reset_less: every phase writes them before it reads
        # them, and a reset net to thousands of flip-flops only costs routing)
        u_word = Signal(P * W, reset_less=True)     # a weight word, shifted down a lane a cycle
        u_word_load = Signal()              # u_word <- the weight word read last cycle
        u_word_shift = Signal()             # u_word shifts down one lane
        m.d.comb += [w_wr.addr.eq(win.w_wr_addr), w_wr.data.eq(win.w_wr_data),
                     w_wr.en.eq(win.w_wr_en),
                     u_word_load.eq(win.u_word_load), u_word_shift.eq(win.u_word_shift),
                     win.u_word_low.eq(u_word[:spec.BUS_DATA_BITS]),
                     a_wr.addr.eq(win.act_wr_addr), a_wr.data.eq(win.act_wr_data),
                     a_wr.en.eq(win.act_wr_en), count("act_writes", win.act_wr_en),
                     l_wr.addr.eq(win.label_wr_addr), l_wr.data.eq(win.label_wr_data),
                     l_wr.en.eq(win.label_wr_en),
                     regs.label_word.eq(win.label_word), regs.label_written.eq(win.label_written),
                     l_rd.addr.eq(win.label_rd_addr), p_rd.addr.eq(win.label_rd_addr),
                     win.label_rd_data.eq(l_rd.data), win.pred_rd_data.eq(p_rd.data)]

        # ---------------------------------------------------------------- sequencer state
        l = Signal(range(L + 1))            # current layer
        b = Signal(BATCH)
        j = Signal(WIDTH)
        k = Signal(WIDTH)
        n = Signal(WIDTH)
        p = Signal(range(P + 1))
        # layer l's descriptor, loaded from dmem (DESC_FWD, DESC_BWD)
        K = Signal(field_bits["inputs"])
        N = Signal(field_bits["outputs"])
        wbase = Signal(field_bits["weight_base"])
        abase = Signal(field_bits["act_base"])
        shift = Signal(field_bits["shift"])
        next_abase = Signal(field_bits["act_base"])
        desc_regs = [K, N, wbase, abase, shift, next_abase]     # in the order they load
        desc_step = Signal(range(len(desc_regs) + 1))
        # blocks of the current layer's outputs (N) and of its inputs (K: the outputs of the
        # layer below), loaded with N and K
        nb, nb_below = Signal(WIDTH), Signal(WIDTH)
        last_layer = Signal()
        m.d.comb += last_layer.eq(l == n_layers - 1)
        half = bld.grad_words // 2
        cur_half = Signal()                 # which half of gmem holds the current dY
        gbase = Signal(_bits(bld.grad_words))
        gbase_below = Signal(_bits(bld.grad_words))
        m.d.comb += [gbase.eq(Mux(cur_half, half, 0)), gbase_below.eq(Mux(cur_half, 0, half))]
        zs = Signal()
        m.d.comb += zs.eq(zero_skip_reg | infer_mode)

        # running pointers, stepped by addition as the loops advance (no products of two
        # signals outside the MAC lanes); each phase sets them up and steps them in its order
        a_row = Signal.like(abase)          # act address of (b, k=0) of the current layer's input
        o_row = Signal.like(abase)          # forward: act address of (b, 0) of its output
        w_row = Signal.like(wbase)          # weight word of (j, k=0)
        g_row = Signal(_bits(bld.grad_words))   # gradient word of (b, j=0) (REQ: the half below)

        # lane datapath
        # accumulators as wide as this build's largest sums (spec.Build.*_bits)
        LACC, DACC, PRED = bld.lane_acc_bits(), bld.dx_acc_bits(), bld.pred_bits()
        assert PRED <= LACC, "the PSG prediction is accumulated in the lane accumulators"
        # each phase chooses the lanes' operands (mul_a, mul_b); the lanes (ember_hw.lanes)
        # register them before the multiplier, so that a memory read, the operand choice and a
        # multiply are not one path: products reach prod_r two cycles after their operands are
        # chosen (operands: a weight or dY, and an activation or dY; signed)
        OPND = max(W, spec.GRAD_BITS, spec.ACT_BITS + 1)
        m.submodules.lanes = lanes = MacLanes(P, OPND, LACC)
        acc = [lanes.accumulator(i) for i in range(P)]
        prod_r = [lanes.product(i) for i in range(P)]
        mul_a = [Signal(signed(OPND), name=f"mul_a{i}") for i in range(P)]
        mul_b = [Signal(signed(OPND), name=f"mul_b{i}") for i in range(P)]
        w_lane = [w_rd.data.word_select(i, W).as_signed() for i in range(P)]
        g_lane = [g_rd.data.word_select(i, spec.GRAD_BITS).as_signed() for i in range(P)]
        # gradient memory writes are one lane at a time (loss unit, dX requantizer, logits):
        # one 16-bit value goes to every lane and the lane's write enable picks it (so the
        # writers' multiplexer is 16 bits wide, not P * 16)
        assert spec.LOGIT_BITS == spec.GRAD_BITS, "logits and dY share the gradient memory"
        g_wr_value = Signal(spec.GRAD_BITS)
        g_wr_lane = Signal(range(P))
        g_wr_on = Signal()
        m.d.comb += [g_wr.data.eq(g_wr_value.replicate(P)),
                     g_wr.en.eq(Mux(g_wr_on, Const(1, P) << g_wr_lane, 0))]

        # pipeline registers of the streaming loops: stage 1 has the operands read in stage 0
        s1_valid, s2_valid = Signal(), Signal()
        s1_last, s2_last = Signal(), Signal()
        s2_live = Signal()
        # forward and weight-gradient loops: stage 2 chooses the operands (m2: registered
        # operands), stage 3 has the registered products (m3), accumulated into the lanes of
        # m3_gate; the m2 flags follow into m3 every cycle unless a state sets them
        m2_valid, m2_last, m2_gate = Signal(), Signal(), Signal(P)
        m3_valid, m3_last = Signal(), Signal()
        m3_gate = Signal(P)
        m.d.sync += [m3_valid.eq(m2_valid), m3_last.eq(m2_last), m3_gate.eq(m2_gate)]
        ig_keep = Signal(P)                 # input gradient: the lanes whose products count
        s2_act = Signal(spec.ACT_BITS)
        # the lanes' registers are stepped in one place (end of elaborate) by these strobes
        acc_clear = Signal()                # accumulators to 0
        acc_zero = Signal(P)                # these lanes' accumulators to 0
        acc_add = Signal()                  # acc += prod_r in the lanes of m3_gate
        u_load = Signal()                   # the lanes' snapshot <- acc (MacLanes.snap)
        u_shift_down = Signal()             # the snapshot moves down a lane: its head was taken
        lanes_on = Signal(P)                # kept lanes of the current block
        s1_lanes = Signal(P)

        # one rounding shifter (ember_hw.arith), shared by the three units that requantize and
        # never run at the same time: the forward writeback (ember_hw.writeback), the dX
        # requantizer (ember_hw.requant, in REQ_RUN) and the update unit (ember_hw.update). The
        # writeback and update units take the head lane of the lanes' snapshot (rq_take_head,
        # with their shift in rq_head_shift), the requantizer a dX entry (rq_take_dx). rq_twice
        # has round_shift_twice(value) (its sign is the value's) the cycle after the take,
        # rq_out the rounded value two cycles after it
        m.submodules.shifter = shifter = RoundingShifter(max(LACC, spec.DX_BITS),
                                                         spec.SHIFT_MAX)
        rq_twice, rq_out = shifter.twice, shifter.out
        rq_take_head, rq_take_dx = Signal(), Signal()
        rq_head_shift = Signal.like(shifter.shift)

        # scalar helpers
        dx_acc = Signal(signed(DACC))
        # the dX requantizer: the batch's largest |dX|, its scale, and the saturation to dY
        requant = DxRequantizer()
        m.submodules.requant = ResetInserter(stop)(requant)
        dx_shift = requant.shift
        # the update shift's correction: WEIGHT_FRAC_BITS - dx_shift for each layer above
        correction = Signal(range(-(L - 1) * max(0, spec.DX_SHIFT_MAX - spec.WEIGHT_FRAC_BITS),
                                  (L - 1) * spec.WEIGHT_FRAC_BITS + 1))
        keep = Signal(WIDTH)
        batch_k = Signal(BATCH + WIDTH)     # batch * K of the current layer
        do_wgrad, do_igrad = Signal(), Signal()
        live_count = Signal(BATCH)          # PSG: live samples of the low pass of (j, k)
        psg_max = Signal(PRED)
        # the threshold of PSG_DECIDE, set in WG_K; no |prediction| exceeds 2**(PRED-1),
        # so larger thresholds are held as that
        psg_thr = Signal(PRED)
        psg_pass_a = Signal()               # relative mode: first pass, finds the maximum
        # the PSG prediction is accumulated in the lane's accumulator (it fits PRED bits); the
        # uncertain lanes' are cleared for the recompute, the confident lanes' kept
        pred = [a[:PRED].as_signed() for a in acc]
        confident = Signal(P)
        uncertain = Signal(P)
        # the update unit's copy of one (j, k): gradient sources, kept lanes, address, shift
        upd = UpdateUnit(P, LACC, addr_bits=len(wbase), live_bits=BATCH, step_bits=len(psg_step))
        m.submodules.update = ResetInserter(stop)(upd)
        u_busy = upd.busy
        # the forward writeback unit (it takes the lanes' snapshot a lane a cycle)
        wb = ForwardWriteback(P, LACC, act_addr_bits=len(abase),
                              grad_addr_bits=_bits(bld.grad_words), shift_bits=len(shift))
        m.submodules.writeback = ResetInserter(stop)(wb)
        wb_busy = wb.busy
        score = Signal(len(sel.score_data) if has_ssprop else 1)
        packed = Signal(P)

        kept_dense = Signal(P)              # lanes of block j that exist
        remaining = Signal(signed(WIDTH + 1))
        m.d.comb += remaining.eq(N - (j << LOGP))
        # lanes 0 .. remaining - 1, as a thermometer code (no comparator per lane)
        thermometer = ((Const(1, P + 1) << remaining[:LOGP]) - 1)[:P] if LOGP else Const(0, 1)
        m.d.comb += kept_dense.eq(Mux(remaining[-1] | (remaining == 0), 0,
                                      Mux(remaining[LOGP:-1] != 0, (1 << P) - 1, thermometer)))
        dense = Signal()
        m.d.comb += dense.eq(keep >= N if has_ssprop else 1)

        # memory port defaults: the bus drives them when idle
        with m.If(~busy):
            m.d.comb += w_rd.addr.eq(bus_w_addr)

        @contextmanager
        def seq_state(name):
            """A sequencer state; each but IDLE leaves for IDLE when the command is stopped."""
            with m.State(name):
                yield
                if name != "IDLE":
                    with m.If(stop):
                        m.next = "IDLE"

        # --------------------------------------------------------------------- the FSM
        with m.FSM(name="seq") as fsm:
            with seq_state("IDLE"):
                with m.If(start_train | start_infer):
                    # (desc_step: a stopped command may have left a descriptor half loaded)
                    m.d.sync += [busy.eq(1), infer_mode.eq(start_infer), b.eq(0), l.eq(0),
                                 j.eq(0), correct.eq(0), correction.eq(0), cur_half.eq(0),
                                 desc_step.eq(0)]
                    if has_random:
                        m.d.comb += [lfsr.load.eq(1), lfsr.seed.eq(lfsr_seed)]
                    m.next = "DESC_FWD"

            # ---------------- layer l's descriptor into K, N, ...: one read a cycle
            def load_descriptor(then):
                m.d.comb += desc_loading.eq(1)
                fields = [l * spec.LAYER_STRIDE + f for f in range(len(spec.LAYER_FIELDS))]
                fields.append((l + 1) * spec.LAYER_STRIDE + spec.LAYER_FIELDS.index("act_base"))
                m.d.comb += desc_addr.eq(Array(fields)[desc_step])
                blocks = (regs.desc_data + P - 1) >> LOGP
                with m.Switch(desc_step):
                    for i, reg in enumerate(desc_regs):
                        with m.Case(i + 1):
                            m.d.sync += reg.eq(regs.desc_data)
                            if reg is N:
                                m.d.sync += nb.eq(blocks)
                            elif reg is K:
                                m.d.sync += nb_below.eq(blocks)
                m.d.sync += desc_step.eq(desc_step + 1)
                with m.If(desc_step == len(desc_regs)):
                    m.d.sync += desc_step.eq(0)
                    m.next = then

            with seq_state("DESC_FWD"):
                load_descriptor("FWD_LAYER")

            # ---------------- forward: for l, for b, for j: acc = W[j] . A[b]; write back
            # (layer by layer over the batch, so that the row pointers step by the layer's
            # strides K, N and nb)
            with seq_state("FWD_LAYER"):
                # layer l reads the layer below's outputs: wait until the writeback unit has
                # written the last of them, then point at sample 0, block 0
                with m.If(~wb_busy):
                    m.d.sync += [a_row.eq(abase), o_row.eq(next_abase), w_row.eq(wbase),
                                 g_row.eq(gbase)]
                    m.next = "FWD_ROW"
            with seq_state("FWD_ROW"):
                m.d.sync += [k.eq(0), s1_valid.eq(0), s2_valid.eq(0), m2_valid.eq(0),
                             m2_last.eq(0), m3_valid.eq(0), m3_last.eq(0)]
                m.d.comb += acc_clear.eq(1)
                m.next = "FWD_RUN"
            with seq_state("FWD_RUN"):
                # stage 0: read A[b, k]
                m.d.comb += [a_rd.addr.eq(a_row + k), count("act_reads", k < K)]
                m.d.sync += [s1_valid.eq(k < K), s1_last.eq(k == K - 1)]
                with m.If(k < K):
                    m.d.sync += k.eq(k + 1)
                # stage 1: A known; read the weight word unless A is zero and skipping
                a_val = a_rd.data
                live1 = (a_val != 0) | ~zs
                m.d.comb += w_rd.addr.eq(w_row + k - 1)
                lanes_valid = Signal(P)
                m.d.comb += lanes_valid.eq(kept_dense)
                with m.If(s1_valid):
                    with m.If(live1):
                        m.d.comb += count("weight_reads", popcount(lanes_valid))
                    with m.Else():
                        m.d.comb += count("skip_zero", popcount(lanes_valid))
                m.d.sync += [s2_valid.eq(s1_valid), s2_live.eq(live1), s2_act.eq(a_val),
                             s2_last.eq(s1_last)]
                # stage 2: multiply
                for i in range(P):
                    m.d.comb += [mul_a[i].eq(w_lane[i]), mul_b[i].eq(s2_act)]
                m.d.sync += [m2_valid.eq(s2_valid & s2_live), m2_last.eq(s2_valid & s2_last),
                             m2_gate.eq(lanes_valid)]
                with m.If(s2_valid & s2_live):
                    m.d.comb += count("mac_forward", popcount(lanes_valid))
                # stage 3: accumulate
                m.d.comb += acc_add.eq(m3_valid)
                with m.If(m3_last):
                    m.next = "FWD_HANDOFF"
            with seq_state("FWD_HANDOFF"):
                # the writeback unit requantizes and writes this block while the next block
                # accumulates; the next layer (which reads these outputs) and the loss wait
                with m.If(~wb_busy):
                    m.d.comb += [wb.start.eq(1), wb.last.eq(last_layer), wb.shift.eq(shift),
                                 wb.lanes_on.eq(kept_dense),
                                 wb.act_addr.eq(o_row + (j << LOGP)),
                                 wb.grad_word.eq(g_row + j)]
                    m.d.comb += u_load.eq(1)
                    with m.If(j + 1 < nb):
                        m.d.sync += [j.eq(j + 1), w_row.eq(w_row + K)]
                        m.next = "FWD_ROW"
                    with m.Elif(b + 1 < batch):
                        m.d.sync += [j.eq(0), b.eq(b + 1), w_row.eq(wbase),
                                     a_row.eq(a_row + K), o_row.eq(o_row + N),
                                     g_row.eq(g_row + nb)]
                        m.next = "FWD_ROW"
                    with m.Elif(~last_layer):
                        m.d.sync += [j.eq(0), b.eq(0), l.eq(l + 1)]
                        m.next = "DESC_FWD"
                    with m.Else():
                        m.d.sync += b.eq(0)
                        m.next = "FWD_END"
            with seq_state("FWD_END"):
                with m.If(~wb_busy):
                    m.next = "AFTER_FWD"
            with seq_state("AFTER_FWD"):
                # the logits of sample 0 (the output layer's dY after the loss)
                m.d.sync += [b.eq(0), g_row.eq(gbase)]
                with m.If(infer_mode):
                    m.d.sync += n.eq(0)
                    m.next = "INF_ROW"
                with m.Else():
                    m.next = "LOSS_START"

            # ---------------- inference: argmax of the logits per sample
            best = Signal(signed(spec.LOGIT_BITS))
            best_n = Signal(WIDTH)
            # the scalar readers of the gradient memory (inference, ssProp scores) register the
            # lane they read (g_pick) before using it
            g_pick = Signal(signed(spec.GRAD_BITS))
            s2_first = Signal()
            s2_index = Signal(WIDTH)
            with seq_state("INF_ROW"):
                m.d.sync += [n.eq(0), s1_valid.eq(0), s2_valid.eq(0), best_n.eq(0)]
                m.next = "INF_RUN"
            with seq_state("INF_RUN"):
                # stage 0: read logit n; stage 1: its lane into g_pick; stage 2: compare
                m.d.comb += [g_rd.addr.eq(g_row + (n >> LOGP)), count("grad_reads", n < N)]
                m.d.sync += [s1_valid.eq(n < N), s1_last.eq(n == N - 1),
                             p.eq(n[:LOGP] if LOGP else 0)]
                with m.If(n < N):
                    m.d.sync += n.eq(n + 1)
                m.d.sync += [g_pick.eq(Array(g_lane)[p]), s2_valid.eq(s1_valid),
                             s2_last.eq(s1_last), s2_first.eq(n == 1), s2_index.eq(n - 1)]
                with m.If(s2_valid):
                    with m.If(s2_first | (g_pick > best)):
                        m.d.sync += [best.eq(g_pick), best_n.eq(s2_index)]
                    with m.If(s2_last):
                        m.next = "INF_WRITE"
            with seq_state("INF_WRITE"):
                m.d.comb += [p_wr.addr.eq(b), p_wr.data.eq(best_n), p_wr.en.eq(1)]
                with m.If(b + 1 < batch):
                    m.d.sync += [b.eq(b + 1), g_row.eq(g_row + nb)]
                    m.next = "INF_ROW"
                with m.Else():
                    m.d.comb += count("infer_samples", batch)
                    m.d.sync += [busy.eq(0), limit_start.eq(1)]
                    m.next = "IDLE"

            # ---------------- loss: the softmax-gradient unit, one sample at a time
            with seq_state("LOSS_START"):
                m.d.comb += [l_rd.addr.eq(b)]
                m.next = "LOSS_GO"
            with seq_state("LOSS_GO"):
                m.d.sync += label.eq(l_rd.data)
                m.next = "LOSS_GO2"
            with seq_state("LOSS_GO2"):
                m.d.comb += [loss.start.eq(1), loss.classes.eq(N), loss.label.eq(label)]
                m.d.sync += p.eq(0)
                m.next = "LOSS_RUN"
            with seq_state("LOSS_RUN"):
                m.d.comb += [loss.classes.eq(N), loss.label.eq(label),
                             g_rd.addr.eq(g_row + (loss.rd_addr >> LOGP))]
                m.d.sync += p.eq(loss.rd_addr[:LOGP] if LOGP else 0)
                m.d.comb += loss.rd_data.eq(Array(g_lane)[p])
                with m.If(loss.rd_en):
                    m.d.comb += count("grad_reads")
                with m.If(loss.wr_en):
                    m.d.comb += [g_wr.addr.eq(g_row + (loss.wr_addr >> LOGP)),
                                 g_wr_value.eq(loss.wr_data), g_wr_on.eq(1),
                                 g_wr_lane.eq(loss.wr_addr[:LOGP]),
                                 count("grad_writes")]
                with m.If(loss.done):
                    m.d.comb += count("loss_elements", N)
                    m.d.sync += correct.eq(correct + loss.correct)
                    with m.If(b + 1 < batch):
                        m.d.sync += [b.eq(b + 1), g_row.eq(g_row + nb)]
                        m.next = "LOSS_START"
                    with m.Else():
                        m.next = "BWD_LAYER"

            # ---------------- backward, one layer at a time from the top
            any_below = Signal()
            m.d.comb += any_below.eq((update_mask & ((Const(1, L + 1) << l) - 1)[:L]) != 0)
            # the layer's setup: which passes run, and four products on the serial
            # multiplier (keep, batch*K, batch*N*K, batch*(N-keep)*K), one state each
            with seq_state("BWD_LAYER"):
                m.d.sync += [do_wgrad.eq(update_mask.bit_select(l, 1)),
                             do_igrad.eq((l != 0) & any_below)]
                m.d.comb += [mul.start.eq(1), mul.a.eq(keep_q8), mul.b.eq(N)]
                m.next = "BWD_KEEP"
            with seq_state("BWD_KEEP"):
                # ssProp keeps N * keep_q8 / KEEP_ONE channels, at least 1 (all at KEEP_ONE)
                kept = mul.product >> (spec.KEEP_ONE.bit_length() - 1)
                with m.If(mul.done):
                    if has_ssprop:
                        m.d.sync += keep.eq(Mux(keep_q8 >= spec.KEEP_ONE, N,
                                                Mux(kept == 0, 1, kept)))
                    else:
                        m.d.sync += keep.eq(N)
                    m.d.comb += [mul.start.eq(1), mul.a.eq(batch), mul.b.eq(K)]
                    m.next = "BWD_BK"
            with seq_state("BWD_BK"):
                with m.If(mul.done):
                    m.d.sync += batch_k.eq(mul.product)
                    m.d.comb += [mul.start.eq(1), mul.a.eq(mul.product), mul.b.eq(N)]
                    m.next = "BWD_BNK"
            with seq_state("BWD_BNK"):
                # batch*N*K MACs per pass: SLU skips the weight gradient of a frozen layer
                # and the input gradient below the lowest updated one
                bnk = mul.product
                with m.If(mul.done):
                    m.d.comb += count("skip_slu", Mux(do_wgrad, 0, bnk) +
                                      Mux((l != 0) & ~do_igrad, bnk, 0))
                    m.d.comb += [mul.start.eq(1), mul.a.eq(batch_k), mul.b.eq(N - keep)]
                    m.next = "BWD_LAYER2"
            with seq_state("BWD_LAYER2"):
                # batch*(N-keep)*K MACs that ssProp skips in each pass that runs
                with m.If(mul.done):
                    ssprop = mul.product
                    if has_ssprop:          # (without ssProp the product is 0)
                        m.d.comb += count("skip_ssprop",
                                          Mux(do_wgrad & do_igrad, ssprop << 1,
                                              Mux(do_wgrad | do_igrad, ssprop, 0)))
                    m.d.sync += [n.eq(0), b.eq(0), score.eq(0), s1_valid.eq(0), s2_valid.eq(0),
                                 g_row.eq(gbase)]
                    with m.If(~(do_wgrad | do_igrad)):
                        m.next = "BWD_NEXT"
                    with m.Elif(dense):
                        m.next = "IG_START"
                    if has_random:
                        with m.Elif(ss_random):
                            m.next = "SCORE_RANDOM"
                    if has_ssprop:
                        with m.Else():
                            m.next = "SCORE_TOPK"

            if has_ssprop:
                # ssProp scores: sum over the batch of |dY[b, n]|, or LFSR states
                with seq_state("SCORE_TOPK"):
                    m.d.comb += [g_rd.addr.eq(g_row + (n >> LOGP)), count("grad_reads", n < N)]
                    m.d.sync += [s1_valid.eq(n < N), s1_last.eq(b == batch - 1),
                                 p.eq(n[:LOGP] if LOGP else 0)]
                    with m.If(n < N):
                        with m.If(b == batch - 1):
                            m.d.sync += [b.eq(0), n.eq(n + 1), g_row.eq(gbase)]
                        with m.Else():
                            m.d.sync += [b.eq(b + 1), g_row.eq(g_row + nb)]
                    # stage 1: the lane into g_pick; stage 2: add its magnitude
                    m.d.sync += [g_pick.eq(Array(g_lane)[p]), s2_valid.eq(s1_valid),
                                 s2_last.eq(s1_last), s2_index.eq(n - 1)]
                    mag = Mux(g_pick < 0, -g_pick, g_pick)
                    with m.If(s2_valid):
                        with m.If(s2_last):
                            m.d.comb += [sel.score_we.eq(1), sel.score_index.eq(s2_index),
                                         sel.score_data.eq(score + mag)]
                            m.d.sync += score.eq(0)
                        with m.Else():
                            m.d.sync += score.eq(score + mag)
                    with m.If(s2_valid & s2_last & (s2_index == N - 1)):
                        m.next = "SELECT"
                with seq_state("SELECT"):
                    m.d.comb += [sel.start.eq(1), sel.channels.eq(N), sel.keep.eq(keep)]
                    m.next = "SELECT_WAIT"
                with seq_state("SELECT_WAIT"):
                    m.d.comb += [sel.channels.eq(N), sel.keep.eq(keep)]
                    with m.If(sel.done):
                        m.d.sync += [n.eq(0), s1_valid.eq(0), packed.eq(0)]
                        m.next = "PACK"
                with seq_state("PACK"):
                    # the kept mask as one P-bit word per block
                    m.d.comb += sel.kept_index.eq(n)
                    m.d.sync += [s1_valid.eq(n < N), n.eq(Mux(n < N, n + 1, n))]
                    idx = n - 1
                    with m.If(s1_valid):
                        word = packed | (sel.kept << idx[:LOGP])
                        m.d.sync += packed.eq(word)
                        with m.If((idx[:LOGP] == P - 1) | (idx == N - 1)):
                            m.d.comb += [k_wr.addr.eq(idx >> LOGP), k_wr.data.eq(word),
                                         k_wr.en.eq(1)]
                            m.d.sync += packed.eq(0)
                    with m.If((n == N) & s1_valid):
                        m.next = "IG_START"

            if has_random:
                with seq_state("SCORE_RANDOM"):
                    # step the LFSR in one cycle, write its new state in the next
                    m.d.comb += lfsr.step.eq(n < N)
                    m.d.sync += [s1_valid.eq(n < N), n.eq(Mux(n < N, n + 1, n))]
                    with m.If(s1_valid):
                        m.d.comb += [sel.score_we.eq(1), sel.score_index.eq(n - 1),
                                     sel.score_data.eq(lfsr.state)]
                    with m.If((n == N) & s1_valid):
                        m.next = "SELECT"
            # kept lanes of block j: from the selector, or every existing lane when dense
            kept_j = Signal(P)
            if has_ssprop:
                m.d.comb += [kept_j.eq(Mux(dense, kept_dense, k_rd.data)), k_rd.addr.eq(j)]
            else:
                m.d.comb += kept_j.eq(kept_dense)

            # ---------------- input gradient: for b, k: dX = sum over kept n of W * dY
            with seq_state("IG_START"):
                m.d.sync += [b.eq(0), k.eq(0), n.eq(0)]
                m.d.comb += requant.clear.eq(1)
                with m.If(do_igrad):
                    m.next = "IG_A"
                with m.Else():
                    m.next = "WG_START"
            # Pipelined over (b, k) with j innermost: one issue slot per block (one slot for
            # a (b, k) skipped as zero); A of the next (b, k) is read while the current one's
            # slots run. Stage 1 has the operands (registered in stage 1b), stage 2 the kept
            # lanes' products, which it adds (adder tree) into dX, written at the (b, k)'s last
            # slot; stage 3 keeps max |dX|.
            sidx = Signal(range(bld.scratch_entries + 1))       # b*K + k of the current slot
            relu_cur = Signal()
            s1_relu, s1_live = Signal(), Signal()
            s1b_valid, s1b_last, s1b_relu = Signal(), Signal(), Signal()
            s2_relu = Signal()
            # stage 2t: the lanes' sum, registered (the P-way adder tree is one stage, the
            # accumulation into dX the next)
            s2t_valid, s2t_last, s2t_relu = Signal(), Signal(), Signal()
            # dX entries are written in order, one per (b, k): the write index counts them
            # (rather than b*K + k travelling down the pipeline with each slot)
            dx_wr_idx = Signal.like(sidx)
            s2t_sum = Signal(signed(DACC))
            s3_valid = Signal()
            s3_dx = Signal(signed(spec.DX_BITS))
            ig_pipe = Signal()                  # IG_RUN or IG_DRAIN: stages 1 to 3 run
            with seq_state("IG_A"):
                m.d.comb += a_rd.addr.eq(abase)
                m.d.sync += [j.eq(0), dx_acc.eq(0), s1_valid.eq(0), s1b_valid.eq(0),
                             s2_valid.eq(0), s2t_valid.eq(0), s3_valid.eq(0), sidx.eq(0),
                             dx_wr_idx.eq(0),
                             w_row.eq(wbase),
                             g_row.eq(gbase)]
                m.next = "IG_RUN"
            with seq_state("IG_DRAIN"):
                m.d.comb += ig_pipe.eq(1)
                m.d.sync += s1_valid.eq(0)
                with m.If(~s1_valid & ~s1b_valid & ~s2_valid & ~s2t_valid & ~s3_valid):
                    m.next = "REQ_START"
            with seq_state("IG_RUN"):
                m.d.comb += ig_pipe.eq(1)
                # stage 0: slot j of (b, k); A[b, k] arrived in slot 0
                first = j == 0
                relu_now = Mux(first, a_rd.data != 0, relu_cur)
                live_now = relu_now | ~zs
                last_slot = ~live_now | (j == nb - 1)
                m.d.comb += a_rd.addr.eq(abase + sidx + 1)       # the next (b, k)
                with m.If(first):
                    m.d.sync += relu_cur.eq(a_rd.data != 0)
                    m.d.comb += count("act_reads")
                    with m.If(~live_now):
                        m.d.comb += count("skip_zero", keep)
                # the operands' addresses do not wait for the activation: a slot whose
                # activation is zero reads them too and its products are dropped (ig_keep),
                # which keeps the activation memory's output off the paths to every lane's
                # memories (docs/boards.md, the ULX3S critical path)
                m.d.comb += [w_rd.addr.eq(w_row + k), g_rd.addr.eq(g_row + j)]
                m.d.sync += [s1_valid.eq(1), s1_last.eq(last_slot), s1_live.eq(live_now),
                             s1_relu.eq(relu_now),
                             s1_lanes.eq(kept_dense)]
                with m.If(last_slot):
                    m.d.sync += [j.eq(0), sidx.eq(sidx + 1), w_row.eq(wbase)]
                    with m.If(k + 1 < K):
                        m.d.sync += k.eq(k + 1)
                    with m.Else():
                        m.d.sync += [k.eq(0), b.eq(b + 1), g_row.eq(g_row + nb)]
                    with m.If((b == batch - 1) & (k == K - 1)):
                        m.next = "IG_DRAIN"
                with m.Else():
                    m.d.sync += [j.eq(j + 1), w_row.eq(w_row + K)]

            # ---------------- dX -> dY of the layer below, with the batch's power-of-two scale
            ridx = Signal(range(bld.scratch_entries + 1))      # b*K + k, up to the batch's
            req_s3_valid, req_s4_valid = Signal(), Signal()
            with seq_state("REQ_START"):
                m.d.comb += requant.latch.eq(1)
                m.d.sync += [b.eq(0), k.eq(0),
                             ridx.eq(0), s1_valid.eq(0), s2_valid.eq(0), req_s3_valid.eq(0),
                             req_s4_valid.eq(0), g_row.eq(gbase_below)]
                m.next = "REQ_RUN"
            with seq_state("REQ_RUN"):
                # stage 0: read scratch entry ridx = b*K + k (all batch*K of them, in order);
                # stage 1: into the shifter's input; stages 2 and 3: shift and round it (the
                # requantizer registers it); stage 4: saturate and write dY_below at (b, k),
                # which step with the writes
                issue = ridx < batch_k
                m.d.comb += [s_rd.addr.eq(ridx), count("grad_reads", issue)]
                m.d.sync += [s1_valid.eq(issue), s2_valid.eq(s1_valid),
                             req_s3_valid.eq(s2_valid), req_s4_valid.eq(req_s3_valid)]
                with m.If(issue):
                    m.d.sync += ridx.eq(ridx + 1)
                m.d.comb += rq_take_dx.eq(1)
                with m.If(req_s4_valid):
                    m.d.comb += [g_wr.addr.eq(g_row + (k >> LOGP)),
                                 g_wr_value.eq(requant.dy), g_wr_on.eq(1),
                                 g_wr_lane.eq(k[:LOGP]), count("grad_writes")]
                    with m.If(k + 1 < K):
                        m.d.sync += k.eq(k + 1)
                    with m.Else():
                        m.d.sync += [k.eq(0), b.eq(b + 1), g_row.eq(g_row + nb_below)]
                with m.If(b == batch):
                    m.next = "WG_START"

            # ---------------- weight gradient and update, per block j and input k
            with seq_state("WG_START"):
                m.d.sync += [j.eq(0), k.eq(0), w_row.eq(wbase), psg_max.eq(0),
                             psg_pass_a.eq(psg_on & psg_rel)]
                with m.If(do_wgrad):
                    m.next = "WG_BLOCK"
                with m.Else():
                    m.next = "BWD_NEXT"
            with seq_state("WG_BLOCK"):
                # kept word of block j is being read (k_rd.addr = j); skip empty blocks
                m.next = "WG_BLOCK2"
            with seq_state("WG_BLOCK2"):
                m.d.sync += lanes_on.eq(kept_j)
                with m.If(kept_j == 0):
                    m.next = "WG_NEXT_BLOCK"
                with m.Else():
                    m.d.sync += k.eq(0)
                    m.next = "WG_K"
            with seq_state("WG_K"):
                m.d.sync += [b.eq(0), s1_valid.eq(0), s2_valid.eq(0), live_count.eq(0),
                             m2_valid.eq(0), m2_last.eq(0), m3_valid.eq(0), m3_last.eq(0),
                             a_row.eq(abase), g_row.eq(gbase)]
                m.d.comb += acc_clear.eq(1)
                if has_psg:
                    thr = Mux(psg_rel, psg_max >> psg_tau[:6], psg_tau)
                    m.d.sync += psg_thr.eq(Mux(thr >= 1 << (PRED - 1), 1 << (PRED - 1), thr))
                    with m.If(psg_on):
                        m.next = "WG_LOW"
                    with m.Else():
                        m.next = "WG_FULL"
                else:
                    m.next = "WG_FULL"
            # full-precision pass over the batch (SGD, or the PSG recompute of uncertain
            # lanes), and the PSG predictor's low-precision pass
            passes = (("WG_FULL", False), ("WG_LOW", True)) if has_psg else (("WG_FULL", False),)
            for state, low in passes:
                with seq_state(state):
                    recompute = psg_on & ~psg_pass_a if not low else None
                    gate = Signal(P, name=f"gate_{state}")
                    if low:
                        m.d.comb += gate.eq(lanes_on)
                    else:
                        m.d.comb += gate.eq(Mux(psg_on, uncertain, lanes_on))
                    # stage 0: A[b, k]
                    m.d.comb += a_rd.addr.eq(a_row + k)
                    with m.If(b < batch):
                        m.d.comb += count("act_msb_reads" if low else "act_reads")
                        m.d.sync += [b.eq(b + 1), a_row.eq(a_row + K)]
                    m.d.sync += [s1_valid.eq(b < batch), s1_last.eq(b == batch - 1)]
                    # stage 1: dY word (b, j) unless A is zero and skipping (g_row follows
                    # the sample in stage 1)
                    av = a_rd.data
                    live1 = (av != 0) | ~zs
                    m.d.comb += g_rd.addr.eq(g_row + j)
                    with m.If(s1_valid):
                        m.d.sync += g_row.eq(g_row + nb)
                        with m.If(live1):
                            m.d.comb += count("grad_msb_lane_reads" if low else
                                              "grad_lane_reads", popcount(gate))
                            if low:
                                # live samples: each confident lane skips their full MACs
                                m.d.sync += live_count.eq(live_count + 1)
                        if low:
                            with m.Elif(~(psg_rel & ~psg_pass_a)):
                                m.d.comb += count("skip_zero", popcount(gate))
                        else:
                            with m.Elif(~psg_on):
                                m.d.comb += count("skip_zero", popcount(gate))
                    m.d.sync += [s2_valid.eq(s1_valid), s2_live.eq(live1), s2_act.eq(av),
                                 s2_last.eq(s1_last)]
                    # stage 2: multiply
                    drop = spec.GRAD_BITS - spec.PSG_GRAD_MSBS
                    for i in range(P):
                        if low:
                            # the top bits of the magnitude with the sign: dY / 2**drop
                            # truncated toward zero, (g + (2**drop - 1 if g < 0)) >> drop,
                            # which is g's top bits plus the carry out of its low bits
                            gi = g_lane[i]
                            hi = gi[drop:].as_signed() + (gi[-1] & (gi[:drop] != 0))
                            m.d.comb += [mul_a[i].eq(hi),
                                         mul_b[i].eq(s2_act >> (spec.ACT_BITS -
                                                                spec.PSG_ACT_MSBS))]
                        else:
                            m.d.comb += [mul_a[i].eq(g_lane[i]), mul_b[i].eq(s2_act)]
                        m.d.sync += [m2_valid.eq(s2_valid & s2_live),
                                 m2_last.eq(s2_valid & s2_last), m2_gate.eq(gate)]
                    with m.If(s2_valid & s2_live):
                        m.d.comb += count("mac_weight_grad_low" if low else "mac_weight_grad",
                                          popcount(gate))
                    # stage 3: accumulate
                    m.d.comb += acc_add.eq(m3_valid)
                    with m.If(m3_last):
                        if low:
                            m.next = "PSG_DECIDE"
                        else:
                            m.next = "UPD_HANDOFF"
            if has_psg:
                with seq_state("PSG_DECIDE"):
                    # |q| > thr without the negation: q > thr if q >= 0, else ~q = -q - 1 >= thr;
                    # both are Cat(sign, q ^ sign) > Cat(0, thr), one comparator per lane
                    def exceeds(q):
                        sign = q[-1]
                        folded = (q.as_unsigned() ^ sign.replicate(len(q)))[:len(q) - 1]
                        return Cat(sign, folded) > Cat(Const(0, 1), psg_thr)
                    conf = Cat(*[lanes_on[i] & exceeds(pred[i]) for i in range(P)])
                    with m.If(psg_pass_a):
                        # relative mode, first pass: only the maximum over kept lanes, found
                        # one lane per cycle
                        m.d.sync += p.eq(0)
                        m.next = "PSG_MAX"
                    with m.Else():
                        # skip_psg, live_count per confident lane, is counted by the update
                        # unit, one lane per cycle
                        m.d.sync += [confident.eq(conf), uncertain.eq(lanes_on & ~conf)]
                        with m.If((lanes_on & ~conf) != 0):
                            m.d.comb += acc_zero.eq(lanes_on & ~conf)
                            m.d.sync += [b.eq(0), s1_valid.eq(0), s2_valid.eq(0),
                                         m2_valid.eq(0), m2_last.eq(0),
                                         m3_valid.eq(0), m3_last.eq(0),
                                         a_row.eq(abase), g_row.eq(gbase)]
                            m.next = "WG_FULL"
                        with m.Else():
                            m.next = "UPD_HANDOFF"
                with seq_state("PSG_MAX"):
                    q = Array(pred)[p]
                    mag_p = Mux(q < 0, -q, q).as_unsigned()
                    with m.If(lanes_on.bit_select(p, 1) & (mag_p > psg_max)):
                        m.d.sync += psg_max.eq(mag_p)
                    m.d.sync += p.eq(p + 1)
                    with m.If(p == P - 1):
                        m.next = "WG_NEXT_K"
            with seq_state("UPD_HANDOFF"):
                # hand (j, k)'s gradient to the update unit, which writes it back while the
                # next (j, k) accumulates; wait only if it is still busy with the last one
                with m.If(~u_busy):
                    u = correction + lr_shift
                    m.d.comb += [upd.start.eq(1), upd.lanes_on.eq(lanes_on),
                                 upd.addr.eq(w_row + k),
                                 upd.shift.eq(Mux(u < 0, 0, Mux(u > spec.UPDATE_SHIFT_MAX,
                                                                spec.UPDATE_SHIFT_MAX, u))),
                                 upd.skip.eq(Mux(psg_on, confident, 0)),
                                 upd.live.eq(live_count)]
                    # PSG needs only a sign: the prediction's where it was confident
                    m.d.comb += u_load.eq(1)
                    with m.If(k + 1 < K):
                        m.d.sync += k.eq(k + 1)
                        m.next = "WG_K"
                    with m.Else():
                        m.next = "WG_NEXT_BLOCK"
            with seq_state("WG_WAIT"):
                with m.If(~u_busy):
                    m.next = "BWD_NEXT"
            with seq_state("WG_NEXT_K"):
                with m.If(k + 1 < K):
                    m.d.sync += k.eq(k + 1)
                    m.next = "WG_K"
                with m.Else():
                    m.next = "WG_NEXT_BLOCK"
            with seq_state("WG_NEXT_BLOCK"):
                with m.If(j + 1 < nb):
                    m.d.sync += [j.eq(j + 1), w_row.eq(w_row + K)]
                    m.next = "WG_BLOCK"
                with m.Elif(psg_pass_a):
                    m.d.sync += [psg_pass_a.eq(0), j.eq(0), w_row.eq(wbase)]
                    m.next = "WG_BLOCK"
                with m.Else():
                    m.next = "WG_WAIT"

            with seq_state("BWD_NEXT"):
                with m.If(do_igrad):
                    m.d.sync += [correction.eq(correction + spec.WEIGHT_FRAC_BITS - dx_shift),
                                 cur_half.eq(~cur_half)]
                with m.If(l == 0):
                    m.d.comb += [count("batches"), count("samples", batch)]
                    m.d.sync += [busy.eq(0), limit_start.eq(1)]
                    m.next = "IDLE"
                with m.Else():
                    m.d.sync += l.eq(l - 1)
                    m.next = "DESC_BWD"
            with seq_state("DESC_BWD"):
                load_descriptor("BWD_LAYER")

        # stages 1 to 3 of the input-gradient pipeline (IG_RUN issues, IG_DRAIN empties it)
        with m.If(ig_pipe):
            # stage 1: the products of the kept lanes of the block read last cycle
            kept1 = Signal(P, name="ig_kept1")
            m.d.comb += kept1.eq(Mux(dense, s1_lanes, k_rd.data) if has_ssprop
                                 else s1_lanes)
            for i in range(P):
                m.d.comb += [mul_a[i].eq(w_lane[i]), mul_b[i].eq(g_lane[i])]
            m.d.comb += ig_keep.eq(Mux(s1_valid & s1_live, kept1, 0))
            # stage 1b: the operands are registered; stage 2 has their products in prod_r
            m.d.sync += [s1b_valid.eq(s1_valid), s1b_last.eq(s1_last),
                         s1b_relu.eq(s1_relu)]
            m.d.sync += [s2_valid.eq(s1b_valid), s2_last.eq(s1b_last),
                         s2_relu.eq(s1b_relu)]
            with m.If(s1_valid & s1_live):
                m.d.comb += [count("mac_input_grad", popcount(kept1)),
                             count("weight_reads", popcount(kept1)),
                             count("grad_lane_reads", popcount(kept1))]
            # stage 2: the sum of the lanes' products
            m.d.sync += [s2t_valid.eq(s2_valid), s2t_last.eq(s2_last), s2t_relu.eq(s2_relu),
                         s2t_sum.eq(tree_sum(prod_r))]
            # stage 2t: sum into dX; written at the last slot of its (b, k)
            total = Signal(signed(DACC), name="dx_total")
            m.d.comb += total.eq(dx_acc + s2t_sum)
            dx = Signal(signed(spec.DX_BITS), name="dx")
            m.d.comb += dx.eq(Mux(s2t_relu, clamp_signed(total, spec.DX_BITS), 0))
            m.d.sync += [s3_valid.eq(s2t_valid & s2t_last), s3_dx.eq(dx)]
            with m.If(s2t_valid):
                with m.If(s2t_last):
                    m.d.comb += [s_wr.addr.eq(dx_wr_idx), s_wr.data.eq(dx),
                                 s_wr.en.eq(1), count("grad_writes")]
                    m.d.sync += [dx_acc.eq(0), dx_wr_idx.eq(dx_wr_idx + 1)]
                with m.Else():
                    m.d.sync += dx_acc.eq(total)
            # stage 3: the largest |dX| of the batch sets its scale (REQ_START)
            m.d.comb += requant.track.eq(s3_valid)

        # ---------------------------------------------------------------- writeback unit
        # forward outputs of one block, a lane a cycle through the shared shifter: UQ2.6 bytes
        # into the activation memory, or Q7.8 logits into the gradient memory
        m.d.comb += [wb.rounded.eq(rq_out), requant.rounded.eq(rq_out)]
        # (the entry is not gated by the phase: only `track` is, so that no path runs from the
        # sequencer's state through |dX| and its comparison into the maximum's enable)
        m.d.comb += requant.dx.eq(s3_dx)
        with m.If(wb.take):
            m.d.comb += [u_shift_down.eq(1), rq_take_head.eq(1), rq_head_shift.eq(wb.take_shift)]
        with m.If(wb.grad_wr_en):
            m.d.comb += [g_wr.addr.eq(wb.grad_wr_word), g_wr_value.eq(wb.grad_wr_value),
                         g_wr_on.eq(1), g_wr_lane.eq(wb.grad_wr_lane), count("grad_writes")]
        with m.If(wb.act_wr_en):
            m.d.comb += [a_wr.addr.eq(wb.act_wr_addr), a_wr.data.eq(wb.act_wr_data),
                         a_wr.en.eq(1), count("act_writes")]

        # ---------------------------------------------------------------- update unit
        # W[j, k] <- W - round(G >> shift) (SGD) or W - sign * 2**step (PSG), a lane a cycle
        # through the shared shifter, the old weights from u_word; only changed lanes are
        # written (the weight memory is written a lane at a time; nothing reads it while the
        # update unit runs)
        m.d.comb += [upd.psg.eq(psg_on), upd.step_shift.eq(psg_step),
                     upd.old_weight.eq(u_word[:W]), upd.twice.eq(rq_twice),
                     upd.rounded.eq(rq_out), count("skip_psg", upd.skipped)]
        with m.If(upd.wr_en):
            m.d.comb += [w_wr.addr.eq(upd.word_addr), w_wr.data.eq(upd.wr_value.replicate(P)),
                         w_wr.en.eq(Const(1, P) << upd.wr_lane), count("weight_writes")]
        with m.If(upd.rd_en):
            m.d.comb += [w_rd.addr.eq(upd.word_addr),
                         count("weight_reads", popcount(upd.rd_lanes))]
        with m.If(upd.word_load):
            m.d.comb += u_word_load.eq(1)
        with m.If(upd.take):
            m.d.comb += [u_word_shift.eq(1), u_shift_down.eq(1), rq_take_head.eq(1),
                         rq_head_shift.eq(upd.take_shift)]

        # ---------------------------------------------------------------- shifter input
        m.d.comb += [shifter.en.eq(rq_take_dx | rq_take_head),
                     shifter.value.eq(Mux(rq_take_dx, s_rd.data, lanes.head)),
                     shifter.shift.eq(Mux(rq_take_dx, dx_shift, rq_head_shift))]

        # ---------------------------------------------------------------- lanes
        # The input-gradient pass zeroes the operand of each lane whose product does not count
        # (ig_keep), so that its adder tree sums all P products (MacLanes.b_zero: a
        # synchronous reset of the operand register, which Yosys packs into the SB_MAC16)
        for i in range(P):
            m.d.comb += [lanes.operand_a(i).eq(mul_a[i]), lanes.operand_b(i).eq(mul_b[i])]
        m.d.comb += [lanes.b_zero.eq(Mux(ig_pipe, ~ig_keep, 0)),
                     lanes.acc_clear.eq(acc_clear), lanes.acc_zero.eq(acc_zero),
                     lanes.acc_add.eq(Mux(acc_add, m3_gate, 0)),
                     lanes.snap.eq(u_load), lanes.snap_shift.eq(u_shift_down)]
        with m.If(u_word_load):
            m.d.sync += u_word.eq(w_rd.data)
        with m.Elif(u_word_shift):
            m.d.sync += u_word.eq(u_word >> W)

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
        m.d.comb += w_rd.en.eq(Mux(busy, fsm.ongoing("FWD_RUN") | fsm.ongoing("IG_RUN") |
                                   upd.rd_en, bus_w_rd))

        # cycle counters: every busy cycle, and each phase by the states it runs in
        phases = {
            "cycles_forward": ("DESC_FWD", "FWD_LAYER", "FWD_ROW", "FWD_RUN", "FWD_HANDOFF", "FWD_END",
                               "AFTER_FWD",
                               "INF_ROW", "INF_RUN", "INF_WRITE"),
            "cycles_loss": ("LOSS_START", "LOSS_GO", "LOSS_GO2", "LOSS_RUN"),
            "cycles_select": ("DESC_BWD", "BWD_LAYER", "BWD_KEEP", "BWD_BK", "BWD_BNK", "BWD_LAYER2",
                              "SCORE_TOPK", "SCORE_RANDOM",
                              "SELECT", "SELECT_WAIT", "PACK", "BWD_NEXT"),
            "cycles_input_grad": ("IG_START", "IG_A", "IG_RUN", "IG_DRAIN",
                                  "REQ_START", "REQ_RUN"),
            "cycles_weight_grad": ("WG_START", "WG_BLOCK", "WG_BLOCK2", "WG_K", "WG_FULL",
                                   "WG_LOW", "PSG_DECIDE", "PSG_MAX", "WG_NEXT_K",
                                   "WG_NEXT_BLOCK"),
            "cycles_update": ("UPD_HANDOFF", "WG_WAIT"),
        }
        m.d.comb += count("cycles", busy)
        for name, states in phases.items():
            states = [st for st in states if st in fsm.encoding]     # units left out
            m.d.comb += count(name, sum(fsm.ongoing(st) for st in states) != 0)

        # ---------------------------------------------------------------- stopping a command
        # (docs/protocol.md section 10) When a command stops (an abort before its first weight
        # write, or the watchdog: ember_hw.stopper decides, and keeps STOPPED and the
        # command's answer), the sequencer goes to IDLE (seq_state) and the units that may be
        # half way through something are reset (ResetInserter above). The memories keep their
        # contents; of what a command writes, only the weights outlive it (every phase sets up
        # its pointers, accumulators and units before it uses them), so the next command runs
        # as on an engine that never ran the stopped one (tests/test_liveness.py).
        m.submodules.stopper = stopper = CommandStop(bld)
        m.d.comb += [stopper.start.eq(fsm.ongoing("IDLE") & (start_train | start_infer)),
                     stopper.busy.eq(busy), stopper.abort.eq(regs.abort),
                     stopper.weight_write.eq(upd.wr_en), stopper.layer.eq(l),
                     stopper.watchdog.eq(settings.watchdog),
                     stop.eq(stopper.stop), regs.stopped.eq(stopper.stopped),
                     bus.cmd_status.eq(stopper.cmd_status)]
        with m.If(stop):
            m.d.sync += [busy.eq(0), limit_start.eq(1)]

        # ---------------------------------------------------------------- memory collisions
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
            return Cat(*(fsm.ongoing(st) for st in states if st in fsm.encoding)).any()
        g_used = Signal(P)          # the lanes whose gradient-memory reads are used
        with m.If(fsm.ongoing("LOSS_RUN")):
            m.d.comb += g_used.eq(Const(1, P) << loss.rd_addr[:LOGP])
        with m.Elif(reading("INF_RUN", "SCORE_TOPK", "IG_RUN", "WG_FULL", "WG_LOW")):
            m.d.comb += g_used.eq((1 << P) - 1)
        collisions = [(g_wr.en & g_used).any() & (g_rd.addr == g_wr.addr)]
        readers = [(a_rd, a_wr, ("FWD_RUN", "IG_A", "IG_RUN", "WG_FULL", "WG_LOW")),
                   (s_rd, s_wr, ("REQ_RUN",)), (l_rd, l_wr, ("LOSS_START",))]
        if has_ssprop:
            readers.append((k_rd, k_wr, ("IG_RUN", "WG_BLOCK")))
        collisions += [reading(*states) & wr.en.any() & (rd.addr == wr.addr)
                       for rd, wr, states in readers]
        with m.If(Cat(*collisions).any()):
            m.d.sync += self.read_collision.eq(1)
        return m
