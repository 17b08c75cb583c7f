"""Engine v2 behind the bus: the shell around the core (ember_hw.sample_engine.SampleEngine).

Golden twin: ``ember.virtual.VirtualEngine`` on a ``Build.dataflow`` "samples" build (the
model backend), through the same bus map (``spec.ADDRESS_MAP``, docs/protocol.md section 7).
The shell only wires units that are each tested alone:

- ``RegisterBank`` (ember_hw.regbank): the settings, layer descriptors, CONTROL with its
  command check, the identify registers and the counters window. The step's settings are
  its registers and go straight to the core;
- ``SampleWindow`` (ember_hw.memwindow): the weight, input, label, prediction and program
  regions in v2's layouts, on the core's idle ports;
- ``CounterFile`` (ember_hw.counters): the core's events (its ``inc`` port), the link's
  bytes, the input bytes the window writes, and the busy cycles by phase kind
  (``CYCLE_KINDS``);
- ``CommandStop`` (ember_hw.stopper): abort and watchdog reset the core's runner and
  pipelines (its memories keep their contents);
- a serial multiplier for the input batch's extent (the window's ``block_words``: the
  sample blocks times layer 0's inputs), recomputed after a write of either factor;
- with the command_check unit, ``ProgramCheck`` (ember_hw.program_check): the register
  bank's command check ends with its verdict on the programs the command runs (the one at
  word 0 for TRAIN and EPOCH, the one at INFER_PROGRAM for INFER and EVALUATE), so a
  program that could leave a memory is refused (REJECTED "program") before anything
  changes. Each is checked once after a write of the program region (or, for the second, of
  INFER_PROGRAM); the verdict is kept until the next;
- with the resident unit (docs/protocol.md section 11), ``EpochSequencer``
  (ember_hw.epoch) and its data, label and schedule memories, which the window writes: on
  EPOCH or EVALUATE it drives the core's ports batch after batch (the batch size, SLU mask
  and LFSR seed, the gather into the activation and label memories, one core run each),
  while the window and the registers answer ``busy``.

A command is CONTROL's train or infer strobe: the core runs the program in its program
memory, which the host wrote for that command (ember.device). A run the core refuses part
way (``SampleEngine.fault``: an address outside a memory, an unknown kind or a bound of 0)
ends the command with the answer ``fault`` (spec.LINK_STATUS). An EPOCH or EVALUATE is one
command over many core runs: the watchdog limits each run, an abort stops it before its
first weight write (ember_hw.stopper).

`SampleCore(build)`: the ports of ``EngineCore`` (bus, link_rx, link_tx, busy), so that
``EngineTop`` takes either.
"""

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.hdl import ResetInserter
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.utils import exact_log2

from ember import dataflow, spec

from .bus import engine_members
from .counters import CounterFile
from .epoch import EpochSequencer
from .memwindow import SampleWindow, data_words
from .program_check import ProgramCheck
from .regbank import RegisterBank
from .sample_engine import GATHER_LANES, SampleEngine, event_bounds
from .serial_mul import SerialMultiplier
from .stopper import CommandStop

#: The cycle counter each phase kind's busy cycles go to. "end" is the kind the core holds
#: while it loads a run's first phase (the last run ended on it), which is a forward phase.
CYCLE_KINDS = {"end": "cycles_forward", "forward": "cycles_forward",
               "logits": "cycles_forward", "argmax": "cycles_forward",
               "loss": "cycles_loss", "select": "cycles_select",
               "input_grad": "cycles_input_grad", "requant": "cycles_input_grad",
               "weight_grad": "cycles_weight_grad", "psg_max": "cycles_weight_grad"}
assert set(CYCLE_KINDS) == set(dataflow.KINDS)
assert set(CYCLE_KINDS.values()) <= set(spec.CYCLE_COUNTERS)


class SampleCore(wiring.Component):
    """Engine v2 behind the bus (module docstring).

    Ports:
      bus:     In(BusSignature()) -- register, counter and memory access (spec.ADDRESS_MAP).
      link_rx, link_tx: In(1) -- one pulse per link byte received / sent (counted).
      busy:    Out(1) -- a command is running.
    """

    def __init__(self, build=spec.DEFAULT_BUILD):
        if build.dataflow != "samples":
            raise ValueError(f"build '{build.name}': SampleCore is engine v2's shell, for "
                             f"dataflow 'samples' (this build's is '{build.dataflow}')")
        self.build = build
        super().__init__(engine_members())

    def elaborate(self, platform):
        m = Module()
        bld = self.build
        stop = Signal()
        m.submodules.regs = regs = RegisterBank(bld)
        m.submodules.core = core = ResetInserter(stop)(SampleEngine(bld, tally=False))
        m.submodules.window = win = SampleWindow(bld)
        # a command runs: the core, or the resident data unit between its batches
        self.running = Signal()
        self.seq = None
        if "resident" in bld.features:
            m.submodules.epoch = self.seq = ResetInserter(stop)(EpochSequencer(bld))
        m.d.comb += self.running.eq(core.busy | (self.seq.busy if self.seq else 0))
        self._settings(m, regs, core)
        self._bus(m, regs, win)
        self._window_ports(m, regs, win, core)
        self._counters(m, regs, win, core)
        if regs.checks_program:
            self._program_check(m, regs, win, core)
        if self.seq is not None:
            self._resident(m, regs, win, core, self.seq)
        m.submodules.stopper = stopper = CommandStop(bld)
        busy_was = Signal()
        status = Signal(spec.LINK_STATUS_BITS)
        m.d.sync += busy_was.eq(self.running)
        commands = [regs.start_train, regs.start_infer]
        if self.seq is not None:
            commands += [regs.start_epoch, regs.start_evaluate]
            m.d.comb += stopper.rearm.eq(self.seq.core_start)
        m.d.comb += [stopper.start.eq(Cat(*commands).any()), stopper.busy.eq(self.running),
                     stopper.counting.eq(core.busy),
                     stopper.abort.eq(regs.abort), stopper.weight_write.eq(core.weight_write),
                     stopper.layer.eq(core.layer), stopper.watchdog.eq(regs.settings.watchdog),
                     stop.eq(stopper.stop), regs.stopped.eq(stopper.stopped),
                     self.bus.cmd_done.eq(busy_was & ~self.running),
                     status.eq(Mux(core.fault & (stopper.cmd_status == spec.LINK_STATUS["ok"]),
                                   spec.LINK_STATUS["fault"], stopper.cmd_status)),
                     self.bus.cmd_status.eq(status), regs.cmd_status.eq(status),
                     self.busy.eq(self.running), regs.busy.eq(self.running)]
        return m

    def _settings(self, m, regs, core):
        """The step's registers to the core; CONTROL's strobes start it. A flag of a unit
        the build leaves out is 0 (as in EngineCore; the host refuses such settings), so
        synthesis drops what the core has for it."""
        st = regs.settings
        flags = {name: st.flags[i] for i, name in enumerate(spec.FLAG_BITS)}
        seq = self.seq
        seq_infer = (seq.core_start & seq.core_infer) if seq else Const(0)
        m.d.comb += [core.start.eq(regs.start_train | regs.start_infer
                                   | (seq.core_start if seq else 0)),
                     # an inference's program begins at INFER_PROGRAM (0 without the unit)
                     core.program_base.eq(Mux(regs.start_infer | seq_infer,
                                              st.infer_program, 0)),
                     core.batch.eq(st.batch), core.update_mask.eq(st.update_mask),
                     core.lr_shift.eq(st.lr_shift), core.psg_tau.eq(st.psg_tau),
                     core.psg_step_shift.eq(st.psg_step_shift), core.keep_q8.eq(st.keep_q8),
                     core.lfsr_seed.eq(st.lfsr_seed), regs.correct.eq(core.correct)]
        if seq is not None:
            # the resident data unit's batches: their size, SLU mask and LFSR seed
            with m.If(seq.busy):
                m.d.comb += [core.batch.eq(seq.core_batch),
                             core.update_mask.eq(seq.core_update_mask),
                             core.lfsr_seed.eq(seq.core_lfsr_seed)]
        unit = {"psg": "psg", "psg_relative": "psg", "ssprop_random": "ssprop_random"}
        for name, feature in unit.items():
            if feature in self.build.features:
                m.d.comb += getattr(core, name).eq(flags[name])
        # inference always skips zeros (GoldenModel.infer); a step as its settings say
        inferring = Signal()
        with m.If(regs.start_train | regs.start_infer):
            m.d.sync += inferring.eq(regs.start_infer)
        if seq is not None:
            with m.If(seq.core_start):
                m.d.sync += inferring.eq(seq.core_infer)
        m.d.comb += core.zero_skip.eq(flags["zero_skip"] | inferring)

    def _bus(self, m, regs, win):
        """The bus slave: region 0 is the register bank's, the others the window's. The
        answer is registered (decided in one cycle, on the bus in the next)."""
        bus = self.bus
        region = bus.addr[spec.REGION_BITS:]
        active = Signal()
        m.d.comb += active.eq((bus.w_stb | bus.r_stb) & ~bus.ack & ~bus.err)
        ack, err, defer = Signal(), Signal(), Signal()
        data = Signal.like(bus.r_data)
        m.d.sync += [bus.ack.eq(ack), bus.err.eq(err), bus.r_data.eq(data), bus.defer.eq(defer)]
        m.d.comb += [regs.owing.eq(bus.owing),
                     regs.sel.eq(active & (region == 0)),
                     regs.addr.eq(bus.addr[:spec.REGION_BITS]), regs.write.eq(bus.w_stb),
                     regs.w_data.eq(bus.w_data),
                     win.sel.eq(active & (region != 0)), win.addr.eq(bus.addr),
                     win.write.eq(bus.w_stb), win.w_data.eq(bus.w_data)]
        with m.If(active):
            with m.If(region == 0):
                m.d.comb += [ack.eq(regs.ack), err.eq(regs.err), data.eq(regs.data),
                             defer.eq(regs.defer)]
            with m.Else():
                m.d.comb += [ack.eq(win.ack), err.eq(win.err), data.eq(win.data)]

    def _window_ports(self, m, regs, win, core):
        """The window on the core's idle ports; the input batch's extent."""
        P = self.build.lanes
        logp = P.bit_length() - 1
        st = regs.settings
        m.d.comb += [win.busy.eq(self.running), win.classes.eq(regs.classes),
                     core.w_wr_addr.eq(win.w_wr_addr), core.w_wr_data.eq(win.w_wr_data),
                     core.w_wr_en.eq(win.w_wr_en), core.w_rd_addr.eq(win.w_rd_addr),
                     win.w_rd_data.eq(core.w_rd_data),
                     core.prog_wr_addr.eq(win.prog_wr_addr),
                     core.prog_wr_data.eq(win.prog_wr_data), core.prog_wr_en.eq(win.prog_wr_en),
                     core.prog_rd_addr.eq(win.prog_rd_addr), win.prog_rd_data.eq(core.prog_rd_data),
                     core.act_wr_addr.eq(win.act_wr_addr), core.act_wr_data.eq(win.act_wr_data),
                     core.act_wr_en.eq(win.act_wr_en),
                     core.label_wr_addr.eq(win.label_wr_addr),
                     core.label_wr_data.eq(win.label_wr_data),
                     core.label_wr_en.eq(win.label_wr_en),
                     core.pred_rd_addr.eq(win.label_rd_addr),
                     win.pred_rd_data.eq(core.pred_rd_data),
                     core.label_rd_addr.eq(win.label_rd_addr),
                     win.label_rd_data.eq(core.label_rd_data),
                     regs.label_word.eq(win.label_word), regs.label_written.eq(win.label_written)]
        # blocks * inputs of layer 0, after a write of batch or layer 0's inputs
        tail = st.batch[:logp]
        blocks = Signal(range(self.build.max_batch // P + 2))
        m.d.comb += blocks.eq((st.batch >> logp) + (tail != 0))
        m.submodules.extent = mul = SerialMultiplier(len(blocks), len(regs.inputs0))
        start = Signal()
        m.d.sync += start.eq(regs.limit_changed)
        m.d.comb += [mul.start.eq(start), mul.a.eq(blocks), mul.b.eq(regs.inputs0),
                     win.block_words.eq(mul.product),
                     win.full_words.eq(mul.product - Mux(tail != 0, regs.inputs0, 0)),
                     win.tail.eq(tail), win.limit_ready.eq(~start & mul.done)]

    def _program_check(self, m, regs, win, core):
        """The command check's last step: the programs a command runs checked before it
        starts (ProgramCheck, golden twin dataflow.verify_verdict): the one at word 0 for
        TRAIN and EPOCH, the one at INFER_PROGRAM for INFER and EVALUATE (regs'
        program_entries), each once after the host last wrote the program memory (or, for
        the second, INFER_PROGRAM): a program that passed stays verified until then."""
        m.submodules.program_check = pc = ProgramCheck(self.build)
        st = regs.settings
        verified = Signal(2)                # per entry, since the program memory's last write
        infer_checked = Signal.like(st.infer_program)   # INFER_PROGRAM when entry 1 passed
        valid = Cat(verified[0], verified[1] & (infer_checked == st.infer_program))
        todo = Signal(2)                    # the asked command's entries left to check
        entry = Signal()                    # the entry being checked
        first = Signal(2)
        m.d.comb += [first.eq(regs.program_entries & ~valid), pc.rd_data.eq(core.prog_rd_data)]

        def check(entries):
            which = ~entries[0]
            m.d.comb += [pc.start.eq(1), pc.base.eq(Mux(which, st.infer_program, 0))]
            m.d.sync += [entry.eq(which), todo.eq(entries)]

        with m.FSM(name="program_check"):
            with m.State("IDLE"):
                with m.If(regs.program_check):
                    with m.If(first == 0):
                        m.d.comb += [regs.program_done.eq(1), regs.program_ok.eq(1)]
                    with m.Else():
                        check(first)
                        m.next = "CHECK"
            with m.State("CHECK"):
                left = todo & ~(Const(1, 2) << entry)
                with m.If(pc.done):
                    with m.If(~pc.ok):
                        m.d.comb += regs.program_done.eq(1)
                        m.next = "IDLE"
                    with m.Else():
                        m.d.sync += [verified.bit_select(entry, 1).eq(1), todo.eq(left)]
                        with m.If(entry):
                            m.d.sync += infer_checked.eq(st.infer_program)
                        with m.If(left == 0):
                            m.d.comb += [regs.program_done.eq(1), regs.program_ok.eq(1)]
                            m.next = "IDLE"
                        with m.Else():
                            m.next = "NEXT"
            with m.State("NEXT"):
                check(todo)
                m.next = "CHECK"
        with m.If(win.prog_wr_en):
            m.d.sync += verified.eq(0)
        # the checker reads the program memory through the core's idle read port
        with m.If(pc.busy):
            m.d.comb += core.prog_rd_addr.eq(pc.rd_addr)

    def _resident(self, m, regs, win, core, seq):
        """The resident data unit: its memories (written by the window, read by the
        sequencer), and the sequencer on the core's idle ports between its batches."""
        bld, st = self.build, regs.settings

        def memory(name, shape, depth, writer):
            m.submodules[name] = mem = Memory(shape=shape, depth=depth, init=[])
            rd, wr = mem.read_port(transparent_for=()), mem.write_port()
            m.d.comb += [wr.addr.eq(getattr(win, f"{writer}_wr_addr")),
                         wr.data.eq(getattr(win, f"{writer}_wr_data")),
                         wr.en.eq(getattr(win, f"{writer}_wr_en"))]
            return rd

        data = memory("data_mem", spec.BUS_DATA_BITS, data_words(bld), "data")
        labels = memory("data_label_mem", spec.LABEL_BITS, bld.data_samples, "dlabel")
        schedule = memory("schedule_mem", spec.BUS_DATA_BITS, bld.data_samples, "sched")
        # the sequencer is frozen while the core stalls its gather (EpochSequencer.stall):
        # its memories' reads hold their data with it
        # (the data memory only for the words the gather uses: data_reads counts them)
        m.d.comb += [port.en.eq(~core.gather_stall) for port in (labels, schedule)]
        m.d.comb += [data.en.eq(seq.data_rd_en & ~core.gather_stall),
                     data.addr.eq(seq.data_rd_addr), seq.data_rd_data.eq(data.data),
                     labels.addr.eq(seq.dlabel_rd_addr), seq.dlabel_rd_data.eq(labels.data),
                     schedule.addr.eq(seq.sched_rd_addr), seq.sched_rd_data.eq(schedule.data),
                     seq.start_epoch.eq(regs.start_epoch),
                     seq.start_evaluate.eq(regs.start_evaluate),
                     seq.batch.eq(st.batch), seq.layers.eq(st.layers), seq.inputs.eq(regs.inputs0),
                     seq.train_samples.eq(st.train_samples),
                     seq.test_samples.eq(st.test_samples), seq.epoch_key.eq(st.epoch_key),
                     seq.schedule_half.eq(st.schedule_half),
                     seq.core_busy.eq(core.busy), seq.core_correct.eq(core.correct),
                     seq.pred_rd_data.eq(core.pred_rd_data),
                     regs.test_correct.eq(seq.test_correct)]
        # the schedule halves the command may read (spec.schedule_halves_in_use): the host
        # writes the other one while it runs
        half_bits = exact_log2(spec.schedule_half_words(bld))
        both = st.train_samples > (st.batch << half_bits)
        m.d.comb += win.sched_busy.eq(Mux(seq.busy, Mux(both, 0b11, 1 << st.schedule_half), 0))
        # the gather writes up to GATHER_LANES lanes of an activation word a cycle
        # (into the bank the run does not read, also while the core runs: the core's own
        # writes stall it), and the run reads its input and labels from core_bank
        m.d.comb += [core.gather_word.eq(seq.act_wr_addr), core.gather_data.eq(seq.act_wr_data),
                     core.gather_lane.eq(seq.act_wr_lane), core.gather_mask.eq(seq.act_wr_mask),
                     core.gather_en.eq(seq.act_wr_en), core.gather_bank.eq(seq.gather_bank),
                     core.gather_active.eq(seq.busy), seq.stall.eq(core.gather_stall),
                     core.input_bank.eq(seq.core_bank)]
        with m.If(seq.busy):
            m.d.comb += [core.label_wr_addr.eq(seq.label_wr_addr),
                         core.label_wr_data.eq(seq.label_wr_data),
                         core.label_wr_en.eq(seq.label_wr_en),
                         core.pred_rd_addr.eq(seq.pred_rd_addr)]
        # CORRECT after an EPOCH: the epoch's trained samples classified correctly (a
        # streaming TRAIN sets it back to the core's count)
        epoch_ran = Signal()
        with m.If(regs.start_epoch):
            m.d.sync += epoch_ran.eq(1)
        with m.Elif(regs.start_train):
            m.d.sync += epoch_ran.eq(0)
        with m.If(epoch_ran):
            m.d.comb += regs.correct.eq(seq.correct)

    def _counters(self, m, regs, win, core):
        """The event counters: the core's events, the link's bytes, the window's input bytes
        and the busy cycles by phase kind."""
        bounds = event_bounds(self.build)
        # the window's byte, or the resident data unit's gather of up to GATHER_LANES
        # bytes, while idle
        bounds["act_writes"] += GATHER_LANES if self.seq is not None else 1
        bounds.update({name: 1 for name in spec.COUNTERS if name not in bounds})
        m.submodules.counters = counters = CounterFile({n: bounds[n] for n in spec.COUNTERS})
        inc = counters.inc
        for name in event_bounds(self.build):
            m.d.comb += getattr(inc, name).eq(getattr(core.inc, name))
        # input bytes written by the window, or by the resident data unit's gather (never
        # both: the window is idle while a command runs), count as the core's own writes
        # (a gather write the core's own write stalls is presented again, and counted then)
        written = win.act_wr_en if self.seq is None else Mux(
            self.seq.busy, Mux(core.gather_stall, 0, self.seq.act_wr_count), win.act_wr_en)
        m.d.comb += [inc.act_writes.eq(core.inc.act_writes + written),
                     inc.link_rx_bytes.eq(self.link_rx), inc.link_tx_bytes.eq(self.link_tx),
                     inc.cycles.eq(self.running)]
        if self.seq is not None:
            # the resident data unit's data-memory words (a read the stall holds is not one)
            m.d.comb += inc.data_reads.eq(self.seq.data_rd_en & ~core.gather_stall)
        # (in CYCLE_KINDS' order, not a set's: the Verilog must not change between
        # processes, or every run rebuilds the simulated board)
        for cycles in dict.fromkeys(CYCLE_KINDS.values()):
            kinds = [dataflow.KINDS[k] for k, c in CYCLE_KINDS.items() if c == cycles]
            m.d.comb += getattr(inc, cycles).eq(core.busy & sum(
                (core.kind == code) for code in kinds).bool())
        m.d.comb += [counters.clear.eq(regs.clear_counters),
                     counters.read_req.eq(regs.counter_req),
                     counters.read_index.eq(regs.counter_index),
                     regs.counter_valid.eq(counters.read_valid),
                     regs.counter_data.eq(counters.read_data)]
