"""The v2 dataflow's programs and their golden executor (ember.dataflow) against the golden
model: the same predictions and the same MAC counts on random networks and batches, and the
nests' address arithmetic."""

import dataclasses

import numpy as np
import pytest

from ember import dataflow, golden, spec

from engine_harness import golden_for, random_step_settings

BUILD = spec.BUILDS["sim"]


def random_case(rng, build=BUILD, max_width=40, max_batch=30):
    layers = [int(rng.integers(1, max_width)) for _ in range(int(rng.integers(2, 5)))]
    batch = int(rng.integers(1, max_batch))
    weights = [rng.integers(-4000, 4000, (n, k)).astype(np.int16)
               for k, n in zip(layers[:-1], layers[1:])]
    shifts = [spec.HIDDEN_SHIFT] * (len(layers) - 2) + [spec.OUTPUT_SHIFT]
    x = rng.integers(0, 256, (batch, layers[0]))
    x[rng.random(x.shape) < 0.3] = 0
    return layers, batch, weights, shifts, x


@pytest.mark.parametrize("seed", range(12))
def test_infer_program_predicts_as_the_golden_model(seed):
    rng = np.random.default_rng(seed)
    layers, batch, weights, shifts, x = random_case(rng)
    g = golden.GoldenModel(BUILD)
    g.configure(layers, shifts)
    g.load_weights(weights)
    mem = dataflow.Memories(BUILD)
    mem.load_network(layers, weights, batch)
    mem.load_inputs(x)
    counts, _ = dataflow.execute(dataflow.infer_program(layers, BUILD, batch, shifts), mem,
                                 batch)
    assert (mem.preds[:batch] == g.infer(x)).all()
    # the MACs and the zero skips are the golden model's; the reads are the dataflow's
    for name in ("mac_forward", "skip_zero", "infer_samples"):
        assert counts[name] == g.counters[name], name
    P, S = BUILD.lanes, dataflow.sample_blocks(BUILD, batch)
    acts = [x]
    a = x
    for w, s in zip(weights, shifts):
        a = golden.requantize(a @ w.T.astype(np.int64), s, relu=True)
        acts.append(a)
    expect_reads = 0
    for w, a in zip(weights, acts):
        n = w.shape[0]
        padded = np.zeros((S * P, a.shape[1]), dtype=bool)
        padded[:batch] = a != 0
        expect_reads += n * int(padded.reshape(S, P, -1).any(axis=1).sum())
    assert counts["weight_reads"] == expect_reads
    assert counts["act_reads"] == sum(w.size for w in weights) * batch
    gv2 = golden.GoldenModel(dataclasses.replace(BUILD, dataflow="samples"))
    gv2.configure(layers, shifts)
    gv2.load_weights(weights)
    gv2.infer(x)
    gv2.counters["act_writes"] -= x.size
    assert {n: counts[n] for n in spec.EXACT_COUNTERS} == \
        {n: gv2.counters[n] for n in spec.EXACT_COUNTERS}


#: The counters the dataflow changes: v2 reads a weight once per sample block, an activation
#: word per step and, in the weight gradient, a dY word per group of spec.GRAD_HOLD inputs
#: (v1: a weight and a dY entry per MAC, an activation per block of outputs). The input
#: batch's act_writes are the memory window's (the bus), not the core's.
DATAFLOW_COUNTERS = ("weight_reads", "act_reads", "act_msb_reads", "grad_lane_reads",
                     "grad_msb_lane_reads", "act_writes")


@pytest.mark.parametrize("seed", range(16))
def test_train_program_steps_as_the_golden_model(seed):
    """A training step's program (SLU mask, zero skipping, PSG absolute and relative, ssProp
    by |dY| and by LFSR, random lr_shift) leaves the golden model's weights bit for bit,
    classifies the same samples right and counts the same events, apart from the reads the
    dataflow changes."""
    rng = np.random.default_rng(100 + seed)
    layers, batch, weights, shifts, x = random_case(rng)
    y = rng.integers(0, layers[-1], batch)
    settings = random_step_settings(rng, len(layers) - 1)
    g = golden_for(BUILD, layers, weights)     # (random_case's shifts are the defaults)
    correct = g.train_batch(x, y, settings)
    _, mem, counts, got_correct = dataflow.train_step(BUILD, layers, weights, shifts, x, y,
                                                      settings)
    assert got_correct == correct
    for got, want in zip(mem.read_weights(layers, batch), g.weights):
        assert (got == want).all()
    for name in spec.EXACT_COUNTERS:
        if name not in DATAFLOW_COUNTERS:
            assert counts[name] == g.counters[name], name
    # the golden model's closed-form counts of the sample-lane dataflow are the executor's,
    # the input batch's act_writes aside (the memory window's)
    gv2 = golden.GoldenModel(dataclasses.replace(BUILD, dataflow="samples"))
    gv2.configure(layers, shifts)
    gv2.load_weights(weights)
    gv2.train_batch(x, y, settings)
    gv2.counters["act_writes"] -= x.size
    assert {n: counts[n] for n in spec.EXACT_COUNTERS} == \
        {n: gv2.counters[n] for n in spec.EXACT_COUNTERS}


def test_a_program_longer_than_the_program_memory_is_refused():
    ph = dataflow.infer_program([4, 3, 2], BUILD, 8, [spec.HIDDEN_SHIFT, spec.OUTPUT_SHIFT])
    with pytest.raises(spec.ConfigError, match=f"the engine holds {BUILD.program_words}"):
        dataflow.encode(ph * 40, BUILD)
    # the build's figure, not a global one: half the memory refuses half as long a program
    small = dataclasses.replace(BUILD, name="half", program_words=BUILD.program_words // 2)
    longer = ph * (small.program_words // (len(ph) * dataflow.PHASE_WORDS) + 1)
    with pytest.raises(spec.ConfigError, match=f"the engine holds {small.program_words}"):
        dataflow.encode(longer, small)
    assert len(dataflow.encode(longer, BUILD)) > small.program_words


def test_a_network_too_big_for_the_memories_is_refused():
    with pytest.raises(spec.ConfigError,
                       match="64-64-64 at batch 64 needs 256 gradient words; the build has 128"):
        dataflow.train_program([64, 64, 64], dataclasses.replace(BUILD, grad_words=128), 64,
                               [spec.HIDDEN_SHIFT, spec.OUTPUT_SHIFT])


@pytest.mark.parametrize("seed", range(6))
def test_decode_gives_back_the_encoded_phases(seed):
    """The program memory's words decode to the phases they encode (strides recovered from
    the deltas), for train programs with and without PSG's relative pass, and infer."""
    rng = np.random.default_rng(300 + seed)
    layers, batch, weights, shifts, x = random_case(rng)
    for phases in (dataflow.train_program(layers, BUILD, batch, shifts),
                   dataflow.train_program(layers, BUILD, batch, shifts, psg_relative=True),
                   dataflow.infer_program(layers, BUILD, batch, shifts)):
        assert dataflow.decode(dataflow.encode(phases, BUILD)) == phases


def test_decode_refuses_unknown_kinds_and_truncated_programs():
    words = dataflow.encode(dataflow.infer_program([4, 3, 2], BUILD, 5,
                                                   [spec.HIDDEN_SHIFT, spec.OUTPUT_SHIFT]), BUILD)
    with pytest.raises(spec.ConfigError, match="without an end phase"):
        dataflow.decode(words[:-dataflow.HEADER_WORDS])
    with pytest.raises(spec.ConfigError, match="inside the phase at word 0"):
        dataflow.decode(words[:10])
    bad = list(words)
    bad[0] = (bad[0] & ~0xF) | 0xF
    with pytest.raises(spec.ConfigError, match="word 0: phase kind 15 is not one of"):
        dataflow.decode(bad)


def test_a_network_whose_program_does_not_fit_is_refused_before_it_is_written():
    """spec.check_network refuses, naming the words and the limit, a network whose largest
    program (relative PSG's phases) would not fit the program memory; where it fits, program_words_needed is that program's length."""
    build = spec.BUILDS["sim"]
    shifts = [0] * 6
    fits = [16] * 7
    spec.check_network(fits, build, 13)
    words = dataflow.encode(dataflow.train_program(fits, build, 13, shifts, True), build)
    assert dataflow.program_words_needed(fits, build, 13) == len(words)
    assert dataflow.program_words_needed(fits, build) >= len(words)
    with pytest.raises(spec.ConfigError, match=r"needs a program of 1191 words; build 'sim' "
                                               r"holds 1024"):
        spec.check_network([16] * 8, build, 13)
    # the limit is the build's: the iCEBreaker's 512 words as v2 runs it hold digits'
    # 64-32-10 (263 words) and, with no PSG unit (no psg_max phases), its largest networks
    # (three 63-wide layers, 495); with the PSG unit those would need 669
    ice = dataclasses.replace(spec.BUILDS["icebreaker"], dataflow="samples",
                              weight_words=spec.SPRAM_WORDS // spec.BUILDS["icebreaker"].lanes)
    assert ice.program_words == 512 and "psg" not in ice.features
    spec.check_network([64, 32, 10], ice)
    assert dataflow.program_words_needed([64, 32, 10], ice) == 263
    spec.check_network([63, 63, 63, 64], ice, 3)
    assert dataflow.program_words_needed([63, 63, 63, 64], ice) == 495
    ice_psg = dataclasses.replace(ice, features=ice.features + ("psg",))
    assert dataflow.program_words_needed([64, 32, 10], ice_psg) == 321
    with pytest.raises(spec.ConfigError, match=r"needs a program of 669 words; build "
                                               r"'icebreaker' holds 512"):
        spec.check_network([63, 63, 63, 10], ice_psg, 3)


def _v2_builds():
    """Every engine-v2 build the boards and the simulated board run (the iCEBreaker's as
    its --dataflow samples variant)."""
    builds = [b for b in spec.BUILDS.values() if b.dataflow == "samples"]
    return builds + [spec.with_dataflow(spec.BUILDS["icebreaker"], "samples")]


@pytest.mark.parametrize("build", _v2_builds(), ids=lambda b: b.name)
def test_compiled_bounds_fit_the_cores_counters(build):
    """dataflow.max_bound bounds every program the host compiles: the widest networks the
    build holds (every layer as wide as fits, up to max_width, with 10 classes or as many as
    the width) at the largest batch that fits and at 1, train (PSG relative) and infer. The
    core's bound_bits hold max_bound, and no more than twice it."""
    top = dataflow.max_bound(build)
    assert top <= dataflow.bound_limit(build) < 2 * top
    seen = 0
    for depth in range(1, build.max_layers + 1):
        for classes in (10, build.max_width):
            width = build.max_width
            layers = lambda w: [w] * depth + [min(classes, w)]
            while width > 1 and not _fits(layers(width), build, 1):
                width //= 2
            if not _fits(layers(width), build, 1):
                continue
            batch = build.max_batch
            while not _fits(layers(width), build, batch):
                batch //= 2
            shifts = [spec.HIDDEN_SHIFT] * (depth - 1) + [spec.OUTPUT_SHIFT]
            for b in {1, batch}:
                for phases in (dataflow.infer_program(layers(width), build, b, shifts),
                               dataflow.train_program(layers(width), build, b, shifts,
                                                      "psg" in build.features)):
                    for ph in phases:
                        assert max(ph.bounds) <= top, (layers(width), b, ph.kind, ph.bounds)
                        seen = max(seen, max(ph.bounds))
    assert seen > top // 4, (seen, top)


def _fits(layers, build, batch):
    try:
        dataflow.check_fits(layers, build, batch)
        spec.check_network(layers, build, batch)
    except spec.ConfigError:
        return False
    return True
