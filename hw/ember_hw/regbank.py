"""The register bank: the "regs" region of the engine's bus map, generated from spec's tables.

Golden twin: the register half of ``ember.virtual.VirtualEngine`` (its ``read``/``write`` of
the "regs" region), which the model backend answers the host with; both read the same tables:
``spec.REGISTERS`` (addresses and access), ``Build.settings()`` and
``Build.descriptor_fields()`` (each setting's width and legal range on the build).

What it holds, at the word offsets of ``spec.REGISTERS`` and ``spec.LAYER_BASE``:

- the read-only values that describe the build (id, version, lanes, memory sizes, limits,
  counter count, FEATURES, BAUD: spec.read_only_values), and STATUS (``busy``) and CORRECT
  (``correct``) from the sequencer;
- one register per read-write setting, ``Setting.bits`` wide. A write of a value outside the
  setting's lo..hi is answered ``bad_value`` and changes nothing (issue 15: never truncated).
  A setting of an optional unit the build leaves out has no register: it reads as its
  ``init`` and a write is answered and dropped (the host writes every setting with each
  batch, whatever the build). Settings are written only while no command runs (``busy``
  answer otherwise);
- the layer descriptors: field f of layer l in word ``l * LAYER_STRIDE + f`` of a small
  memory, range-checked like the settings, each field starting at its ``init`` (1 input, 1
  output). A read takes a cycle and waits while the sequencer loads a descriptor
  (``desc_loading``: it owns the read port then). Layer 0's input count is also kept in a
  register, ``inputs0``, and every layer's output count in one, for ``classes``;
- CONTROL: a train or infer command is first checked (``StepCheck``, or ``CountCheck`` on a
  build without the command_check unit; docs/protocol.md section 8): refused with
  ``bad_value`` (REJECTED names the check), or the write registers ``start_train``,
  ``start_infer`` and ``clear_counters`` for one cycle and is acknowledged with ``defer``:
  the link bridge answers it when the command has ended, so the host never polls and every
  backend sees the same link traffic, and the bus stays free meanwhile. A CONTROL word with
  the abort bit is always acknowledged at once and registers ``abort`` if a command runs.
  While a command runs (``busy``), or its answer is still owed (``owing``), no other command
  starts (``busy`` answer). A build without the abort unit (spec.FEATURES) holds a command's
  write until the command has finished instead, and acknowledges an abort while idle;
- labels: ``classes`` (the last layer's outputs) for the engine's check of arriving labels,
  and which label words (``label_written``, ``label_word``) have been written since it last
  changed, for the command check;
- the "counters" window (``spec.ADDRESS_MAP["counters"]``, inside the same bus region): two
  words per counter, read through ``CounterFile``'s read port.

Ports (all in the sync domain; the bank's answer is combinational: the engine registers it
before it reaches the bus, see EngineCore):

  sel:            In(1) -- an access to this region is active (held until answered).
  addr:           In(REGION_BITS) -- the word offset in the region.
  write, w_data:  In(1), In(32) -- the access is a write of w_data.
  ack, err, data: Out(1), Out(1), Out(32) -- the answer, in the cycle it is decided: ack
                  (data: the word read) or err (data: a LINK_STATUS code).
  settings:       Out(one member per read-write setting, Setting.bits wide).
  inputs0:        Out -- layer 0's input count.
  limit_changed:  Out(1) -- batch or layer 0's inputs is written in this cycle (the input
                  batch's size, the activation region's write limit, changes).
  busy:           In(1) -- a command runs; correct: In -- CORRECT's value.
  start_train, start_infer, clear_counters, abort: Out(1) -- registered, one cycle each.
  defer:          Out(1) -- with ack: the write started a command (ember_hw.bus).
  owing:          In(1) -- the bus master still owes the host a command's answer.
  cmd_status:     In -- how the last command ended (a LINK_STATUS code; 0, ``ok``, if not
                  driven): without the abort unit, the held command write is answered with
                  it (an error unless ``ok``).
  stopped:        In -- STOPPED's value (spec.STOP_FIELDS), from the sequencer.
  desc_loading, desc_addr: In -- the sequencer reads descriptor word desc_addr;
  desc_data:      Out -- the word, the cycle after.
  counter_req, counter_index: Out -- a counter read (hold until counter_valid);
  counter_valid, counter_data: In.
  classes:        Out -- the class count labels are checked against (0 with no layers).
  label_written, label_word: In -- the engine wrote label word label_word this cycle.
  program_check:  Out(1) -- (engine v2 with the command_check unit: ``checks_program``) the
                  command passed StepCheck: the shell's program checker is asked for its
                  verdict on the program memory (ember_hw.program_check), in this cycle.
  program_entries: Out(len(PROGRAM_ENTRIES)) -- (with program_check) the programs the
                  command runs, bit i for PROGRAM_ENTRIES[i]: "train", the one at word 0
                  (TRAIN, EPOCH), and "infer", the one at INFER_PROGRAM (INFER, EVALUATE).
  program_done, program_ok: In(1) -- its verdict (in the cycle of program_check or later):
                  a refused program refuses the command (REJECTED "program").

With the resident unit (``"resident" in build.features``; docs/protocol.md section 11; its
golden twin is VirtualEngine's ``_control``, ``_resident_command`` and ``_keep_data_if``, with
``spec.check_resident``):

- CONTROL with EPOCH and/or EVALUATE, and neither TRAIN nor INFER, is a command like train:
  the infer command's checks (StepCheck with train 0), then "data" (an EPOCH needs
  TRAIN_SAMPLES > 0, an EVALUATE TEST_SAMPLES > 0, and (TRAIN_SAMPLES + TEST_SAMPLES) x
  layer 0's inputs padded to a data word (spec.sample_data_bytes) must fit data_bytes,
  TRAIN_SAMPLES + TEST_SAMPLES data_samples), then the program check; the first failure is
  REJECTED. That product is measured by a serial multiplier, started the cycle after a
  write of TRAIN_SAMPLES or TEST_SAMPLES or a change of shape and done (bits of layer 0's
  inputs) + 2 cycles later; a command waits for it;
- a write that changes layer 0's inputs or the class count unloads the splits (TRAIN_SAMPLES
  and TEST_SAMPLES become 0, the cycle after the new value is in its register): the stored
  bytes and labels were checked for the old ones. A write of the same value changes nothing.

  start_epoch, start_evaluate: Out(1) -- registered, one cycle, like start_train.
  test_correct:   In(range(data_samples + 1)) -- TEST_CORRECT's value.
"""

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from ember import spec

from .arith import below
from .bus import answer_error, answer_ok
from .serial_mul import SerialMultiplier
from .stepcheck import CHECK_INDEX, CountCheck, StepCheck

#: Word offset bits of the register file inside the "regs" region (and of the counters window,
#: the next 2**REG_OFFSET_BITS words).
REG_OFFSET_BITS = (spec.ADDRESS_MAP["regs"][1] - 1).bit_length()
#: The programs a command can run (bit i of program_entries): "train" starts at word 0 (TRAIN
#: and EPOCH run it), "infer" at INFER_PROGRAM (INFER and EVALUATE).
PROGRAM_ENTRIES = ("train", "infer")
assert spec.ADDRESS_MAP["counters"] == (spec.ADDRESS_MAP["regs"][0] + (1 << REG_OFFSET_BITS),
                                        1 << REG_OFFSET_BITS)


class RegisterBank(wiring.Component):
    """The engine's registers, descriptors, CONTROL and counter window (module docstring).

    build: spec.Build -- sizes every register and the descriptor memory.

    Attribute ``settings_table``: build.settings(), ``fields``: build.descriptor_fields().
    """

    def __init__(self, build=spec.DEFAULT_BUILD):
        self.build = build
        self.settings_table = build.settings()
        self.fields = build.descriptor_fields()
        self.desc_depth = (build.max_layers + 1) * spec.LAYER_STRIDE
        self.desc_bits = max(f.bits for f in self.fields.values())
        self.label_words = (build.max_batch + 1) // 2
        #: engine v2's command check asks the shell's program checker too
        self.checks_program = build.dataflow == "samples" and "command_check" in build.features
        #: the resident data unit's commands (EPOCH, EVALUATE) and splits
        self.resident = "resident" in build.features
        settings = wiring.Signature({name: Out(s.bits, init=s.init)
                                     for name, s in self.settings_table.items()})
        super().__init__({
            "sel": In(1),
            "addr": In(spec.REGION_BITS),
            "write": In(1),
            "w_data": In(spec.BUS_DATA_BITS),
            "ack": Out(1),
            "err": Out(1),
            "data": Out(spec.BUS_DATA_BITS),
            "settings": Out(settings),
            "inputs0": Out(self.fields["inputs"].bits, init=self.fields["inputs"].init),
            "limit_changed": Out(1),
            "busy": In(1),
            # a batch's count, or on a resident build an epoch's (ember_hw.epoch)
            "correct": In(self.settings_table["batch"].bits if "resident" not in build.features
                          else range(max(build.max_batch, build.data_samples) + 1)),
            "start_train": Out(1),
            "start_infer": Out(1),
            "clear_counters": Out(1),
            "abort": Out(1),
            "defer": Out(1),
            "owing": In(1),
            "cmd_status": In(spec.LINK_STATUS_BITS),
            "stopped": In(max(lo + bits for lo, bits in spec.STOP_FIELDS.values())),
            "desc_loading": In(1),
            "desc_addr": In(range(self.desc_depth)),
            "desc_data": Out(self.desc_bits),
            "counter_req": Out(1),
            "counter_index": Out(range(len(spec.COUNTERS))),
            "counter_valid": In(1),
            "counter_data": In(spec.COUNTER_BITS),
            "classes": Out(self.fields["outputs"].bits),
            "label_written": In(1),
            "label_word": In(range(self.label_words)),
            **({"program_check": Out(1), "program_entries": Out(len(PROGRAM_ENTRIES)),
                "program_done": In(1), "program_ok": In(1)}
               if self.checks_program else {}),
            **({"start_epoch": Out(1), "start_evaluate": Out(1),
                "test_correct": In(range(build.data_samples + 1))}
               if self.resident else {}),
        })

    def has_register(self, name):
        """True if the build has a register for setting `name` (its unit is built)."""
        feature = self.settings_table[name].feature
        return feature is None or feature in self.build.features

    def _range_checks(self, m):
        """The range checks of written words: a function of a Setting that is high when
        w_data is in its lo..hi. "The bits from b up are zero" for each register width b, as
        one chain from the widest down (a few LUTs, not a 32-bit comparator per register),
        then a compare of the low b bits where lo..hi is not 0..2**b - 1."""
        widths = sorted({t.bits for t in (*self.settings_table.values(),
                                          *self.fields.values())}, reverse=True)
        zero_from = {}
        above = Const(1)
        top = spec.BUS_DATA_BITS
        for b in widths:
            zero_from[b] = Signal(name=f"zero_from_{b}")
            m.d.comb += zero_from[b].eq(above & (self.w_data[b:top] == 0))
            above, top = zero_from[b], b

        def in_range(t):
            ok = zero_from[t.bits]
            low = self.w_data[:t.bits]
            if t.hi != (1 << t.bits) - 1:
                ok = ok & (low <= t.hi)
            if t.lo == 1:
                ok = ok & (low != 0)
            elif t.lo != 0:
                ok = ok & (low >= t.lo)
            return ok
        return in_range

    def _resident_splits(self, m, regs, inputs0):
        """The resident unit's splits (module docstring): their unload on a change of shape,
        and whether they fit the data memory. Returns (samples_written, data_measured,
        data_fits): drive samples_written high in a cycle that writes TRAIN_SAMPLES or
        TEST_SAMPLES; data_fits is valid while data_measured is high."""
        bld = self.build
        n_train, n_test = regs["train_samples"], regs["test_samples"]
        # the shape the splits were loaded for is the one of the cycle before: a write that
        # moves layer 0's inputs or the class count (LAYERS, or the last layer's outputs)
        # shows as a difference for one cycle, and unloads them (a write in that cycle wins,
        # as it comes after the unload on the bus)
        inputs_seen = Signal.like(inputs0, name="inputs_seen")
        classes_seen = Signal.like(self.classes, name="classes_seen")
        m.d.sync += [inputs_seen.eq(inputs0), classes_seen.eq(self.classes)]
        shape_moved = Signal()
        m.d.comb += shape_moved.eq((inputs0 != inputs_seen) | (self.classes != classes_seen))
        with m.If(shape_moved):
            m.d.sync += [n_train.eq(0), n_test.eq(0)]
        # (TRAIN_SAMPLES + TEST_SAMPLES) x layer 0's inputs, by a serial multiplier started
        # the cycle after either count or the shape changes: no wide comparator on a product
        # each cycle, and a command waits the few cycles of a measure
        samples = Signal(range(2 * bld.data_samples + 1))
        m.d.comb += samples.eq(n_train + n_test)
        m.submodules.data_extent = extent = SerialMultiplier(len(samples), len(inputs0) + 1)
        samples_written = Signal()
        remeasure = Signal()
        m.d.sync += remeasure.eq(samples_written | shape_moved)
        data_measured = Signal()
        data_fits = Signal()
        # a sample takes its inputs padded to a whole data word (spec.sample_data_bytes)
        word_shift = exact_log2(spec.DATA_WORD_BYTES)
        padded = Signal(len(inputs0) + 1)
        m.d.comb += padded.eq(((inputs0 + spec.DATA_WORD_BYTES - 1) >> word_shift)
                              << word_shift)
        m.d.comb += [extent.start.eq(remeasure), extent.a.eq(samples), extent.b.eq(padded),
                     data_measured.eq(~shape_moved & ~remeasure & extent.done),
                     data_fits.eq((extent.product <= bld.data_bytes)
                                  & (samples <= bld.data_samples))]
        return samples_written, data_measured, data_fits

    def _descriptor_memory(self, m, reg_off, check):
        """The descriptor memory: the bus writes it, the bus, the command check and the
        sequencer read it. At reset each field holds its Setting.init (1 input and 1 output,
        the smallest legal layer), so no descriptor ever holds a width of 0. Returns its read
        and write ports."""
        field_init = [self.fields[f].init for f in spec.LAYER_FIELDS]
        field_init += [0] * (spec.LAYER_STRIDE - len(field_init))
        m.submodules.dmem = dmem = Memory(shape=self.desc_bits, depth=self.desc_depth,
                                          init=field_init * (self.build.max_layers + 1))
        d_rd, d_wr = dmem.read_port(), dmem.write_port()
        # (a field takes only values in its range, so the word fits the memory's width)
        m.d.comb += [d_wr.addr.eq(reg_off - spec.LAYER_BASE), d_wr.data.eq(self.w_data),
                     d_rd.addr.eq(Mux(self.desc_loading, self.desc_addr,
                                      Mux(check.busy, check.desc_addr,
                                          reg_off - spec.LAYER_BASE))),
                     self.desc_data.eq(d_rd.data)]
        return d_rd, d_wr

    def _labels(self, m):
        """The class count (the last layer's outputs) that labels are checked against as they
        arrive, from a copy of every layer's output count; and which label words have been
        written since it last changed (a command checks the batch's are all there). Returns
        (the output counts' registers, the strobe that says the class count may change, and
        whether the batch's label words are all written)."""
        outputs = [Signal(self.fields["outputs"].bits, name=f"outputs{l}",
                          init=self.fields["outputs"].init)
                   for l in range(self.build.max_layers)]
        layers = self.settings.layers
        m.d.comb += self.classes.eq(Mux(layers == 0, 0, Array(outputs)[layers - 1]))
        labels_written = Signal(self.label_words)
        classes_change = Signal()
        with m.If(classes_change):
            m.d.sync += labels_written.eq(0)
        with m.Elif(self.label_written):
            m.d.sync += labels_written.bit_select(self.label_word, 1).eq(1)
        label_words_needed = (self.settings.batch + 1) >> 1
        labels_ok = Signal()
        m.d.comb += labels_ok.eq(Cat(labels_written[w] | (w >= label_words_needed)
                                     for w in range(self.label_words)).all())
        return outputs, classes_change, labels_ok

    def _counters_window(self, m):
        """The counters window: two words a counter (its low 32 bits, then the high ones),
        read only, through CounterFile's read port."""
        idx = self.addr[1:REG_OFFSET_BITS]
        with m.If(self.write):
            m.d.comb += answer_error(self, "out_of_range")
        with m.Elif(~below(idx, len(spec.COUNTERS))):
            m.d.comb += answer_error(self, "out_of_range")
        with m.Else():
            m.d.comb += [self.counter_req.eq(1), self.counter_index.eq(idx)]
            with m.If(self.counter_valid):
                m.d.comb += answer_ok(self, Mux(self.addr[0], self.counter_data[32:],
                                                self.counter_data[:32]))

    def elaborate(self, platform):
        m = Module()
        reg_off = self.addr[:REG_OFFSET_BITS]
        window = self.addr[REG_OFFSET_BITS:]
        write = self.write

        def ack(data=None):
            return answer_ok(self, data)

        def err(name):
            return answer_error(self, name)

        # the settings' registers (a left-out unit's setting is its init, constantly)
        regs = {}
        for name, s in self.settings_table.items():
            port = getattr(self.settings, name)
            if self.has_register(name):
                regs[name] = Signal(s.bits, init=s.init, name=f"reg_{name}")
                m.d.comb += port.eq(regs[name])
            else:
                m.d.comb += port.eq(s.init)
        inputs0 = Signal(len(self.inputs0), init=self.fields["inputs"].init)
        m.d.comb += self.inputs0.eq(inputs0)

        # the command check (below, CONTROL) reads the descriptors before a command starts
        # (a build without the command_check unit checks only that a network and a batch are
        # configured, so that no command can hang)
        unit = StepCheck if "command_check" in self.build.features else CountCheck
        m.submodules.check = check = unit(self.build, self.desc_depth, self.desc_bits)

        d_rd, d_wr = self._descriptor_memory(m, reg_off, check)
        desc_phase = Signal()               # a descriptor read: address, then data
        outputs, classes_change, labels_ok = self._labels(m)
        layers = self.settings.layers

        in_range = self._range_checks(m)
        if self.resident:
            samples_written, data_measured, data_fits = self._resident_splits(m, regs, inputs0)

        # CONTROL: a train or infer command is checked first (StepCheck); then registered
        # strobes, and the write's answer deferred to the command's end. REJECTED: the last
        # verdict
        checking = Signal()
        rejected = Signal.like(check.failed)
        m.d.comb += [check.train.eq(self.w_data[0]), check.batch.eq(self.settings.batch),
                     check.layers.eq(layers), check.labels_ok.eq(labels_ok),
                     check.desc_data.eq(d_rd.data)]
        m.d.sync += [self.start_train.eq(0), self.start_infer.eq(0), self.clear_counters.eq(0),
                     self.abort.eq(0)]
        # the command a CONTROL word starts: TRAIN and/or INFER; else, with the resident unit,
        # EPOCH and/or EVALUATE (a build without it ignores these bits, as unknown bits)
        abort_bit = spec.CONTROL_ABORT.bit_length() - 1
        epoch_bit = spec.CONTROL_EPOCH.bit_length() - 1
        evaluate_bit = spec.CONTROL_EVALUATE.bit_length() - 1
        command = self.w_data[:2] != 0
        if self.resident:
            m.d.sync += [self.start_epoch.eq(0), self.start_evaluate.eq(0)]
            resident_command = Signal()
            m.d.comb += resident_command.eq((self.w_data[epoch_bit] | self.w_data[evaluate_bit])
                                            & ~command)
            command = command | resident_command
            n_train, n_test = regs["train_samples"], regs["test_samples"]
            data_refused = (self.w_data[epoch_bit] & (n_train == 0)) \
                | (self.w_data[evaluate_bit] & (n_test == 0)) | ~data_fits
        if self.checks_program:
            runs = {"train": self.w_data[0], "infer": self.w_data[1]}
            if self.resident:
                runs["train"] = runs["train"] | (self.w_data[epoch_bit] & resident_command)
                runs["infer"] = runs["infer"] | (self.w_data[evaluate_bit] & resident_command)
            m.d.comb += self.program_entries.eq(Cat(runs[name] for name in PROGRAM_ENTRIES))

        def setting(name):
            """A read-write setting: written only while no command runs, and only with a
            value in its range."""
            s = self.settings_table[name]
            with m.If(write):
                with m.If(self.busy):
                    m.d.comb += err("busy")
                if name in regs:
                    with m.Elif(~in_range(s)):
                        m.d.comb += err("bad_value")
                with m.Else():
                    if name in regs:
                        m.d.sync += regs[name].eq(self.w_data)
                    if name == "batch":
                        m.d.comb += self.limit_changed.eq(1)
                    if name == "layers":
                        m.d.comb += classes_change.eq(1)
                    if self.resident and name in ("train_samples", "test_samples"):
                        m.d.comb += samples_written.eq(1)
                    m.d.comb += ack()
            with m.Else():
                m.d.comb += ack(getattr(self.settings, name))

        # With the abort unit a command's write is acknowledged with `defer` when it starts;
        # without it (v1's way, for a build short of logic) the write is held until the
        # command has finished (cmd_pending) and the bridge takes no frame meanwhile.
        has_abort = "abort" in self.build.features
        cmd_pending = Signal()

        program_checking = Signal()         # the program checker has the command
        program_failed = Const(1 + list(spec.COMMAND_CHECKS).index("program"), len(rejected))

        def verdict(failed):
            """The check's verdict: refuse, or start the command."""
            m.d.sync += [checking.eq(0), program_checking.eq(0), rejected.eq(failed)]
            with m.If(failed != 0):
                m.d.comb += err("bad_value")
            with m.Else():
                m.d.sync += [self.start_train.eq(self.w_data[0]),
                             self.start_infer.eq(self.w_data[1]),
                             self.clear_counters.eq(self.w_data[2])]
                if self.resident:
                    m.d.sync += [
                        self.start_epoch.eq(self.w_data[epoch_bit] & resident_command),
                        self.start_evaluate.eq(self.w_data[evaluate_bit] & resident_command)]
                if has_abort:
                    m.d.comb += ack() + [self.defer.eq(1)]
                else:
                    m.d.sync += cmd_pending.eq(1)

        def program_verdict():
            m.d.comb += self.program_check.eq(1)
            with m.If(self.program_done):
                verdict(Mux(self.program_ok, 0, program_failed))
            with m.Else():
                m.d.sync += [checking.eq(0), program_checking.eq(1)]

        def step_checked():
            """StepCheck is done: its verdict (an EPOCH or EVALUATE that passes it: the data
            check's), or on engine v2 the program checker's next."""
            failed = check.failed
            if self.resident:
                failed = Mux(resident_command & (check.failed == 0) & data_refused,
                             CHECK_INDEX["data"], check.failed)
            if self.checks_program:
                with m.If(failed != 0):
                    verdict(failed)
                with m.Else():
                    program_verdict()
            else:
                verdict(failed)

        def control():
            with m.If(write):
                if has_abort:
                    with m.If(self.w_data[abort_bit]):
                        # always answered; it stops the running command (nothing while idle)
                        m.d.comb += ack()
                        m.d.sync += self.abort.eq(self.busy)
                    with m.Elif(self.busy | (command & self.owing)):
                        m.d.comb += err("busy")
                else:
                    with m.If(cmd_pending):
                        ended = ~self.busy & ~self.start_train & ~self.start_infer
                        if self.resident:
                            ended = ended & ~self.start_epoch & ~self.start_evaluate
                        with m.If(ended):
                            with m.If(self.cmd_status == spec.LINK_STATUS["ok"]):
                                m.d.comb += ack()
                            with m.Else():
                                m.d.comb += [self.err.eq(1), self.data.eq(self.cmd_status)]
                            m.d.sync += cmd_pending.eq(0)
                    with m.Elif(self.busy):
                        m.d.comb += err("busy")
                    with m.Elif(self.w_data[abort_bit]):
                        m.d.comb += ack()       # no command runs: nothing to stop
                if self.checks_program:
                    with m.Elif(program_checking):
                        with m.If(self.program_done):
                            verdict(Mux(self.program_ok, 0, program_failed))
                with m.Elif(checking):
                    with m.If(check.done):
                        step_checked()
                if self.resident:
                    with m.Elif(resident_command & ~data_measured):
                        pass                    # the splits' extent is being measured
                with m.Elif(command):
                    m.d.comb += check.start.eq(1)
                    with m.If(check.done):      # decided at once (no layers or no batch)
                        step_checked()
                    with m.Else():
                        m.d.sync += checking.eq(1)
                with m.Else():
                    m.d.sync += self.clear_counters.eq(self.w_data[2])
                    m.d.comb += ack()
            with m.Else():
                m.d.comb += ack(0)

        def descriptor(layer, fname):
            """A layer descriptor field: written only while no command runs; a read waits
            for the sequencer's descriptor loads and takes a cycle."""
            with m.If(write):
                with m.If(self.busy):
                    m.d.comb += err("busy")
                with m.Elif(~in_range(self.fields[fname])):
                    m.d.comb += err("bad_value")
                with m.Else():
                    m.d.comb += [d_wr.en.eq(1), ack()]
                    if (layer, fname) == (0, "inputs"):
                        m.d.sync += inputs0.eq(self.w_data)
                        m.d.comb += self.limit_changed.eq(1)
                    if fname == "outputs":
                        m.d.sync += outputs[layer].eq(self.w_data)
                        with m.If(layers == layer + 1):
                            m.d.comb += classes_change.eq(1)
            with m.Else():
                with m.If(~desc_phase):
                    with m.If(~self.desc_loading):
                        m.d.sync += desc_phase.eq(1)
                with m.Else():
                    m.d.comb += ack(d_rd.data)
                    m.d.sync += desc_phase.eq(0)

        ro_values = spec.read_only_values(self.build)
        with m.If(self.sel):
            with m.If(window == 0):
                with m.Switch(reg_off):
                    for name, (off, mode) in spec.REGISTERS.items():
                        with m.Case(off):
                            if mode == "ro":
                                # (TEST_CORRECT: 0 on a build without the resident unit)
                                value = {"status": self.busy, "correct": self.correct,
                                         "rejected": rejected, "stopped": self.stopped,
                                         "test_correct": self.test_correct if self.resident
                                         else 0,
                                         }.get(name, ro_values.get(name))
                                m.d.comb += ack(value)
                            elif mode == "wo":
                                control()
                            else:
                                setting(name)
                    for layer in range(self.build.max_layers):
                        for f, fname in enumerate(spec.LAYER_FIELDS):
                            with m.Case(spec.LAYER_BASE + layer * spec.LAYER_STRIDE + f):
                                descriptor(layer, fname)
                    with m.Default():
                        m.d.comb += err("out_of_range")
            with m.Elif(window == 1):
                self._counters_window(m)
            with m.Else():
                m.d.comb += err("out_of_range")
        return m
