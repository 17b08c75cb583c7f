"""The resident data unit's sequencer: the EPOCH and EVALUATE commands (docs/protocol.md section
11), run on the device by driving engine v2's core batch after batch, as the host would over the
link. Golden twin: ``ember.virtual.VirtualEngine._resident_command``, with
``ember.schedule.EpochSchedule`` (the schedule words) and ``ember.schedule.epoch_order`` (the
order, made here by ``ember_hw.order.SampleOrder``); tested by tests/test_epoch_sequencer.py.

EPOCH walks the training split's n = ``train_samples`` samples in ``epoch_order(epoch_key, n)``,
in batches of B = ``batch`` (the last short). Schedule word b drops batch b (bit
``SCHEDULE_DROP_BIT``: its indices are taken from the order and nothing else happens) or gives
its update mask (the bits from ``SCHEDULE_MASK_LSB``, only the low ``layers`` kept) and its LFSR
seed (the low ``SCHEDULE_SEED_BITS``, 0 run as 1). A kept batch is gathered into the core's
activation and label memories and trained by one core run; ``correct`` sums the runs'
``core_correct``. EVALUATE walks the test split (samples ``train_samples`` ..
``train_samples + test_samples - 1``) in batches of ``build.max_batch``, the last short: gather,
one inference run (mask 0, seed 1), then the predictions are compared with the data labels;
``test_correct`` counts the matches.

``EpochSequencer(build)``: ``build`` a ``spec.Build`` with the resident unit. Ports (sync domain;
S = build.data_samples):

- ``start_epoch``, ``start_evaluate`` In(1): one-cycle strobes, taken while idle (ignored while
  busy). Both in one cycle: the epoch, then the evaluation.
- ``busy`` Out(1): high from the cycle after an accepted start until the work is done; when it
  falls, ``correct`` and ``test_correct`` are final.
- ``batch`` (B >= 1), ``layers``, ``inputs`` (K >= 1, layer 0's inputs), ``train_samples``,
  ``test_samples`` In, ``epoch_key`` In(ORDER_KEY_BITS): the registers, held by the shell while
  busy (read, not latched; the order generator samples the key and n at the epoch's start).
- ``sched_rd_addr`` Out(range(S)), ``sched_rd_data`` In(32): the schedule memory, one word per
  mini-batch, data the cycle after the address.
- ``data_rd_addr`` Out (a word of ceil(data_bytes / 4)), ``data_rd_data`` In(32): the data
  memory; sample i's input k is data byte i * K + k, byte j in bits 8 * (j % 4) up of word
  j // 4. One cycle latency.
- ``dlabel_rd_addr`` Out(range(S)), ``dlabel_rd_data`` In(LABEL_BITS): sample i's label at
  address i. One cycle latency.
- ``core_start`` Out(1): one-cycle strobe to the core; ``core_infer``, ``core_batch``,
  ``core_update_mask``, ``core_lfsr_seed`` Out: the run's settings, registers that change only
  while the core is idle (from before ``core_start`` until ``core_busy`` has fallen).
- ``core_busy`` In(1): rises the cycle after ``core_start``, falls when the run ends;
  ``core_correct`` In: taken in the first cycle ``core_busy`` is low after a training run.
- ``act_wr_addr``, ``act_wr_data``, ``act_wr_en`` Out: one activation byte per cycle, only while
  the core is idle; the batch's i-th sample's input k at ((s * K + k) << log2(P)) | lane with
  s = i // P, lane = i % P (registers).
- ``label_wr_addr``, ``label_wr_data``, ``label_wr_en`` Out: the epoch batch's i-th sample's
  label at address i, written with that sample's first byte's cycle (registers).
- ``pred_rd_addr`` Out, ``pred_rd_data`` In: the core's predictions, one cycle latency.
- ``correct`` Out(range(S + 1)): the epoch's trained samples classified right (cleared when an
  epoch starts); ``test_correct`` Out(range(S + 1)): the evaluation's (cleared when the
  evaluation begins, after the epoch when both were started).

Gather: a sample's byte offset i * K comes from a serial shift-add multiplier
(``ember_hw.serial_mul``) of M = ``offset_steps`` = min(index bits, K bits) steps (11 on a
2048-sample build with max_width 1024). The multiplier starts on the next sample's index in the
cycle the current sample begins, so the product is ready while the current sample's bytes go
out. The activation addresses are running sums (no multiplication). One data byte is read
and one activation byte written per cycle, so a gathered sample takes max(K, M + 1) cycles
and a batch's writes span (size - 1) * max(K, M + 1) + K cycles when the indices come in
time. In an evaluation they always do. In an epoch the order generator holds one index ready
while a sample's bytes go out (its pipeline stops while that index waits); it has fewer than 4
candidates per index on average, and each rejected one costs a cycle.

Per batch (cycle f: the one in which ``core_busy`` is seen low after the previous run): the
schedule word is addressed in f + 1 and decoded in f + 2, the first index goes into the
multiplier in f + 3, its first byte is addressed in f + M + 5 and written in f + M + 7, and
``core_start`` comes the cycle after the batch's last write. So from f to the next
``core_start`` takes M + 7 + the batch's write span (M + 7 + size * K for K > M). An epoch's
first index comes ``order.ORDER_LATENCY`` cycles after the start. After an inference run the
comparison takes cycles f + 1 .. f + B (a prediction and a data label read per cycle, the match
counted in the next), and the next test batch's first index goes into the multiplier in
f + B + 2. ``busy`` falls in f + 2 after an epoch's last run, and in f + B + 2 after an
evaluation's. A dropped batch takes its indices one per cycle as the order offers them. A batch
register of 0 (refused by the command check) ends the epoch at once.

Size (Yosys 0.70 from YoWASP, ``rtlil.convert(EpochSequencer(build), name="epoch_sequencer")``,
``synth_ice40 -noabc -top epoch_sequencer; stat``, the order generator and the multiplier
included) for ``Build(lanes=8, data_bytes=131072, data_samples=2048, features=FEATURES,
dataflow="samples")``: 952 SB_LUT4, 418 flip-flops (331 SB_DFFESR, 87 SB_DFFSR), 220 SB_CARRY.
These come from Yosys's built-in LUT mapping (``-noabc``), which gives ``SampleOrder`` 253
SB_LUT4 where abc9 gives 215; abc9 could not be run where these were measured.
"""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2, exact_log2

from ember import spec

from .order import SampleOrder
from .serial_mul import SerialMultiplier

#: Data bytes (inputs) in one word of the data memory.
DATA_WORD_BYTES = spec.BUS_DATA_BITS // spec.ACT_BITS


class EpochSequencer(wiring.Component):
    """The EPOCH and EVALUATE commands of the resident data unit (module docstring)."""

    def __init__(self, build):
        if "resident" not in build.features:
            raise ValueError(f"build '{build.name}' has no resident data unit (features "
                             f"{', '.join(build.features)})")
        if spec.SCHEDULE_MASK_LSB + build.max_layers > spec.SCHEDULE_DROP_BIT:
            raise ValueError(f"build '{build.name}': {build.max_layers} layers' mask bits from "
                             f"bit {spec.SCHEDULE_MASK_LSB} reach the drop bit "
                             f"{spec.SCHEDULE_DROP_BIT}")
        self.build = build
        P = build.lanes
        self.lane_bits = exact_log2(P)
        self.data_words = -(-build.data_bytes // DATA_WORD_BYTES)
        # as SampleEngine's act_wr_addr: a word of act_bytes // P, then the lane
        self.act_word_bits = ceil_log2(build.act_bytes // P)
        batch_slot = ceil_log2(build.max_batch)
        super().__init__({
            "start_epoch": In(1),
            "start_evaluate": In(1),
            "busy": Out(1),
            "batch": In(range(build.max_batch + 1)),
            "layers": In(range(build.max_layers + 1)),
            "inputs": In(range(build.max_width + 1)),
            "train_samples": In(range(build.data_samples + 1)),
            "test_samples": In(range(build.data_samples + 1)),
            "epoch_key": In(spec.ORDER_KEY_BITS),
            "sched_rd_addr": Out(range(build.data_samples)),
            "sched_rd_data": In(spec.BUS_DATA_BITS),
            "data_rd_addr": Out(range(self.data_words)),
            "data_rd_data": In(spec.BUS_DATA_BITS),
            "dlabel_rd_addr": Out(range(build.data_samples)),
            "dlabel_rd_data": In(spec.LABEL_BITS),
            "core_start": Out(1),
            "core_infer": Out(1),
            "core_batch": Out(range(build.max_batch + 1)),
            "core_update_mask": Out(build.max_layers),
            "core_lfsr_seed": Out(spec.SCHEDULE_SEED_BITS),
            "core_busy": In(1),
            "core_correct": In(range(build.max_batch + 1)),
            "act_wr_addr": Out(self.act_word_bits + self.lane_bits),
            "act_wr_data": Out(spec.ACT_BITS),
            "act_wr_en": Out(1),
            "label_wr_addr": Out(batch_slot),
            "label_wr_data": Out(spec.LABEL_BITS),
            "label_wr_en": Out(1),
            "pred_rd_addr": Out(batch_slot),
            "pred_rd_data": In(spec.LABEL_BITS),
            "correct": Out(range(build.data_samples + 1)),
            "test_correct": Out(range(build.data_samples + 1)),
        })
        self.order = SampleOrder(max_samples=build.data_samples)
        #: The multiplier's steps for a sample's byte offset i * K: its narrower operand's bits.
        self.offset_steps = min(len(self.order.indices.payload), len(self.inputs))

    def elaborate(self, platform):
        m = Module()
        bld = self.build
        m.submodules.order = order = self.order
        index_shape = order.indices.payload.shape()

        # The command's walk: samples not yet put in a batch, the epoch's batch number, the
        # next test sample, and the batch in hand (its size, first sample and indices still
        # to take from the order or the test counter).
        self.samples_left = Signal(range(bld.data_samples + 1))
        self.batch_index = Signal(range(bld.data_samples))
        self.test_next = Signal(range(bld.data_samples + 1))
        self.batch_first = Signal(range(bld.data_samples + 1))
        self.to_fetch = Signal(range(bld.max_batch + 1))
        self.evaluate_after = Signal()
        m.d.comb += self.sched_rd_addr.eq(self.batch_index)

        # The source of the batch's sample indices: the order in an epoch, the test split's
        # samples one after another in an evaluation.
        self.source_valid = Mux(self.core_infer, self.to_fetch != 0, order.indices.valid)
        self.source_index = Signal(index_shape)
        m.d.comb += self.source_index.eq(Mux(self.core_infer, self.test_next,
                                             order.indices.payload))
        self.fetch = Signal()
        self.drop_take = Signal()
        m.d.comb += order.indices.ready.eq(self.drop_take | (self.fetch & ~self.core_infer))
        with m.If(self.fetch):
            m.d.sync += self.to_fetch.eq(self.to_fetch - 1)
            with m.If(self.core_infer):
                m.d.sync += self.test_next.eq(self.test_next + 1)

        gather_done = self._gather(m, index_shape)
        compare_done = self._compare(m)
        self._sequence(m, order, gather_done, compare_done)
        return m

    def _gather(self, m, index_shape):
        """The gather datapath: the batch's samples' bytes into the activation memory and, in
        an epoch, their labels into the label memory. Returns the signal that is high once
        every sample of the batch is written (the core may start)."""
        bld = self.build
        K = self.inputs
        index_bits, inputs_bits = index_shape.width, len(K)
        # the narrower operand is shifted out a bit per step (offset_steps)
        if index_bits <= inputs_bits:
            m.submodules.offset_mul = mul = SerialMultiplier(inputs_bits, index_bits)
            m.d.comb += [mul.a.eq(K), mul.b.eq(self.source_index)]
        else:
            m.submodules.offset_mul = mul = SerialMultiplier(index_bits, inputs_bits)
            m.d.comb += [mul.a.eq(self.source_index), mul.b.eq(K)]

        self.gathering_batch = Signal()       # set by the sequencer while a batch is gathered
        byte_bits = ceil_log2(self.data_words) + exact_log2(DATA_WORD_BYTES)
        # the next sample: its index taken and its byte offset in the multiplier
        next_pending = Signal()
        next_index = Signal(index_shape)
        # the sample whose bytes are going out
        sending = Signal()
        sample_index = Signal(index_shape)
        byte_addr = Signal(byte_bits)
        input_index = Signal(range(bld.max_width))
        slot = Signal(range(bld.max_batch + 1))       # the sample's place in the batch
        lane = Signal(self.lane_bits)                 # slot % P
        block_word = Signal(self.act_word_bits)       # s * K of the sample's block s
        act_word = Signal(self.act_word_bits)         # s * K + k
        # the read stage: what the data and label read of the previous cycle are for
        read_byte = Signal()
        read_label = Signal()
        read_byte_lane = Signal(exact_log2(DATA_WORD_BYTES))
        read_act_addr = Signal.like(self.act_wr_addr)
        read_slot = Signal.like(self.label_wr_addr)

        last_byte = sending & (input_index == K - 1)
        begin = (~sending | last_byte) & next_pending & mul.done
        m.d.comb += [
            self.fetch.eq(self.gathering_batch & self.source_valid & (self.to_fetch != 0)
                          & (~next_pending | begin)),
            mul.start.eq(self.fetch),
            self.data_rd_addr.eq(byte_addr[exact_log2(DATA_WORD_BYTES):]),
        ]
        with m.If(self.fetch):
            m.d.sync += [next_pending.eq(1), next_index.eq(self.source_index)]
        with m.Elif(begin):
            m.d.sync += next_pending.eq(0)

        m.d.sync += [read_byte.eq(sending), read_label.eq(sending & (input_index == 0)
                                                          & ~self.core_infer)]
        with m.If(sending):
            m.d.sync += [
                read_byte_lane.eq(byte_addr),
                read_act_addr.eq(Cat(lane, act_word)),
                read_slot.eq(slot),
                byte_addr.eq(byte_addr + 1),
                input_index.eq(input_index + 1),
                act_word.eq(act_word + 1),
            ]
            with m.If(last_byte):
                m.d.sync += [input_index.eq(0), slot.eq(slot + 1), lane.eq(lane + 1),
                             sending.eq(0), act_word.eq(block_word)]
                with m.If(lane == bld.lanes - 1):
                    m.d.sync += [block_word.eq(block_word + K), act_word.eq(block_word + K)]
        with m.If(begin):
            m.d.sync += [sending.eq(1), sample_index.eq(next_index), byte_addr.eq(mul.product)]
        with m.If(~self.gathering_batch):
            # between batches: the next batch's first sample goes to lane 0 of block 0
            m.d.sync += [slot.eq(0), lane.eq(0), block_word.eq(0), act_word.eq(0),
                         input_index.eq(0)]

        # the write stage: registered writes, the cycle after the reads
        m.d.sync += [
            self.act_wr_en.eq(read_byte),
            self.act_wr_addr.eq(read_act_addr),
            self.act_wr_data.eq(self.data_rd_data.word_select(read_byte_lane, spec.ACT_BITS)),
            self.label_wr_en.eq(read_label),
            self.label_wr_addr.eq(read_slot),
            self.label_wr_data.eq(self.dlabel_rd_data),
        ]
        self.sample_label_addr = sample_index
        # the last write is on the ports in this cycle: the core may start in the next
        return ~(next_pending | sending | read_byte | (self.to_fetch != 0))

    def _compare(self, m):
        """After an inference run: prediction j against the data label of the batch's sample
        j, one a cycle (both read one cycle before the comparison). Returns the signal that is
        high in the cycle the last pair is read."""
        self.comparing = Signal()             # set by the sequencer while the pairs are read
        compared = Signal(range(self.build.max_batch + 1))
        read_pair = Signal()
        m.d.comb += self.pred_rd_addr.eq(compared)
        m.d.sync += read_pair.eq(self.comparing)
        with m.If(self.comparing):
            m.d.sync += compared.eq(compared + 1)
        with m.Else():
            m.d.sync += compared.eq(0)
        with m.If(read_pair & (self.pred_rd_data == self.dlabel_rd_data)):
            m.d.sync += self.test_correct.eq(self.test_correct + 1)
        # the data label of the prediction read in the same cycle
        self.compare_label_addr = self.batch_first + compared
        return compared == self.core_batch - 1

    def _schedule_word(self):
        """Batch settings from the schedule word on sched_rd_data: (dropped, update mask with
        only the network's layers, LFSR seed with 0 run as 1)."""
        word = self.sched_rd_data
        max_layers = self.build.max_layers
        layer_exists = Cat(self.layers > l for l in range(max_layers))
        mask = word[spec.SCHEDULE_MASK_LSB:spec.SCHEDULE_MASK_LSB + max_layers] & layer_exists
        seed = word[:spec.SCHEDULE_SEED_BITS]
        # an LFSR cannot start at 0 (the device does not trust the schedule)
        return word[spec.SCHEDULE_DROP_BIT], mask, Mux(seed == 0, 1, seed)

    def _take_batch(self, m, batch):
        """Statements that begin the next batch of at most `batch` samples."""
        size = Mux(self.samples_left < batch, self.samples_left, batch)
        m.d.sync += [self.core_batch.eq(size), self.to_fetch.eq(size),
                     self.samples_left.eq(self.samples_left - size)]

    def _begin_evaluation(self, m):
        m.d.sync += [self.core_infer.eq(1), self.test_correct.eq(0),
                     self.samples_left.eq(self.test_samples),
                     self.test_next.eq(self.train_samples), self.evaluate_after.eq(0)]

    def _sequence(self, m, order, gather_done, compare_done):
        """The command's states: batch after batch, schedule word, gather, core run, and
        (evaluation) the comparison."""
        m.d.comb += self.dlabel_rd_addr.eq(Mux(self.comparing, self.compare_label_addr,
                                               self.sample_label_addr))
        with m.FSM(name="epoch") as fsm:
            with m.State("IDLE"):
                with m.If(self.start_epoch):
                    m.d.comb += [order.start.eq(1), order.key.eq(self.epoch_key),
                                 order.samples.eq(self.train_samples)]
                    m.d.sync += [self.core_infer.eq(0), self.correct.eq(0),
                                 self.samples_left.eq(self.train_samples),
                                 self.batch_index.eq(0),
                                 self.evaluate_after.eq(self.start_evaluate)]
                    m.next = "NEXT_BATCH"
                with m.Elif(self.start_evaluate):
                    self._begin_evaluation(m)
                    m.next = "NEXT_TEST_BATCH"

            with m.State("NEXT_BATCH"):
                # the schedule word of batch_index is read in this cycle
                with m.If((self.samples_left == 0) | (self.batch == 0)):
                    with m.If(self.evaluate_after):
                        self._begin_evaluation(m)
                        m.next = "NEXT_TEST_BATCH"
                    with m.Else():
                        m.next = "IDLE"
                with m.Else():
                    m.next = "SCHEDULE"

            with m.State("SCHEDULE"):
                dropped, mask, seed = self._schedule_word()
                self._take_batch(m, self.batch)
                m.d.sync += [self.batch_index.eq(self.batch_index + 1),
                             self.core_update_mask.eq(mask), self.core_lfsr_seed.eq(seed)]
                with m.If(dropped):
                    m.next = "DROP"
                with m.Else():
                    m.next = "GATHER"

            with m.State("DROP"):
                # a dropped batch's indices are taken from the order and not used
                m.d.comb += self.drop_take.eq(1)
                with m.If(order.indices.valid):
                    m.d.sync += self.to_fetch.eq(self.to_fetch - 1)
                    with m.If(self.to_fetch == 1):
                        m.next = "NEXT_BATCH"

            with m.State("NEXT_TEST_BATCH"):
                with m.If(self.samples_left == 0):
                    m.next = "IDLE"
                with m.Else():
                    self._take_batch(m, self.build.max_batch)
                    m.d.sync += [self.batch_first.eq(self.test_next),
                                 self.core_update_mask.eq(0), self.core_lfsr_seed.eq(1)]
                    m.next = "GATHER"

            with m.State("GATHER"):
                m.d.comb += self.gathering_batch.eq(1)
                with m.If(gather_done):
                    m.next = "CORE_START"

            with m.State("CORE_START"):
                m.d.comb += self.core_start.eq(1)
                m.next = "CORE_RUN"

            with m.State("CORE_RUN"):
                with m.If(~self.core_busy):
                    with m.If(self.core_infer):
                        m.next = "COMPARE"
                    with m.Else():
                        m.d.sync += self.correct.eq(self.correct + self.core_correct)
                        m.next = "NEXT_BATCH"

            with m.State("COMPARE"):
                m.d.comb += self.comparing.eq(1)
                with m.If(compare_done):
                    m.next = "NEXT_TEST_BATCH"

        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE"))
