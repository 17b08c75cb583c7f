"""The resident data unit's sequencer (hw/ember_hw/epoch.py) against its golden twin's
semantics (ember.virtual.VirtualEngine._resident_command: ember.schedule.EpochSchedule's
batches, a kept batch's seed 0 run as 1; the test split in batches of max_batch), in the
Amaranth simulator. Real memories hold the data (each sample on words of its own, padding
random), the data labels and the schedule; the testbench plays the core: it checks every run's
settings and the activation bytes and labels gathered for it (in the bank the run reads, while
the run before it reads the other), and answers with random run lengths, correct counts and
predictions, and stalls the gather at random while a run is under way (the core's own
activation writes). The gather's timing is checked against the docstring's formula."""

import gc
import warnings
from dataclasses import dataclass

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module, Signal, UnusedElaboratable
from amaranth.lib.memory import Memory
from amaranth.utils import ceil_log2

from ember import spec
from ember.schedule import EpochSchedule
from ember_hw.epoch import DATA_WORD_BYTES, EpochSequencer
from ember_hw.order import ORDER_LATENCY
from ember_hw.sample_engine import SampleEngine

from engine_harness import run_testbench

#: Cycles a command may take in these tests before the testbench calls it hung.
COMMAND_TIMEOUT = 100_000


def sample_words(inputs):
    """W: the data words of a sample of `inputs` bytes (each sample starts on a word)."""
    return -(-inputs // DATA_WORD_BYTES)


@dataclass
class Case:
    """One resident data set on one build, and the epoch's schedule words."""
    build: spec.Build
    inputs: int                 # K
    batch: int                  # B
    layers: int
    train_samples: int
    test_samples: int
    key: int
    data: np.ndarray            # the data memory's bytes, 4 a word: sample i's input k at
                                # 4 * W * i + k, every other byte padding
    labels: np.ndarray          # data_samples labels
    words: list                 # data_samples schedule words (past the epoch's: garbage)

    def epoch_batches(self):
        return -(-self.train_samples // self.batch)

    def sample_bytes(self, sample):
        start = DATA_WORD_BYTES * sample_words(self.inputs) * sample
        return self.data[start:start + self.inputs]


@dataclass
class Run:
    """A core run the sequencer should start: its settings and the samples it gathers."""
    infer: bool
    samples: np.ndarray
    update_mask: int
    lfsr_seed: int


@dataclass
class RunTiming:
    """A run as the testbench saw it, in cycles from its command's first cycle after the start
    strobe: its core_start, the cycles of its act writes, and the cycle in which core_busy is
    first low after it (f in the docstring)."""
    run: Run
    core_start: int
    writes: list
    end: int = None


def draw_case(rng, lanes, inputs, max_batch, batch, train_samples, test_samples,
              drop_chance=0.25, seed_zero_chance=0.2, extra_samples=None):
    """A random data set and schedule; layers below max_layers, so some schedule words carry
    mask bits the sequencer must ignore. The data memory ends anywhere from the last sample's
    last input to a word and more past it."""
    extra = int(rng.integers(0, 4)) if extra_samples is None else extra_samples
    data_samples = train_samples + test_samples + extra
    sample_bytes = DATA_WORD_BYTES * sample_words(inputs)
    data_bytes = (data_samples - 1) * sample_bytes + inputs + int(rng.integers(0, sample_bytes))
    build = spec.Build(name="epoch-test", dataflow="samples", lanes=lanes, max_batch=max_batch,
                       data_bytes=data_bytes, data_samples=data_samples,
                       features=spec.FEATURES)
    words = []
    for _ in range(data_samples):
        word = int(rng.integers(0, 1 << spec.SCHEDULE_DROP_BIT))   # mask bits up to bit 30
        if rng.random() < seed_zero_chance:
            word &= ~((1 << spec.SCHEDULE_SEED_BITS) - 1)
        if rng.random() < drop_chance:
            word |= 1 << spec.SCHEDULE_DROP_BIT
        words.append(word)
    memory_bytes = DATA_WORD_BYTES * -(-data_bytes // DATA_WORD_BYTES)
    return Case(build, inputs, batch, int(rng.integers(1, build.max_layers)), train_samples,
                test_samples, int(rng.integers(0, 1 << spec.ORDER_KEY_BITS)),
                rng.integers(0, 1 << spec.ACT_BITS, memory_bytes),
                rng.integers(0, 1 << spec.LABEL_BITS, data_samples), words)


def expected_runs(case, epoch, evaluate):
    """The core runs of a command, as _resident_command makes them."""
    runs = []
    if epoch:
        sched = EpochSchedule.from_words(case.words[:case.epoch_batches()], case.key,
                                         case.train_samples, case.batch, spec.StepSettings(),
                                         case.layers)
        for samples, dropped, settings in sched.batches():
            if not dropped:
                mask = sum(1 << l for l, on in enumerate(settings.update_mask) if on)
                runs.append(Run(False, samples, mask, settings.lfsr_seed or 1))
    if evaluate:
        end = case.train_samples + case.test_samples
        for first in range(case.train_samples, end, case.build.max_batch):
            runs.append(Run(True, np.arange(first, min(first + case.build.max_batch, end)), 0, 1))
    return runs


def gathered(case, run):
    """The activation bytes ((word, lane) -> byte) and labels (address -> label) the core
    should hold for `run`: the batch's i-th sample's input k in word (i // P) * K + k of lane
    i % P."""
    P, K = case.build.lanes, case.inputs
    acts = {((i // P) * K + k, i % P): int(byte)
            for i, sample in enumerate(run.samples)
            for k, byte in enumerate(case.sample_bytes(sample))}
    labels = {} if run.infer else {i: int(case.labels[s]) for i, s in enumerate(run.samples)}
    return acts, labels


class SequencerHarness(Elaboratable):
    """The sequencer with real memories (amaranth.lib.memory) for the data words, the data
    labels and the schedule words, each read one cycle after its address."""

    def __init__(self, case):
        self.case = case
        self.seq = EpochSequencer(case.build)
        # the schedule's write port, as the shell's bus has it between commands
        self.sched_wr_addr = Signal(range(case.build.data_samples))
        self.sched_wr_data = Signal(spec.BUS_DATA_BITS)
        self.sched_wr_en = Signal()

    def elaborate(self, platform):
        m = Module()
        m.submodules.seq = seq = self.seq
        case = self.case
        assert len(case.data) == seq.data_words * DATA_WORD_BYTES, "the case's memory size"
        data_words = [sum(int(b) << (spec.ACT_BITS * q) for q, b in enumerate(word))
                      for word in case.data.reshape(-1, DATA_WORD_BYTES)]
        memories = (("data", spec.BUS_DATA_BITS, data_words, seq.data_rd_addr, seq.data_rd_data),
                    ("data_labels", spec.LABEL_BITS, [int(v) for v in case.labels],
                     seq.dlabel_rd_addr, seq.dlabel_rd_data),
                    ("schedule", spec.BUS_DATA_BITS, case.words, seq.sched_rd_addr,
                     seq.sched_rd_data))
        for name, width, init, addr, read_data in memories:
            m.submodules[name] = memory = Memory(shape=width, depth=len(init), init=init)
            port = memory.read_port()
            # as the shell: the reads hold while the sequencer is stalled, and the data
            # memory reads only when the sequencer asks (so a word it fails to ask for is
            # not delivered)
            enable = seq.data_rd_en if name == "data" else 1
            m.d.comb += [port.addr.eq(addr), read_data.eq(port.data),
                         port.en.eq(enable & ~seq.stall)]
        write = m.submodules.schedule.write_port()
        m.d.comb += [write.addr.eq(self.sched_wr_addr), write.data.eq(self.sched_wr_data),
                     write.en.eq(self.sched_wr_en)]
        return m


class CoreStandIn:
    """The testbench's side of one simulation: the registers, the core and the expected
    counts, command after command."""

    def __init__(self, ctx, harness, rng, run_cycles=(1, 6), stall_chance=0.3):
        self.ctx, self.harness, self.rng = ctx, harness, rng
        #: a run's busy cycles are drawn from range(*run_cycles); while it is busy, each
        #: cycle stalls the gather with stall_chance
        self.run_cycles, self.stall_chance = run_cycles, stall_chance
        self.seq, self.case = harness.seq, harness.case
        self.correct = 0            # what `correct` and `test_correct` should read
        self.test_correct = 0
        #: per command, its runs' RunTiming
        self.timings = []
        case, seq = self.case, self.seq
        for port, value in ((seq.batch, case.batch), (seq.layers, case.layers),
                            (seq.inputs, case.inputs), (seq.train_samples, case.train_samples),
                            (seq.test_samples, case.test_samples), (seq.epoch_key, case.key)):
            ctx.set(port, value)

    def settings(self):
        seq = self.seq
        return tuple(self.ctx.get(p) for p in (seq.core_infer, seq.core_batch,
                                               seq.core_update_mask, seq.core_lfsr_seed))

    def act_write(self, acts):
        """Record this cycle's activation write in `acts` ((word, lane) -> byte), checking the
        port's own rules; returns whether there was one. A stalled cycle's write is not
        taken (the sequencer presents it again)."""
        ctx, seq, P = self.ctx, self.seq, self.case.build.lanes
        if ctx.get(seq.stall):
            return False
        group = seq.group_lanes
        mask, lane, word = ctx.get(seq.act_wr_mask), ctx.get(seq.act_wr_lane), \
            ctx.get(seq.act_wr_addr)
        assert ctx.get(seq.act_wr_en) == (mask != 0), f"act_wr_en against mask {mask:04b}"
        assert ctx.get(seq.act_wr_count) == bin(mask).count("1"), f"count of mask {mask:04b}"
        if not mask:
            return False
        assert mask < 1 << group and lane % group == 0, f"lanes {lane} mask {mask:04b}"
        data = ctx.get(seq.act_wr_data)
        for j in range(group):
            if mask >> j & 1:
                assert (word, lane + j) not in acts, f"word {word} of lane {lane + j} twice"
                acts[word, lane + j] = data >> (spec.ACT_BITS * j) & ((1 << spec.ACT_BITS) - 1)
        assert lane + group <= P
        return True

    async def command(self, epoch, evaluate, stray_starts=0.0):
        """Start EPOCH and/or EVALUATE and play the core until busy falls; `stray_starts`:
        the chance per busy cycle of a start strobe, which must be ignored."""
        ctx, seq, rng, case = self.ctx, self.seq, self.rng, self.case
        runs = expected_runs(case, epoch, evaluate)
        # the data_reads events: every gathered sample's W words, once each
        expected_reads = sum(len(r.samples) for r in runs) * sample_words(case.inputs)
        data_reads = 0
        ctx.set(seq.start_epoch, epoch)
        ctx.set(seq.start_evaluate, evaluate)
        await ctx.tick()
        ctx.set(seq.start_epoch, 0)
        ctx.set(seq.start_evaluate, 0)
        self.correct = 0 if epoch else self.correct
        self.test_correct = 0 if evaluate else self.test_correct
        acts, labels, writes, timings, banks = {}, {}, [], [], set()
        self.timings.append(timings)
        running, busy_left, held, run = False, 0, None, None
        predictions = rng.integers(0, 1 << spec.LABEL_BITS, 1 << len(seq.pred_rd_addr))
        for cycle in range(COMMAND_TIMEOUT):
            if not ctx.get(seq.busy):
                break
            writing = ctx.get(seq.act_wr_en) or ctx.get(seq.label_wr_en)
            if writing:
                banks.add(ctx.get(seq.gather_bank))
                assert not running or ctx.get(seq.gather_bank) != ctx.get(seq.core_bank), \
                    "a write into the bank the running core reads"
            if self.act_write(acts):
                writes.append(cycle)
            if ctx.get(seq.label_wr_en):
                labels[ctx.get(seq.label_wr_addr)] = ctx.get(seq.label_wr_data)
            if running:
                assert self.settings() == held, f"run settings changed while busy: {held}"
                assert not ctx.get(seq.core_start), "core_start while the core runs"
            elif ctx.get(seq.core_start):
                assert runs, "a core run more than the command's"
                assert not (ctx.get(seq.act_wr_en) or ctx.get(seq.label_wr_en)), \
                    "a write in the core_start cycle (the core starts the cycle after the last)"
                run = runs.pop(0)
                held = self.settings()
                expect = (int(run.infer), len(run.samples), run.update_mask, run.lfsr_seed)
                assert held == expect, f"run (infer, batch, mask, seed) {held} != {expect}"
                assert (acts, labels) == gathered(case, run), "gathered bytes or labels"
                assert banks == {ctx.get(seq.core_bank)}, "the run's bank is not its gather's"
                timings.append(RunTiming(run, cycle, writes))
                acts, labels, writes, banks = {}, {}, [], set()
                running, busy_left = True, int(rng.integers(*self.run_cycles))
            data_reads += ctx.get(seq.data_rd_en) and not ctx.get(seq.stall)
            pred_addr = ctx.get(seq.pred_rd_addr)
            if rng.random() < stray_starts:
                ctx.set(seq.start_epoch, 1)
                ctx.set(seq.start_evaluate, rng.random() < 0.5)
            await ctx.tick()
            ctx.set(seq.start_epoch, 0)
            ctx.set(seq.start_evaluate, 0)
            ctx.set(seq.pred_rd_data, int(predictions[pred_addr]))
            ctx.set(seq.stall, 0)
            if running and busy_left:
                # busy rises the cycle after core_start; what it reads meanwhile is garbage
                busy_left -= 1
                ctx.set(seq.core_busy, 1)
                ctx.set(seq.core_correct, int(rng.integers(0, case.build.max_batch + 1)))
                ctx.set(seq.stall, int(rng.random() < self.stall_chance))
            elif running:
                running = False
                ctx.set(seq.core_busy, 0)
                timings[-1].end = cycle + 1
                size = len(run.samples)
                if run.infer:
                    truth = case.labels[run.samples]
                    # about half the predictions right; the rest random, past the batch too
                    predictions = rng.integers(0, 1 << spec.LABEL_BITS, len(predictions))
                    right = rng.random(size) < 0.5
                    predictions[:size][right] = truth[right]
                    self.test_correct += int((predictions[:size] == truth).sum())
                else:
                    correct = int(rng.integers(0, size + 1))
                    ctx.set(seq.core_correct, correct)
                    self.correct += correct
        else:
            raise AssertionError(f"command (epoch={epoch}, evaluate={evaluate}) still busy "
                                 f"after {COMMAND_TIMEOUT} cycles")
        assert not running and not runs, f"{len(runs)} runs missing when busy fell"
        assert not acts and not labels, "writes after the last run"
        assert data_reads == expected_reads, f"data words read {data_reads} != {expected_reads}"
        assert ctx.get(seq.core_bank) == 0 and ctx.get(seq.gather_bank) == 0, \
            "banks other than 0 after the command (streaming reads and writes bank 0)"
        assert ctx.get(seq.correct) == self.correct, "correct"
        assert ctx.get(seq.test_correct) == self.test_correct, "test_correct"

    async def write_schedule(self, words):
        """Write the schedule memory between commands (as the host does over the bus)."""
        harness = self.harness
        for addr, word in enumerate(words):
            self.ctx.set(harness.sched_wr_addr, addr)
            self.ctx.set(harness.sched_wr_data, word)
            self.ctx.set(harness.sched_wr_en, 1)
            await self.ctx.tick()
        self.ctx.set(harness.sched_wr_en, 0)
        self.case.words = list(words)


def simulate(case, commands, seed, stray_starts=0.0, between=None, **stand_in_options):
    """Run `commands` ((epoch, evaluate) pairs) back to back on one sequencer; `between`:
    an async function (stand_in, command number) run before each command;
    `stand_in_options`: CoreStandIn's run_cycles and stall_chance. Returns the stand-in (its
    timings)."""
    harness = SequencerHarness(case)
    rng = np.random.default_rng(seed)
    result = {}

    async def testbench(ctx):
        stand_in = result["stand_in"] = CoreStandIn(ctx, harness, rng, **stand_in_options)
        assert not ctx.get(harness.seq.busy), "busy out of reset"
        for number, (epoch, evaluate) in enumerate(commands):
            if between:
                await between(stand_in, number)
            await stand_in.command(epoch, evaluate, stray_starts)

    run_testbench(harness, testbench)
    return result["stand_in"]


def random_case(seed):
    rng = np.random.default_rng(seed)
    lanes = (2, 4, 8, 32)[seed % 4]
    # batches past 32 lanes in every other 32-lane case, so that they have a second block
    max_batch = int(rng.integers(1, 41 if lanes == 32 and seed // 4 % 2 else 21))
    batch = int(rng.integers(1, max_batch + 1))
    full_batches = int(rng.integers(1, max(2, 96 // batch)))
    # a partial last batch unless every batch is one sample
    train = batch * full_batches + (int(rng.integers(1, batch)) if batch > 1 else 0)
    test = int(rng.integers(1, 2 * max_batch + 2))
    # K % 4 = 1, 2, 3, 0 in turn over the seeds of one lane count
    inputs = DATA_WORD_BYTES * int(rng.integers(0, 18)) + 1 + (seed // 4) % DATA_WORD_BYTES
    return draw_case(rng, lanes, inputs, max_batch, batch, train, test)


@pytest.mark.parametrize("seed", range(16))
def test_random_commands_match_golden(seed):
    """Both commands in one start, each alone, and an epoch after an evaluation, with stray
    start strobes while busy (ignored)."""
    case = random_case(seed)
    simulate(case, [(1, 1), (1, 0), (0, 1), (1, 0)], seed, stray_starts=0.05)


@pytest.mark.parametrize("lanes, inputs, max_batch, batch, train, test", [
    (2, 1, 1, 1, 5, 3),          # one-sample batches, one-byte samples: the multiplier's pace
    (8, 37, 16, 16, 40, 17),     # blocks of 8, the last batch and the last test batch short
    (4, 6, 6, 5, 23, 6),         # a block of one group, the last a sample short
    (32, 70, 40, 35, 70, 9),     # a second block of one group of 3; K % 4 = 2
    (32, 4, 33, 33, 33, 1),      # a second block of one sample; one word a sample
])
def test_edge_shapes_match_golden(lanes, inputs, max_batch, batch, train, test):
    rng = np.random.default_rng(lanes * 1000 + inputs)
    case = draw_case(rng, lanes, inputs, max_batch, batch, train, test)
    simulate(case, [(1, 1), (0, 1)], lanes + inputs)


def test_every_batch_dropped():
    """An epoch whose batches are all dropped runs no core and leaves correct 0 (cleared), and
    takes its indices from the order: the epoch after it, all kept, gets the whole order."""
    rng = np.random.default_rng(21)
    case = draw_case(rng, 4, 9, 8, 3, 20, 5, drop_chance=0.0)
    kept = list(case.words)
    dropped = [w | 1 << spec.SCHEDULE_DROP_BIT for w in kept]

    async def between(stand_in, number):
        if number == 1:
            assert stand_in.correct > 0, "the kept epoch's correct must be nonzero to test clearing"
            await stand_in.write_schedule(dropped)
        if number == 2:
            await stand_in.write_schedule(kept)

    stand_in = simulate(case, [(1, 0), (1, 1), (1, 0)], 21, between=between)
    batches = case.epoch_batches()
    assert [[t.run.infer for t in runs] for runs in stand_in.timings] == \
        [[False] * batches, [True], [False] * batches]


def gather_timing(seq, inputs, size):
    """The docstring's gather of a batch of `size` samples when its indices come in time:
    (its first write cycle, its last, its core_start), counted from a (the cycle its first
    index goes into the multiplier), and its write cycles."""
    G, M = seq.group_lanes, seq.offset_steps
    W = sample_words(inputs)
    word_writes = [DATA_WORD_BYTES] * (W - 1) + [inputs - DATA_WORD_BYTES * (W - 1)]
    groups = [min(G, size - p) for p in range(0, size, G)]
    collected = 1 + groups[0] * (M + 1)                                  # h1 - a
    last_collected = collected + sum(max(DATA_WORD_BYTES * W, r * (M + 1)) for r in groups[1:])
    last_write = last_collected + DATA_WORD_BYTES * W + word_writes[-1] + 1
    return collected + 6, last_write, last_write + 1, len(groups) * sum(word_writes)


def check_timing(stand_in, commands):
    """Every run's writes and core_start where the docstring puts them, with no stalls: a
    command's runs are its batches, every one kept, and an epoch's order offers an index
    every cycle (n = 4**h). A batch's gather begins after its schedule word, once the run
    before it has started (or, the evaluation's first after an epoch, once the epoch's last
    run is retired); it starts when its gather is done and the run before it retired."""
    seq, case = stand_in.seq, stand_in.case
    for (epoch, _), runs in zip(commands, stand_in.timings):
        # the start strobe in cycle -1; then an epoch's first index comes from the order, an
        # evaluation's as it begins gathering
        a, previous = (ORDER_LATENCY - 1 if epoch else 1), None
        for t in runs:
            size = len(t.run.samples)
            first, last, start, writes = gather_timing(seq, case.inputs, size)
            if previous is not None and previous.run.infer != t.run.infer:
                a, previous = previous.end + 3, None
            elif previous is not None:
                # LAUNCH, then NEXT_BATCH and SCHEDULE (an epoch's) or NEXT_TEST_BATCH
                a = previous.core_start + (2 if t.run.infer else 3)
            assert (t.writes[0] - a, t.writes[-1] - a, len(t.writes)) == \
                (first, last, writes), (t.run.infer, size)
            ready = a + start
            if previous is not None:
                # retired in f (a training run) or when its last prediction is compared
                retired = previous.end + (len(previous.run.samples) - 1
                                          if previous.run.infer else 0)
                ready = max(ready, retired + 2)
            assert t.core_start == ready, (t.run.infer, size, t.core_start - a)
            previous = t


@pytest.mark.parametrize("lanes, inputs, max_batch, test", [
    (32, 64, 32, 70),       # writes set the pace (4W >= 4(M + 1)); the last group short
    (4, 30, 12, 30),        # writes set the pace of full groups, not the last word's
    (8, 3, 12, 30),         # one word a sample: the multiplier sets the pace
    (2, 5, 7, 16),          # groups of two: the multiplier sets the pace
    (2, 62, 5, 11),         # groups of two: the writes set the pace
])
@pytest.mark.parametrize("run_cycles", [(1, 6), (900, 901)])
def test_gather_timing_in_an_evaluation(lanes, inputs, max_batch, test, run_cycles):
    """Runs shorter than a gather (the gather sets the pace) and longer (it is hidden)."""
    rng = np.random.default_rng(lanes + inputs)
    case = draw_case(rng, lanes, inputs, max_batch, max_batch, 4, test)
    stand_in = simulate(case, [(0, 1)], inputs, run_cycles=run_cycles, stall_chance=0.0)
    check_timing(stand_in, [(0, 1)])


@pytest.mark.parametrize("run_cycles", [(1, 6), (900, 901)])
def test_gather_of_64_inputs_at_32_lanes(run_cycles):
    """The docstring's figures for K = 64, B = 32, P = 32, M = 9: a write every cycle from a
    batch's first to its last; 562 cycles from one run's core_start to the next's while the
    gather sets the pace (runs of at most 5 cycles), and 2 cycles from the end of a training
    run to the next's start when the gather is hidden behind it (runs of 900 cycles), B + 1
    after an inference run; in an epoch (n = 64 = 4**3, so the order rejects no candidate)
    and in the evaluation after it."""
    rng = np.random.default_rng(64)
    case = draw_case(rng, 32, 64, 32, 32, 64, 200, drop_chance=0.0, extra_samples=0)
    stand_in = simulate(case, [(1, 1)], 64, run_cycles=run_cycles, stall_chance=0.0)
    assert stand_in.seq.offset_steps == 9
    check_timing(stand_in, [(1, 1)])
    runs = stand_in.timings[0]
    for t in runs:
        assert t.writes == list(range(t.writes[0], t.writes[0] + len(t.run.samples) * 16))
    for previous, t in zip(runs, runs[1:]):
        if len(t.run.samples) != 32 or previous.run.infer != t.run.infer:
            continue
        if run_cycles[0] > 600:
            assert t.core_start - previous.end == (33 if t.run.infer else 2)
        else:
            # an inference's next batch begins gathering a cycle sooner (no schedule word)
            assert t.core_start - previous.core_start == (561 if t.run.infer else 562)


def test_ports_fit_the_core():
    """The ports the shell wires to the v2 core have the core's widths; the activation word
    addresses the core's activation memory (act_bytes 1000 is no multiple of 8 lanes)."""
    with warnings.catch_warnings():
        # built to compare their ports, never elaborated
        warnings.simplefilter("ignore", UnusedElaboratable)
        for lanes, act_bytes in ((2, 16384), (8, 1000), (32, 16384)):
            build = spec.Build(name="w", dataflow="samples", lanes=lanes, act_bytes=act_bytes,
                               max_batch=20, data_bytes=5000, data_samples=300,
                               features=spec.FEATURES)
            seq, core = EpochSequencer(build), SampleEngine(build, tally=False)
            for mine, theirs in (("core_batch", "batch"), ("core_update_mask", "update_mask"),
                                 ("core_lfsr_seed", "lfsr_seed"), ("core_correct", "correct"),
                                 ("label_wr_addr", "label_wr_addr"),
                                 ("label_wr_data", "label_wr_data"),
                                 ("pred_rd_addr", "pred_rd_addr"),
                                 ("pred_rd_data", "pred_rd_data")):
                assert len(getattr(seq, mine)) == len(getattr(core, theirs)), (lanes, mine)
            assert len(seq.act_wr_addr) == ceil_log2(core.act_words), lanes
            assert 1 << len(seq.act_wr_lane) == lanes
            assert seq.group_lanes == min(lanes, DATA_WORD_BYTES)
            assert len(seq.act_wr_data) == DATA_WORD_BYTES * spec.ACT_BITS
        gc.collect()


def test_refuses_a_build_without_resident_data():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(ValueError, match="build 'plain' has no resident data unit"):
            EpochSequencer(spec.Build(name="plain", dataflow="samples"))
        gc.collect()
