"""Engine v2's infer slice (ember_hw.sample_engine.SampleEngine) in the Amaranth simulator
against its golden twin ember.dataflow.execute and the golden model: on random networks,
batches (a partial last sample block included) and data, the predictions are
GoldenModel.infer's and every event count is the executor's; a program the engine must
refuse (an address outside its memory, a bound of 0 or past the counters, an unknown kind,
a width past K's and N's registers) stops with `fault`
before the access."""

import dataclasses

import numpy as np
import pytest

from ember import dataflow, golden, program, spec
from ember_hw.sample_engine import EVENTS, SampleEngine
from ember_sim.sample_core import run_command

from engine_harness import golden_for, random_step_settings, run_testbench

SMALL = spec.Build(name="small", lanes=4, weight_words=256, act_bytes=512, grad_words=64,
                   scratch_entries=256, max_batch=16, max_layers=4, max_width=32)



#: How far dataflow.program_cycle_bound may lie above the cycles of a dense step or an
#: inference (measured: 0.1 to 1.6 % above, the runner's and the units' waits taken at
#: their longest).
DENSE_BOUND_OVER = 1.03


def fits(layers, build, batch):
    try:
        dataflow.check_fits(layers, build, batch)
        return True
    except spec.ConfigError:
        return False


def random_case(rng, build):
    layers = [int(rng.integers(2, build.max_width + 1))
              for _ in range(int(rng.integers(2, build.max_layers + 2)))]
    batch = int(rng.integers(1, build.max_batch + 1))
    S = dataflow.sample_blocks(build, batch)
    # shrink until it fits the small build's memories
    while not fits(layers, build, batch):
        layers = [max(2, v // 2) for v in layers]
    # a third of the cases with weights over the whole int16 range: the largest sums (the
    # accumulators' widths)
    span = 1 << 15 if rng.random() < 0.3 else 6000
    weights = [rng.integers(-span, span, (n, k)).astype(np.int16)
               for k, n in zip(layers[:-1], layers[1:])]
    shifts = [spec.HIDDEN_SHIFT] * (len(layers) - 2) + [spec.OUTPUT_SHIFT]
    x = rng.integers(0, 256, (batch, layers[0]))
    x[rng.random(x.shape) < 0.3] = 0
    return layers, batch, weights, shifts, x


async def load_and_run(ctx, dut, words, layers, weights, batch, x, build, y=None,
                       settings=None):
    """ember_sim.sample_core.run_command, as (preds, events, cycles) for infer and (weights,
    events, cycles, correct) for train."""
    out = await run_command(ctx, dut, build, words, layers, weights, batch, x, y, settings)
    if y is None:
        return out["preds"], out["events"], out["cycles"]
    return out["weights"], out["events"], out["cycles"], out["correct"]


def check_infer(rng, larger=False):
    """An inference of random_case on SMALL in the Amaranth simulator against the golden
    model's predictions and the executor's events; `larger`: its program compiled for a
    random batch at least as large (it runs every batch up to that). Returns the engine's
    outputs, the program and the batch."""
    layers, batch, weights, shifts, x = random_case(rng, SMALL)
    capacity = int(rng.integers(batch, SMALL.max_batch + 1)) if larger else batch
    while not fits(layers, SMALL, capacity):
        layers = [max(2, v // 2) for v in layers]
        weights = [w[:n, :k] for w, k, n in zip(weights, layers[:-1], layers[1:])]
        x = x[:, :layers[0]]
    g = golden.GoldenModel(SMALL)
    g.configure(layers, shifts)
    g.load_weights(weights)
    expect = g.infer(x)
    mem = dataflow.Memories(SMALL)
    mem.load_network(layers, weights, batch)
    mem.load_inputs(x)
    # the events of the program compiled for the batch itself
    counts, _ = dataflow.execute(dataflow.infer_program(layers, SMALL, batch, shifts), mem,
                                 batch)
    phases = dataflow.infer_program(layers, SMALL, capacity, shifts)
    dut = SampleEngine(SMALL)
    out = {}

    async def bench(ctx):
        out["preds"], out["events"], out["cycles"] = await load_and_run(
            ctx, dut, dataflow.encode(phases, SMALL), layers, weights, batch, x, SMALL)
        out["fault"] = ctx.get(dut.fault)

    run_testbench(dut, bench)
    assert not out["fault"]
    assert out["preds"] == [int(v) for v in expect], (layers, batch, capacity)
    assert out["events"] == {name: counts[name] for name in EVENTS}
    return out, phases, batch


@pytest.mark.parametrize("seed", range(6))
def test_infer_matches_the_executor_and_the_golden_model(seed):
    out, phases, batch = check_infer(np.random.default_rng(seed))
    # the watchdog's bound: an inference's every term is exact but the writeback's wait
    bound = dataflow.program_cycle_bound(phases, SMALL, batch)
    assert out["cycles"] <= bound <= DENSE_BOUND_OVER * out["cycles"], (out["cycles"], bound)


def fault_after(phases, build, layers, weights, batch, x):
    dut = SampleEngine(build)
    out = {}

    async def bench(ctx):
        out["preds"], out["events"], _ = await load_and_run(
            ctx, dut, dataflow.encode(phases, build), layers, weights, batch, x, build)
        out["fault"] = ctx.get(dut.fault)

    run_testbench(dut, bench)
    return out


def test_a_program_that_leaves_a_memory_faults_before_the_access():
    rng = np.random.default_rng(3)
    layers, batch, weights, shifts, x = [8, 4, 3], 5, None, None, None
    weights = [rng.integers(-999, 999, (n, k)).astype(np.int16)
               for k, n in zip(layers[:-1], layers[1:])]
    shifts = [spec.HIDDEN_SHIFT, spec.OUTPUT_SHIFT]
    x = rng.integers(1, 256, (batch, layers[0]))
    phases = dataflow.infer_program(layers, SMALL, batch, shifts)
    # the first layer's outputs written past the end of the activation memory
    bad = phases[0]
    bases = dict(bad.nest.bases, o=SMALL.act_bytes // SMALL.lanes - 2)
    phases[0] = dataclasses.replace(bad, nest=program.Nest(bad.bounds, bases, bad.nest.strides))
    out = fault_after(phases, SMALL, layers, weights, batch, x)
    assert out["fault"]
    # nothing after the faulting phase ran: no prediction was made
    assert out["events"]["infer_samples"] == 0


@pytest.mark.parametrize("damage", ["zero_bound", "unknown_kind", "wide_bound", "wide_header"])
def test_a_malformed_phase_faults(damage):
    """A bound of 0, a kind the core does not know, a bound past what its counters hold
    (dataflow.bound_limit: the first phase's outermost level, which steps nothing, so only
    the check stops it) and a layer width past K's and N's registers: the first phase
    faults and nothing runs."""
    layers, batch = [6, 5, 4], 3
    rng = np.random.default_rng(4)
    weights = [rng.integers(-999, 999, (n, k)).astype(np.int16)
               for k, n in zip(layers[:-1], layers[1:])]
    x = rng.integers(0, 256, (batch, layers[0]))
    phases = dataflow.infer_program(layers, SMALL, batch, [spec.HIDDEN_SHIFT, spec.OUTPUT_SHIFT])
    words = dataflow.encode(phases, SMALL)
    if damage == "zero_bound":
        words[dataflow.HEADER_WORDS] &= ~0xFFFF  # level 0's bound of the first phase
    elif damage == "wide_bound":
        assert phases[0].bounds[0] == 1 and dataflow.bound_limit(SMALL) < program.MAX_BOUND
        words[dataflow.HEADER_WORDS] = ((words[dataflow.HEADER_WORDS] & ~0xFFFF)
                                        | (dataflow.bound_limit(SMALL) + 1))
    elif damage == "wide_header":
        words[1] |= 1 << SMALL.max_width.bit_length()      # the outputs' field, N
    else:
        words[0] = (words[0] & ~0xF) | 0xE  # a kind the engine does not know
    dut = SampleEngine(SMALL)
    out = {}

    async def bench(ctx):
        out["preds"], out["events"], _ = await load_and_run(ctx, dut, words, layers, weights,
                                                            batch, x, SMALL)
        out["fault"] = ctx.get(dut.fault)

    run_testbench(dut, bench)
    assert out["fault"]
    assert out["events"]["mac_forward"] == 0 and out["events"]["infer_samples"] == 0


#: Builds of 2, 4 and 8 lanes (the batch fills one to eight sample blocks), and of 16 and
#: 32 (one or two blocks), whose dX drain writes 2 and 4 lanes a cycle (Build.drain_lanes).
LANE_BUILDS = {P: spec.Build(name=f"lanes{P}", lanes=P, weight_words=2048 // P,
                             act_bytes=max(1024, 64 * P), grad_words=128, scratch_entries=512,
                             max_batch=max(16, 2 * P), max_layers=4, max_width=32)
               for P in (2, 4, 8, 16, 32)}


#: A build whose weights are in one SPRAM (single port): the core's single-port schedule on
#: the generic memory, whose `conflict` flag records a cycle that reads and writes weights.
SPRAM_BUILD = dataclasses.replace(LANE_BUILDS[2], name="spram2", dataflow="samples",
                                  weight_spram=True)
#: ... with the iCEBreaker build's units: zero skipping and SLU, no PSG or ssProp
ICE_UNITS_BUILD = dataclasses.replace(SPRAM_BUILD, name="spram2-lean",
                                      features=("zero_skip", "slu"))


def check_train_step(build, rng, batch=None, settings=None, layers=None, capacity=None,
                     weights=None):
    """A training step of random_case on `build` (at `batch`, of `layers` if given, or of the
    network of `weights`; its program compiled for `capacity`, by default the batch) in the
    Amaranth simulator against the golden model and the executor, and its cycles against the
    watchdog's bound; returns the engine's outputs (and `conflict`: its weight memory's)."""
    drawn, _, drawn_weights, shifts, x = random_case(rng, build)
    if weights is not None:
        layers = [weights[0].shape[1]] + [w.shape[0] for w in weights]
    elif layers is not None:
        weights = [rng.integers(-6000, 6000, (n, k)).astype(np.int16)
                   for k, n in zip(layers[:-1], layers[1:])]
    else:
        weights = drawn_weights
    if layers is not None:
        shifts = [spec.HIDDEN_SHIFT] * (len(layers) - 2) + [spec.OUTPUT_SHIFT]
    layers = layers or drawn
    while batch is not None and not fits(layers, build, max(batch, capacity or 0)):
        layers = [max(2, v // 2) for v in layers]
        weights = [w[:n, :k] for w, k, n in zip(weights, layers[:-1], layers[1:])]
    if batch is not None or x.shape[1] != layers[0]:
        x = rng.integers(0, 256, (batch or x.shape[0], layers[0]))
    batch = x.shape[0]
    y = rng.integers(0, layers[-1], batch)
    settings = settings or random_step_settings(rng, len(layers) - 1)
    # the settings a build without the PSG or ssProp unit accepts (the host refuses others)
    if "psg" not in build.features:
        settings = dataclasses.replace(settings, psg=False)
    if "ssprop" not in build.features:
        settings = dataclasses.replace(settings, keep_q8=spec.KEEP_ONE, ssprop_random=False)
    g = golden_for(build, layers, weights)     # (random_case's shifts are the defaults)
    correct = g.train_batch(x, y, settings)
    phases, _, counts, _ = dataflow.train_step(build, layers, weights, shifts, x, y, settings,
                                               capacity)
    if capacity is not None:        # the events do not depend on the program's capacity
        assert dataflow.train_step(build, layers, weights, shifts, x, y, settings)[2] == counts
    dut = SampleEngine(build, spram=False)
    out = {}

    async def bench(ctx):
        out["weights"], out["events"], out["cycles"], out["correct"] = await load_and_run(
            ctx, dut, dataflow.encode(phases, build), layers, weights, batch, x, build,
            y=y, settings=settings)
        out["fault"] = ctx.get(dut.fault)
        out["conflict"] = ctx.get(dut.wmem.conflict)

    run_testbench(dut, bench)
    assert not out["fault"]
    assert out["correct"] == correct
    for got, want in zip(out["weights"], g.weights):
        assert (got == want).all(), (layers, batch, settings)
    diff = {n: (out["events"][n], counts[n]) for n in EVENTS if out["events"][n] != counts[n]}
    assert not diff, (layers, batch, settings)
    # the watchdog's bound (dataflow.program_cycle_bound): for the step's settings, and for
    # every setting; close for a dense step
    own = dataflow.program_cycle_bound(phases, build, batch, settings)
    assert out["cycles"] <= own <= dataflow.program_cycle_bound(phases, build, batch), \
        (out["cycles"], own, layers, batch, settings)
    dense = dataflow.program_cycle_bound(phases, build, batch, spec.StepSettings(
        update_mask=settings.update_mask, zero_skip=settings.zero_skip, lr_shift=4))
    if dense == own and capacity is None:
        assert own <= DENSE_BOUND_OVER * out["cycles"], (out["cycles"], own)
    out["layers"] = layers
    return out


@pytest.mark.parametrize("lanes", sorted(LANE_BUILDS))
@pytest.mark.parametrize("seed", range(4))
def test_train_step_matches_the_executor_and_the_golden_model(seed, lanes):
    """A training step on random networks, batches and settings (SLU, zero skipping, PSG
    absolute and relative, ssProp by |dY| and LFSR): the golden model's weights and correct
    count, and every event the executor counts."""
    check_train_step(LANE_BUILDS[lanes], np.random.default_rng(200 + 10 * seed + lanes))


@pytest.mark.parametrize("lanes", [2, 4, 8])
@pytest.mark.parametrize("seed", range(2))
def test_train_step_without_ssprop_counts_its_kept_channels(seed, lanes):
    """A build without the ssProp unit has no kept-list memory: the kept channel's j and
    j * K are counted beside its index (SampleEngine.kept_list). Random networks, batches
    and settings: the golden model's weights and every event, as with the list."""
    build = dataclasses.replace(LANE_BUILDS[lanes], name=f"lanes{lanes}-dense",
                                features=("zero_skip", "slu", "psg"))
    check_train_step(build, np.random.default_rng(700 + 10 * seed + lanes))


@pytest.mark.parametrize("seed", range(4))
def test_a_program_runs_every_batch_up_to_the_one_it_was_compiled_for(seed):
    """One program serves a short batch (an epoch's last, or an evaluation's remainder): a
    train program compiled for a larger batch (more sample blocks, or the same blocks with
    more lanes) runs a smaller one with the golden model's weights and correct count and the
    events of a program compiled for that batch (the lanes past it are dead:
    dataflow.block_lanes, step_samples), within the cycle bound at that batch."""
    rng = np.random.default_rng(500 + seed)
    build = LANE_BUILDS[[4, 2, 8, 4][seed]]
    P = build.lanes
    capacity = int(rng.integers(P + 1, build.max_batch + 1))
    batch = int(rng.integers(1, capacity + 1)) if seed % 2 else capacity - 1
    out = check_train_step(build, rng, batch=batch, capacity=capacity)
    assert out["events"]["samples"] == batch, (out["layers"], batch, capacity)


@pytest.mark.parametrize("seed", range(2))
def test_an_infer_program_runs_every_batch_up_to_the_one_it_was_compiled_for(seed):
    """An infer program compiled for a larger batch predicts a smaller one as the golden
    model does, with the events of a program compiled for it."""
    out, phases, batch = check_infer(np.random.default_rng(600 + seed), larger=True)
    assert out["cycles"] <= dataflow.program_cycle_bound(phases, SMALL, batch)


@pytest.mark.parametrize("seed", range(4))
def test_spram_schedule_never_reads_and_writes_weights_in_one_cycle(seed):
    """A weight_spram build's core (its single-port schedule, on the generic memory the
    Amaranth simulator runs): bit-exact as any build, and no cycle reads and writes the
    weights (the SPRAM would do one of them). Batches of one sample block (every
    weight-gradient step an update: the updates wait) and of several, dense and with every
    unit's settings, on a build with every unit and on one with the iCEBreaker's."""
    rng = np.random.default_rng(300 + seed)
    batch = [SPRAM_BUILD.lanes, SPRAM_BUILD.lanes - 1, 7, 16][seed]
    settings = spec.StepSettings(lr_shift=4) if seed % 2 else None
    build = SPRAM_BUILD if seed < 2 else ICE_UNITS_BUILD
    out = check_train_step(build, rng, batch=batch, settings=settings)
    assert out["events"]["weight_writes"] > 0
    assert out["conflict"] == 0, (out["layers"], batch)


def test_spram_schedule_costs_cycles_only_on_that_build():
    """The same dense step on the same sizes with and without weight_spram: the weights
    and events agree; one sample block costs the single-port build cycles (its updates
    wait), several blocks of full input groups cost none."""
    cycles = {}
    for spram in (False, True):
        build = dataclasses.replace(SPRAM_BUILD, weight_spram=spram)
        for batch in (2, 8):
            rng = np.random.default_rng(7)
            out = check_train_step(build, rng, batch=batch, layers=[8, 12, 4],
                                   settings=spec.StepSettings(lr_shift=4))
            cycles[spram, batch] = out["cycles"]
    assert cycles[True, 2] > cycles[False, 2]
    assert cycles[True, 8] == cycles[False, 8]


def test_a_layer_as_wide_as_the_build_ends_its_kept_list():
    """A select phase over max_width channels on a build whose max_width is 2**b - 1 ends:
    its kept-list walk counts to N + 1 (a counter of range(max_width + 1) wrapped before it
    got there, and the run never ended). The step matches the golden model."""
    build = spec.Build(name="w15", dataflow="samples", lanes=2, weight_words=256,
                       act_bytes=256, grad_words=64, scratch_entries=64, max_batch=4,
                       max_layers=2, max_width=15)
    layers, batch = [6, 15, 3], 3
    rng = np.random.default_rng(15)
    weights = golden.init_weights(layers, 15)
    x = rng.integers(0, 256, (batch, layers[0]))
    y = rng.integers(0, layers[-1], batch)
    settings = spec.StepSettings(zero_skip=True, keep_q8=128)
    shifts = [spec.HIDDEN_SHIFT, spec.OUTPUT_SHIFT]
    phases = dataflow.train_program(layers, build, batch, shifts)
    g = golden_for(build, layers, weights)
    correct = g.train_batch(x, y, settings)
    dut = SampleEngine(build)
    out = {}

    async def bench(ctx):
        out.update(await run_command(ctx, dut, build, dataflow.encode(phases, build), layers,
                                     weights, batch, x, y, settings, max_cycles=50_000))

    run_testbench(dut, bench)
    assert not out["fault"] and out["correct"] == correct
    assert out["cycles"] <= dataflow.program_cycle_bound(phases, build, batch, settings)
    for got, want in zip(out["weights"], g.weights):
        assert (got == want).all()


@pytest.mark.parametrize("build", [SPRAM_BUILD, ICE_UNITS_BUILD], ids=lambda b: b.name)
def test_block_ram_accumulators_take_the_sum_written_in_their_read_cycle(build):
    """A weight_spram build keeps the weight gradient's accumulators in a block RAM, read a
    cycle ahead (SampleEngine._accumulator). Inputs 5 and 9 end in a group of one input,
    whose accumulator is read in the cycle the block before writes it, for each of the
    batch's 4 sample blocks: the written sum must be taken, not the memory's older word."""
    rng = np.random.default_rng(41)
    out = check_train_step(build, rng, batch=4 * build.lanes - 1, layers=[5, 9, 3],
                           settings=spec.StepSettings(lr_shift=2))
    assert out["events"]["weight_writes"] > 0


def test_a_psg_phase_faults_on_a_build_without_the_psg_unit():
    """A build without PSG runs no psg_max phase (dataflow.build_kinds): a train program with
    them (relative PSG's, compiled for the same sizes with the unit, since the compiler
    refuses it without) is refused by verify at the first, as a kind the build does not
    run, and the core faults there before any weight is written, as at an unknown kind."""
    build, layers, batch = ICE_UNITS_BUILD, [6, 5, 4], 4
    rng = np.random.default_rng(11)
    weights = [rng.integers(-999, 999, (n, k)).astype(np.int16)
               for k, n in zip(layers[:-1], layers[1:])]
    x, y = rng.integers(0, 256, (batch, layers[0])), rng.integers(0, layers[-1], batch)
    shifts = [spec.HIDDEN_SHIFT, spec.OUTPUT_SHIFT]
    with pytest.raises(spec.ConfigError, match="relative PSG needs the psg unit"):
        dataflow.train_program(layers, build, batch, shifts, True)
    phases = dataflow.train_program(layers, SPRAM_BUILD, batch, shifts, True)
    first_psg = [ph.kind for ph in phases].index("psg_max")
    words = dataflow.encode(phases, build)
    assert dataflow.verify(words, SPRAM_BUILD) is None
    index, check, reason = dataflow.verify_verdict(words, build)
    assert (index, check) == (first_psg, "kind"), reason
    assert f"kind {dataflow.KINDS['psg_max']} is not one of" in reason
    dut = SampleEngine(build, spram=False)
    out = {}

    async def bench(ctx):
        out["weights"], out["events"], _, _ = await load_and_run(
            ctx, dut, words, layers, weights, batch, x, build, y=y,
            settings=spec.StepSettings(lr_shift=2))
        out["fault"] = ctx.get(dut.fault)

    run_testbench(dut, bench)
    assert out["fault"]
    assert out["events"]["mac_forward"] > 0 and out["events"]["weight_writes"] == 0
    for got, want in zip(out["weights"], weights):
        assert (got == want).all()


@pytest.mark.parametrize("build", [ICE_UNITS_BUILD, LANE_BUILDS[8]], ids=lambda b: b.name)
def test_weights_at_their_ends_stay_unwritten_where_the_step_passes_them(build):
    """Weights at +-(2**15 - 1) and -2**15 with large gradients (lr_shift 0): the update
    saturates, and a weight that its step would push past the end it is already at keeps its
    value and is not written (the update's `changed`, formed beside the saturation); the
    golden model's weights and weight_writes."""
    rng = np.random.default_rng(17)
    top = (1 << (spec.WEIGHT_BITS - 1)) - 1
    weights = [rng.choice([top, -top - 1, top - 1, 0, -top], (n, k)).astype(np.int16)
               for k, n in ((6, 5), (5, 4))]
    out = check_train_step(build, rng, batch=7, weights=weights,
                           settings=spec.StepSettings(lr_shift=0))
    changed = sum(int((w != o).sum()) for w, o in zip(out["weights"], weights))
    assert 0 < changed and out["events"]["weight_writes"] == changed
    assert any(((w == o) & (np.abs(o.astype(int)) >= top)).any()
               for w, o in zip(out["weights"], weights))
