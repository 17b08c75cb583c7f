"""The resident data unit's sequencer: the EPOCH and EVALUATE commands (docs/protocol.md section
11), run on the device by driving engine v2's core batch after batch, as the host would over the
link. Golden twin: ``ember.virtual.VirtualEngine._resident_command``, with
``ember.schedule.EpochSchedule`` (the schedule words) and ``ember.schedule.epoch_order`` (the
order, made here by ``ember_hw.order.SampleOrder``); tested by tests/test_epoch_sequencer.py.

EPOCH walks the training split's n = ``train_samples`` samples in ``epoch_order(epoch_key, n)``,
in batches of B = ``batch`` (the last short). Batch b's schedule word (word b of the half
``schedule_half`` names, wrapping at the region's end: ``spec.schedule_half_words``) drops it (bit
``SCHEDULE_DROP_BIT``: its indices are taken from the order and nothing else happens) or gives
its update mask (the bits from ``SCHEDULE_MASK_LSB``, only the low ``layers`` kept) and its LFSR
seed (the low ``SCHEDULE_SEED_BITS``, 0 run as 1). A kept batch is gathered into the core's
activation and label memories and trained by one core run; ``correct`` sums the runs'
``core_correct``. The core's network input and labels have two banks: a batch is gathered
into the bank the running core does not read, while it runs, and its run starts as soon as
the run before it is retired (its correct count taken, or its predictions compared), so that
on a network of any size the gather costs only the first batch's time. EVALUATE walks the test split (samples ``train_samples`` ..
``train_samples + test_samples - 1``) in batches of ``build.max_batch``, the last short: gather,
one inference run (mask 0, seed 1), then the predictions are compared with the data labels;
``test_correct`` counts the matches.

``EpochSequencer(build)``: ``build`` a ``spec.Build`` with the resident unit. Ports (sync domain;
S = build.data_samples, P = build.lanes, G = ``group_lanes`` = min(4, P), the lanes one
activation write fills):

- ``start_epoch``, ``start_evaluate`` In(1): one-cycle strobes, taken while idle (ignored while
  busy). Both in one cycle: the epoch, then the evaluation.
- ``busy`` Out(1): high from the cycle after an accepted start until the work is done; when it
  falls, ``correct`` and ``test_correct`` are final.
- ``batch`` (B >= 1), ``layers``, ``inputs`` (K >= 1, layer 0's inputs), ``train_samples``,
  ``test_samples`` In, ``epoch_key`` In(ORDER_KEY_BITS): the registers, held by the shell while
  busy (read, not latched; the order generator samples the key and n at the epoch's start).
- ``schedule_half`` In(1): the register; batch b's schedule word is (schedule_half * H + b)
  mod S, H = ``spec.schedule_half_words(build)``.
- ``sched_rd_addr`` Out(range(S)), ``sched_rd_data`` In(32): the schedule memory, one word per
  mini-batch, data the cycle after the address.
- ``data_rd_addr`` Out (a word of ceil(data_bytes / 4)), ``data_rd_en`` Out(1),
  ``data_rd_data`` In(32): the data memory, one cycle latency; ``data_rd_en`` is high in the
  cycles whose word the gather uses (a ``data_reads`` event each, the shell's read
  enable). Each sample starts on a word: sample i is the W = ceil(K / 4) words i * W ..
  i * W + W - 1, its input k byte k % 4 (bits 8 * (k % 4) up) of word i * W + k // 4. The
  bytes past K in its last word are padding, never written to the core.
- ``dlabel_rd_addr`` Out(range(S)), ``dlabel_rd_data`` In(LABEL_BITS): sample i's label at
  address i. One cycle latency.
- ``core_start`` Out(1): one-cycle strobe to the core; ``core_infer``, ``core_batch``,
  ``core_update_mask``, ``core_lfsr_seed`` Out: the run's settings, registers that change only
  while the core is idle (from before ``core_start`` until ``core_busy`` has fallen).
- ``core_busy`` In(1): rises the cycle after ``core_start``, falls when the run ends;
  ``core_correct`` In: taken in the first cycle ``core_busy`` is low after a training run.
- ``core_bank`` Out(1): the input bank the run reads (layer 0's input and the labels), a
  register set with the run's settings; 0 while idle, so a streaming command reads bank 0.
- ``gather_bank`` Out(1): the bank of this cycle's activation and label writes (0 while
  idle); while a run is under way, never ``core_bank``.
- ``stall`` In(1): the core writes an activation in this cycle and takes the memory's write
  port: the whole sequencer (its order generator and multiplier too) keeps its state, so the
  activation write presented in this cycle is presented again in the next (a label write is
  repeated: it writes the same label twice). The shell holds the data, data label and
  schedule memories' reads with it (their read enables low), so a word read in the cycle
  before a stall arrives after it. Only while a run is under way.
- ``act_wr_addr`` Out(ceil_log2(act_bytes // P)), ``act_wr_data`` Out(4 * ACT_BITS),
  ``act_wr_lane`` Out(log2(P)), ``act_wr_mask`` Out(4), ``act_wr_en`` Out(1),
  ``act_wr_count`` Out(range(5)): one activation word a cycle for up to G lanes, into
  ``gather_bank`` (registers). The batch's i-th sample's input k belongs in word s * K + k of lane
  i % P, s = i // P. A write puts word ``act_wr_addr`` of lane ``act_wr_lane`` + j (the lane a
  multiple of G) to byte j (bits 8 * j up) of ``act_wr_data`` for each bit j set in
  ``act_wr_mask``; ``act_wr_en`` is high when any is (the mask is 0 in the other cycles) and
  ``act_wr_count`` is the mask's popcount, the bytes written (the shell's activation-write
  events). With P = 2 a group is both lanes, and mask bits 2 and 3 are never set.
- ``label_wr_addr``, ``label_wr_data``, ``label_wr_en`` Out: the epoch batch's i-th sample's
  label at address i, written two cycles after its index is taken (registers).
- ``pred_rd_addr`` Out, ``pred_rd_data`` In: the core's predictions, one cycle latency.
- ``correct`` Out(range(S + 1)): the epoch's trained samples classified right (cleared when an
  epoch starts); ``test_correct`` Out(range(S + 1)): the evaluation's (cleared when the
  evaluation begins, after the epoch when both were started).

Gather: a transpose of 4 x 4 bytes (a data word holds 4 inputs of one sample; an activation
write holds one input of up to 4 samples). The batch's samples go in lane groups: slots p ..
p + G - 1 (p a multiple of G; the batch's last group may be shorter), all in block s = p // P.
For each word c = 0 .. W - 1 of the group's samples, the gather reads the group's word c one
sample a cycle, in the last G of four read cycles (a short group's missing samples are not
read), and writes the activation words s * K + 4c + r for the inputs 4c + r below K, one a
cycle, byte r of every sample's word to its lane: 4 writes, or R = K - 4(W - 1) for the last
word. The first G - 1 words wait in a shift register; in the cycle the last arrives, row 0
(input 4c) is written from them and the other rows go to a drain, written a row a cycle while
the next word c + 1 is read. So a word takes 4 cycles and a group 4W.

Offsets: sample i's first word i * W comes from a serial shift-add multiplier
(``ember_hw.serial_mul``) of M = ``offset_steps`` = min(index bits, W bits) steps (9 on a
2048-sample build with max_width 1024), one product per M + 1 cycles: an index goes in as the
multiplier frees, and the products collect in the next group's G offsets; one more product
waits in the multiplier while they are full. A group's reads begin in the cycle after its
offsets are collected (G of them, or the batch's last) and its predecessor's reads have ended,
so a group after the first begins T = max(4W, r(M + 1)) cycles after its predecessor (r its
samples): its indices and products hide behind the previous group's reads and writes when
4W >= r(M + 1), as for K >= 37 at M = 9.

Per batch, with no stalls (cycle c: the ``core_start`` of the run before it; for a command's
first batch, c + 1 is the cycle after the start strobe, or the cycle after the epoch's last
run is retired for the evaluation after it): the schedule word is addressed in c + 1 and
decoded in c + 2, and the first index goes into the multiplier in a = c + 3 (when the order
offers one; a test batch has no schedule word: a = c + 2). With g1 = min(G, size) the first
group's samples, its offsets are collected in h1 = a + 1 + g1(M + 1), its reads begin in
h1 + 1, its first write is on the ports in h1 + 6, and its last in
a + g1(M + 1) + sum(T) + 4W + R + 2 (the sum over the groups after the first). Its settings
are loaded in the cycle of its last write or, if the run before it is not yet retired, in the
cycle after that run is (f, the first cycle ``core_busy`` is low after a training run; the
cycle its B-th prediction is compared, f + B - 1, after an inference run), and
``core_start`` comes in the next cycle.

- K = 64, B = 32, P = 32, M = 9: T = 64 cycles a group (16 a sample), a write in every cycle
  from the batch's first to its last, 6 + 40 + 7 * 64 + 64 + 4 = 562 cycles from c to the
  batch's earliest ``core_start`` (17.6 a sample), so a training run of 560 cycles or more
  hides it: the next run then starts in f + 2 (f + B + 1 after an inference run). Only an
  epoch's first batch and an evaluation's first are gathered while the core is idle.
- K <= 4 (W = 1), B = 32, M = 9: the multiplier sets the pace, M + 1 = 10 cycles a sample:
  T = 40 a group, and c to the earliest ``core_start`` 6 + 40 + 7 * 40 + 4 + K = 330 + K
  cycles.

In an evaluation the indices are always there. In an epoch the order generator holds one index
ready while the multiplier works (its pipeline stops while that index waits) and offers the
next in the cycle after a take, a cycle later for each candidate it rejects (fewer than 4 per
index on average): a product is late only when more than M candidates in a row are rejected,
and a group only when its products' delays add up to more than 4W - r(M + 1). An epoch's first
index comes ``order.ORDER_LATENCY`` cycles after the start. After an inference run the
comparison takes cycles f .. f + B - 1 (a prediction and a data label read per cycle, the
match counted in the next); the next run starts after it, as it overwrites the predictions.
``busy`` falls in f + 2 after an epoch's last run, and in f + B + 1 after an
evaluation's. A dropped batch takes its indices one per cycle as the order offers them. A
batch register of 0 (refused by the command check) ends the epoch at once.

Size (Yosys 0.70 from YoWASP, ``rtlil.convert(EpochSequencer(build), name="epoch_sequencer")``,
``synth_ice40 -noabc -top epoch_sequencer; stat``, the order generator and the multiplier
included) for ``Build(lanes=8, data_bytes=131072, data_samples=2048, features=FEATURES,
dataflow="samples")``: 1204 SB_LUT4, 764 flip-flops (all SB_DFFESR: the stall is every
register's enable), 233 SB_CARRY; before the second input bank (the next batch's settings,
the banks and the run in flight), 1150, 719 (549 SB_DFFESR, 170 SB_DFFSR) and 233, and at
lanes=32 1143 SB_LUT4 and the same flip-flops; the byte-a-cycle gather before that: 952,
418, 220. Most of the new flip-flops hold the transposed words (192: the waiting shift
register and the drain) and two groups' offsets (120). These come from Yosys's built-in LUT
mapping (``-noabc``), which gives ``SampleOrder`` 253 SB_LUT4 where abc9 gives 215; abc9
could not be run where these were measured.
"""

from amaranth.hdl import Array, Cat, EnableInserter, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2, exact_log2

from ember import spec

from .order import SampleOrder
from .serial_mul import SerialMultiplier

#: Data bytes (inputs) in one word of the data memory, and so the most lanes one activation
#: write fills: the gather transposes squares of this many bytes.
DATA_WORD_BYTES = spec.BUS_DATA_BITS // spec.ACT_BITS
#: Read cycles per word of a lane group's samples, and write cycles per word at most.
WORD_CYCLES = DATA_WORD_BYTES


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
        #: G: the lanes of one activation write (a lane group); P is a multiple of it.
        self.group_lanes = min(DATA_WORD_BYTES, P)
        self.data_words = -(-build.data_bytes // DATA_WORD_BYTES)
        #: The most data words one sample takes: W for K = max_width.
        self.max_sample_words = -(-build.max_width // DATA_WORD_BYTES)
        # as SampleEngine's activation memory: a word of act_bytes // P in each lane
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
            "schedule_half": In(1),
            "sched_rd_addr": Out(range(build.data_samples)),
            "sched_rd_data": In(spec.BUS_DATA_BITS),
            "data_rd_addr": Out(range(self.data_words)),
            "data_rd_en": Out(1),
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
            "core_bank": Out(1),
            "stall": In(1),
            "gather_bank": Out(1),
            "act_wr_addr": Out(self.act_word_bits),
            "act_wr_data": Out(DATA_WORD_BYTES * spec.ACT_BITS),
            "act_wr_lane": Out(self.lane_bits),
            "act_wr_mask": Out(DATA_WORD_BYTES),
            "act_wr_en": Out(1),
            "act_wr_count": Out(range(DATA_WORD_BYTES + 1)),
            "label_wr_addr": Out(batch_slot),
            "label_wr_data": Out(spec.LABEL_BITS),
            "label_wr_en": Out(1),
            "pred_rd_addr": Out(batch_slot),
            "pred_rd_data": In(spec.LABEL_BITS),
            "correct": Out(range(build.data_samples + 1)),
            "test_correct": Out(range(build.data_samples + 1)),
        })
        self.order = SampleOrder(max_samples=build.data_samples)
        #: W = ceil(K / 4), the data words of a sample, from ``inputs``.
        self.sample_words = Signal(range(self.max_sample_words + 1))
        #: The multiplier's steps for a sample's word offset i * W: its narrower operand's bits.
        self.offset_steps = min(len(self.order.indices.payload), len(self.sample_words))

    def elaborate(self, platform):
        m = Module()
        bld = self.build
        m.submodules.order = order = self.order
        index_shape = order.indices.payload.shape()

        # The command's walk: samples not yet put in a batch, the epoch's batch number, the
        # next test sample, and the batch in hand (its size, first sample and indices still
        # to take from the order or the test counter).
        self.samples_left = Signal(range(bld.data_samples + 1))
        # the schedule word of the batch: (schedule_half * H + b) mod S for batch b
        self.sched_word = Signal(range(bld.data_samples))
        self.test_next = Signal(range(bld.data_samples + 1))
        self.batch_first = Signal(range(bld.data_samples + 1))
        self.to_fetch = Signal(range(bld.max_batch + 1))
        # the batch being gathered (the next run's): its size, first test sample, SLU mask
        # and seed, loaded into the core's settings when its run starts
        self.next_batch = Signal(range(bld.max_batch + 1))
        self.next_first = Signal(range(bld.data_samples + 1))
        self.next_mask = Signal.like(self.core_update_mask)
        self.next_seed = Signal.like(self.core_lfsr_seed)
        # the input bank (activation and label memories) the gather writes: the one the
        # core's run does not read (core_bank)
        self.bank = Signal()
        # a core run started and not yet retired (its correct count taken, or its
        # predictions compared)
        self.in_run = Signal()
        self.evaluate_after = Signal()
        m.d.comb += self.sched_rd_addr.eq(self.sched_word)

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

        m.d.comb += self.sample_words.eq((self.inputs + DATA_WORD_BYTES - 1)
                                         >> exact_log2(DATA_WORD_BYTES))
        self.gathering_batch = Signal()       # set by the sequencer while a batch is gathered
        # the cycle a collected group's offsets go to the reads
        handoff = Signal()
        collect_busy, group_ready, collected, offsets = self._collect(m, index_shape, handoff)
        reading, group_read_end, landing, landed_words = self._read(m, handoff, collected,
                                                                    offsets)
        m.d.comb += handoff.eq(group_ready & (~reading | group_read_end))
        write_busy = self._write(m, landing, landed_words)
        read_busy = reading | landing.arrives
        # the last write is on the ports in this cycle: the core may start in the next
        gather_done = ~(collect_busy | read_busy | write_busy)
        compare_done = self._compare(m)
        self._sequence(m, order, gather_done)
        self._retire(m, compare_done)
        # frozen while the core takes the activation memory's write port: the write
        # presented in such a cycle is presented again in the next
        return EnableInserter(~self.stall)(m)

    def _collect(self, m, index_shape, handoff):
        """The batch's indices into the offset multiplier, one as it frees, and their word
        offsets into the next group's buffer, which ``handoff`` empties into the reads (a
        product landing in that cycle goes to its first place); in an epoch, each sample's
        label into the label memory. Returns (busy: an index or offset not yet handed off,
        group ready to hand off, offsets collected, the offsets)."""
        G = self.group_lanes
        W = self.sample_words
        index_bits, words_bits = index_shape.width, len(W)
        # the narrower operand is shifted out a bit per step (offset_steps)
        if index_bits <= words_bits:
            m.submodules.offset_mul = mul = SerialMultiplier(words_bits, index_bits)
            m.d.comb += [mul.a.eq(W), mul.b.eq(self.source_index)]
        else:
            m.submodules.offset_mul = mul = SerialMultiplier(index_bits, words_bits)
            m.d.comb += [mul.a.eq(self.source_index), mul.b.eq(W)]

        multiplying = Signal()                # a product not yet in the buffer (or under way)
        collected = Signal(range(G + 1))
        offsets = [Signal.like(self.data_rd_addr, name=f"collected{j}_offset") for j in range(G)]
        place = Mux(handoff, 0, collected)    # where a product landing in this cycle goes
        lands = multiplying & mul.done & ((collected != G) | handoff)
        m.d.comb += [
            self.fetch.eq(self.gathering_batch & self.source_valid & (self.to_fetch != 0)
                          & (~multiplying | lands)),
            mul.start.eq(self.fetch),
        ]
        m.d.sync += [multiplying.eq(self.fetch | (multiplying & ~lands)),
                     collected.eq(place + lands)]
        with m.If(lands):
            for j, offset in enumerate(offsets):
                with m.If(place == j):
                    m.d.sync += offset.eq(mul.product)
        # full, or the batch's last: every index taken and its product in
        group_ready = (collected == G) | ((collected != 0) & (self.to_fetch == 0) & ~multiplying)

        # the label of the index taken in this cycle: read in this cycle, written in the next
        label_read = Signal()
        label_read_slot = Signal.like(self.label_wr_addr)
        m.d.sync += [
            label_read.eq(self.fetch & ~self.core_infer),
            label_read_slot.eq(self.next_batch - self.to_fetch),
            self.label_wr_en.eq(label_read),
            self.label_wr_addr.eq(label_read_slot),
            self.label_wr_data.eq(self.dlabel_rd_data),
        ]
        self.sample_label_addr = self.source_index
        busy = multiplying | (collected != 0) | (self.to_fetch != 0)
        return busy, group_ready, collected, offsets

    def _read(self, m, handoff, collected, offsets):
        """The reads of the group handed off (``collected`` samples at ``offsets``): word c of
        each of its samples, one a cycle in the last G of WORD_CYCLES cycles, for c = 0 ..
        W - 1. Returns (reading: a group's reads under way, the cycle of its last read, the
        landing: high in the cycle after each c's last read, with the write settings of the
        words then landed, and those words: the group's word c, sample j in the j-th)."""
        G = self.group_lanes
        K, W = self.inputs, self.sample_words
        reading = Signal()
        # sample read_cycle - (WORD_CYCLES - G) of the group is read in this cycle (its lowest
        # bits, as WORD_CYCLES - G is a multiple of G)
        read_cycle = Signal(exact_log2(WORD_CYCLES))
        sample_word = Signal(range(self.max_sample_words))    # c: the samples' word being read
        group_offsets = [Signal.like(offset, name=f"group{j}_offset")
                         for j, offset in enumerate(offsets)]
        group_samples = Signal(range(G + 1))
        group_lane = Signal(self.lane_bits)               # the group's first lane, p % P
        word_act_addr = Signal(self.act_word_bits)        # s * K + 4c
        # where the next group goes: its first lane and its block's first word s * K
        next_lane = Signal(self.lane_bits)
        next_block_word = Signal(self.act_word_bits)

        last_word = sample_word == W - 1
        word_read_end = reading & (read_cycle == WORD_CYCLES - 1)
        group_read_end = word_read_end & last_word
        slot = read_cycle[:exact_log2(G)]
        m.d.comb += [
            self.data_rd_addr.eq(Array(group_offsets)[slot] + sample_word),
            # a word is read for each of the group's samples, none for a short group's
            # missing ones (the data_reads events)
            self.data_rd_en.eq(reading & (read_cycle >= WORD_CYCLES - G)
                               & (slot < group_samples)),
        ]

        with m.If(reading):
            m.d.sync += read_cycle.eq(read_cycle + 1)
            with m.If(word_read_end):
                m.d.sync += [sample_word.eq(sample_word + 1),
                             word_act_addr.eq(word_act_addr + DATA_WORD_BYTES)]
                with m.If(last_word):
                    m.d.sync += reading.eq(0)
        with m.If(handoff):
            m.d.sync += [reading.eq(1), read_cycle.eq(0), sample_word.eq(0),
                         group_samples.eq(collected), group_lane.eq(next_lane),
                         word_act_addr.eq(next_block_word), next_lane.eq(next_lane + G),
                         [g.eq(o) for g, o in zip(group_offsets, offsets)]]
            with m.If(next_lane == self.build.lanes - G):
                m.d.sync += next_block_word.eq(next_block_word + K)
        with m.If(~self.gathering_batch):
            # between batches: the next batch's first sample goes to lane 0 of block 0
            m.d.sync += [next_lane.eq(0), next_block_word.eq(0)]

        # the words arrive the cycle after their reads: the first G - 1 of c wait in a shift
        # register that takes every cycle's read word (so it holds the last G - 1 read when
        # the last word lands with them)
        waiting = [Signal(spec.BUS_DATA_BITS, name=f"waiting{j}_word") for j in range(G - 1)]
        m.d.sync += [w.eq(n) for w, n in zip(waiting, waiting[1:] + [self.data_rd_data])]
        landing = Signal(data.StructLayout({
            "arrives": 1,
            "act_addr": self.act_word_bits,
            "lane": self.lane_bits,
            "samples": range(G + 1),
            "rows": range(DATA_WORD_BYTES + 1),       # the inputs 4c .. 4c + 3 below K
        }))
        m.d.sync += landing.arrives.eq(word_read_end)
        with m.If(word_read_end):
            m.d.sync += [
                landing.act_addr.eq(word_act_addr),
                landing.lane.eq(group_lane),
                landing.samples.eq(group_samples),
                landing.rows.eq(Mux(last_word, (K - 1)[:exact_log2(DATA_WORD_BYTES)] + 1,
                                    DATA_WORD_BYTES)),
            ]
        return reading, group_read_end, landing, waiting + [self.data_rd_data]

    def _write(self, m, landing, words):
        """The activation writes: in a landing cycle the first row (input 4c) of the landed
        ``words``, then their other rows from the drain, one a cycle. Returns the signal that
        is high while rows are left to write after this cycle's."""
        row_bits = spec.BUS_DATA_BITS - spec.ACT_BITS
        # the rows not yet written, row 1 in the low byte
        drain = [Signal(row_bits, name=f"drain{j}_rows") for j in range(len(words))]
        rows_left = Signal(range(DATA_WORD_BYTES))
        with m.If(landing.arrives):
            m.d.sync += [
                [d.eq(w[spec.ACT_BITS:]) for d, w in zip(drain, words)],
                rows_left.eq(landing.rows - 1),
                self.act_wr_en.eq(1),
                self.act_wr_addr.eq(landing.act_addr),
                self.act_wr_lane.eq(landing.lane),
                self.act_wr_mask.eq(Cat(landing.samples > j for j in range(DATA_WORD_BYTES))),
                self.act_wr_count.eq(landing.samples),
                self.act_wr_data.eq(Cat(w[:spec.ACT_BITS] for w in words)),
            ]
        with m.Elif(rows_left != 0):
            m.d.sync += [
                [d.eq(d[spec.ACT_BITS:]) for d in drain],
                rows_left.eq(rows_left - 1),
                self.act_wr_addr.eq(self.act_wr_addr + 1),
                self.act_wr_data.eq(Cat(d[:spec.ACT_BITS] for d in drain)),
            ]
        with m.Else():
            m.d.sync += [self.act_wr_en.eq(0), self.act_wr_mask.eq(0), self.act_wr_count.eq(0)]
        return rows_left != 0

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
        m.d.sync += [self.next_batch.eq(size), self.to_fetch.eq(size),
                     self.samples_left.eq(self.samples_left - size)]

    def _begin_evaluation(self, m):
        m.d.sync += [self.core_infer.eq(1), self.test_correct.eq(0),
                     self.samples_left.eq(self.test_samples),
                     self.test_next.eq(self.train_samples), self.evaluate_after.eq(0)]

    def _sequence(self, m, order, gather_done):
        """The command's states: batch after batch, its schedule word and its gather into
        the bank the core does not read, then its run as soon as the core's last one is
        retired; the next batch is gathered while it runs."""
        m.d.comb += [self.dlabel_rd_addr.eq(Mux(self.comparing, self.compare_label_addr,
                                                self.sample_label_addr)),
                     self.gather_bank.eq(self.bank)]
        with m.FSM(name="epoch") as fsm:
            with m.State("IDLE"):
                with m.If(self.start_epoch):
                    m.d.comb += [order.start.eq(1), order.key.eq(self.epoch_key),
                                 order.samples.eq(self.train_samples)]
                    m.d.sync += [self.core_infer.eq(0), self.correct.eq(0),
                                 self.samples_left.eq(self.train_samples),
                                 self.sched_word.eq(Mux(self.schedule_half,
                                                        spec.schedule_half_words(self.build), 0)),
                                 self.evaluate_after.eq(self.start_evaluate)]
                    m.next = "NEXT_BATCH"
                with m.Elif(self.start_evaluate):
                    self._begin_evaluation(m)
                    m.next = "NEXT_TEST_BATCH"

            with m.State("NEXT_BATCH"):
                # the schedule word of the batch (sched_word) is read in this cycle
                with m.If((self.samples_left == 0) | (self.batch == 0)):
                    m.next = "FINISH"
                with m.Else():
                    m.next = "SCHEDULE"

            with m.State("SCHEDULE"):
                dropped, mask, seed = self._schedule_word()
                self._take_batch(m, self.batch)
                last = self.sched_word == self.build.data_samples - 1
                m.d.sync += [self.sched_word.eq(Mux(last, 0, self.sched_word + 1)),
                             self.next_mask.eq(mask), self.next_seed.eq(seed)]
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
                    m.next = "FINISH"
                with m.Else():
                    self._take_batch(m, self.build.max_batch)
                    m.d.sync += [self.next_first.eq(self.test_next),
                                 self.next_mask.eq(0), self.next_seed.eq(1)]
                    m.next = "GATHER"

            with m.State("GATHER"):
                m.d.comb += self.gathering_batch.eq(1)
                with m.If(gather_done):
                    with m.If(~self.in_run):
                        self._load_run(m)
                        m.next = "LAUNCH"
                    with m.Else():
                        m.next = "READY"

            with m.State("READY"):
                # the batch is in its bank: it runs once the core's last run is retired
                with m.If(~self.in_run):
                    self._load_run(m)
                    m.next = "LAUNCH"

            with m.State("LAUNCH"):
                # the run's settings were loaded in the cycle before: the core samples them
                m.d.comb += self.core_start.eq(1)
                m.d.sync += self.in_run.eq(1)
                with m.If(self.core_infer):
                    m.next = "NEXT_TEST_BATCH"
                with m.Else():
                    m.next = "NEXT_BATCH"

            with m.State("FINISH"):
                # every batch gathered: the last run retires, then the evaluation or the end
                with m.If(~self.in_run):
                    with m.If(self.evaluate_after & ~self.core_infer):
                        self._begin_evaluation(m)
                        m.next = "NEXT_TEST_BATCH"
                    with m.Else():
                        # streaming commands read bank 0 (the window writes there)
                        m.d.sync += [self.bank.eq(0), self.core_bank.eq(0)]
                        m.next = "IDLE"

        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE"))

    def _load_run(self, m):
        """The gathered batch's settings into the core's, its bank the run's; the next batch
        goes to the other bank."""
        m.d.sync += [self.core_bank.eq(self.bank), self.bank.eq(~self.bank),
                     self.core_batch.eq(self.next_batch), self.batch_first.eq(self.next_first),
                     self.core_update_mask.eq(self.next_mask),
                     self.core_lfsr_seed.eq(self.next_seed)]

    def _retire(self, m, compare_done):
        """A core run that has ended: a training run's correct count added, an inference
        run's predictions compared with the data labels (the next run starts after that,
        as it overwrites them)."""
        with m.If(self.in_run & ~self.core_busy):
            with m.If(self.core_infer):
                m.d.comb += self.comparing.eq(1)
                with m.If(compare_done):
                    m.d.sync += self.in_run.eq(0)
            with m.Else():
                m.d.sync += [self.correct.eq(self.correct + self.core_correct),
                             self.in_run.eq(0)]
