"""dataflow.verify, the static check of a v2 program before a run (the golden twin of the
shell's program checker): every program the host compiles passes it; a program it refuses
names the field, its value and its limit; a damaged program it accepts runs in the executor
without leaving a memory, and in the core (the Amaranth simulator) without a fault."""

import dataclasses
import functools
import itertools

import numpy as np
import pytest

from ember import dataflow, spec

from ember_hw.sample_engine import SampleEngine
from ember_sim.sample_core import simulate

from engine_harness import random_step_settings
from test_sample_engine import LANE_BUILDS, random_case

#: The test builds of 2, 4 and 8 lanes and every named build (verify reads only the sizes).
BUILDS = dict({b.name: b for b in LANE_BUILDS.values()}, **spec.BUILDS)


def shifts_for(layers):
    return [spec.HIDDEN_SHIFT] * (len(layers) - 2) + [spec.OUTPUT_SHIFT]


def compiled_programs(rng, build, cases):
    """(what, words) of random networks' infer and train programs (PSG relative and not, on
    a build with the PSG unit) on `build`, as tests/test_sample_engine.py's random_case draws
    them; a program longer than the program memory, which encode refuses, is left out."""
    for _ in range(cases):
        layers, batch, _, shifts, _ = random_case(rng, build)
        programs = {"infer": dataflow.infer_program(layers, build, batch, shifts)}
        for relative in (False, True)[:2 if "psg" in build.features else 1]:
            programs["train", relative] = dataflow.train_program(layers, build, batch, shifts,
                                                                 psg_relative=relative)
        for kind, phases in programs.items():
            try:
                words = dataflow.encode(phases, build)
            except spec.ConfigError:
                assert len(phases) * dataflow.PHASE_WORDS > build.program_words - 2
                continue
            yield (layers, batch, kind), words


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_every_compiled_program_verifies(name):
    build = BUILDS[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    programs = 0
    for what, words in compiled_programs(rng, build, 60):
        assert dataflow.verify(words, build) is None, what
        programs += 1
    assert programs >= 60


@pytest.mark.parametrize("lanes", sorted(LANE_BUILDS))
def test_the_largest_networks_that_fit_verify(lanes):
    """Networks that fill a memory (the widest layers, the largest batch, a batch of one,
    a partial last sample block) are at the limits verify compares with."""
    build = LANE_BUILDS[lanes]
    W = build.max_width
    checked = 0
    for layers in ([W, W], [W, W, W], [W, 2], [2, W, 2], [W] * (build.max_layers + 1)):
        for batch in (1, build.lanes - 1, build.lanes + 1, build.max_batch):
            if batch < 1:
                continue
            for train in (False, True):
                try:
                    dataflow.check_fits(layers, build, batch, train=train)
                except spec.ConfigError:
                    continue
                if train:
                    phases = dataflow.train_program(layers, build, batch, shifts_for(layers),
                                                    psg_relative="psg" in build.features)
                else:
                    phases = dataflow.infer_program(layers, build, batch, shifts_for(layers))
                words = dataflow.encode(phases, build)
                assert dataflow.verify(words, build) is None, (layers, batch, train)
                checked += 1
    assert checked >= 8


# ---------------------------------------------------------------- hostile programs
class Bounded(np.ndarray):
    """An array that refuses an index outside it (numpy wraps a negative one and cuts a
    slice at the end silently): the executor's memories, so that a program leaving one is
    seen."""

    def _check(self, key):
        for axis, k in enumerate(key if isinstance(key, tuple) else (key,)):
            size = self.shape[axis]
            if isinstance(k, (int, np.integer)) and not 0 <= k < size:
                raise IndexError(f"index {k} outside 0..{size - 1}")
            if isinstance(k, slice):
                for end in (k.start, k.stop):
                    if end is not None and not 0 <= end <= size:
                        raise IndexError(f"slice end {end} outside 0..{size}")

    def __getitem__(self, key):
        self._check(key)
        part = super().__getitem__(key)
        # what is read from a memory is a plain array (only the memory checks its indices)
        return part.view(np.ndarray) if isinstance(part, np.ndarray) else part

    def __setitem__(self, key, value):
        self._check(key)
        super().__setitem__(key, value)


def bounded_memories(build):
    mem = dataflow.Memories(build)
    for name in ("weights", "acts", "grads", "scratch", "labels", "preds"):
        setattr(mem, name, getattr(mem, name).view(Bounded))
    return mem


def test_bounded_memories_refuse_what_numpy_wraps():
    mem = bounded_memories(LANE_BUILDS[4])
    with pytest.raises(IndexError):
        mem.weights[-1]
    with pytest.raises(IndexError):
        mem.grads[len(mem.grads), 0]
    with pytest.raises(IndexError):
        mem.scratch[len(mem.scratch) - 2:len(mem.scratch) + 2] = 0
    mem.grads[len(mem.grads) - 1, 3] = 5
    assert mem.grads[len(mem.grads) - 1][3] == 5


#: Header fields and the values damage draws for them (besides neighbours of the old one).
HEADER_LIMITS = {"shift": lambda b: spec.FORWARD_SHIFT_MAX,
                 "layer": lambda b: b.max_layers - 1, "outputs": lambda b: b.max_width,
                 "inputs": lambda b: b.max_width}


def _near(rng, value, limit=None):
    """A value near `value` (off by one, doubled, halved, negated), near `limit`, or 0."""
    options = [value + 1, value - 1, 2 * value, value // 2, -value, 0,
               value + int(rng.integers(-40, 41))]
    if limit is not None:
        options += [limit - 1, limit, limit + 1]
    return int(rng.choice(options))


def damage(rng, words, build):
    """A copy of a compiled program's `words` with one field of one phase changed at random:
    (the copy, what was changed)."""
    words = list(words)
    phase = int(rng.integers((len(words) - dataflow.HEADER_WORDS) // dataflow.PHASE_WORDS))
    at = phase * dataflow.PHASE_WORDS
    field = rng.choice(["base", "delta", "bound", "kind", "header"])
    mask = dataflow.WORD_MASK
    gens = dataflow.GENERATORS
    g = int(rng.integers(len(gens)))
    at_g = at + dataflow.HEADER_WORDS + dataflow.BOUND_WORDS + g * (1 + dataflow.LEVELS)
    if field == "base":
        # near the old base, near the end of the generator's memory, or anywhere in it
        kind = dataflow.KIND_NAMES[words[at] & 0xF]
        limit = dataflow.limits(kind, build)[gens[g]]
        base = _near(rng, words[at_g], limit) if rng.random() < 0.6 else rng.integers(limit)
        words[at_g] = int(base) & mask
        what = (phase, f"base {gens[g]}", words[at_g])
    elif field == "delta":
        level = int(rng.integers(dataflow.LEVELS))
        at_d = at_g + 1 + level
        words[at_d] = _near(rng, dataflow._signed(words[at_d])) & mask
        what = (phase, f"delta {gens[g]}{level}", dataflow._signed(words[at_d]))
    elif field == "bound":
        level = int(rng.integers(dataflow.LEVELS))
        at_b, shift = at + dataflow.HEADER_WORDS + level // 2, dataflow.BOUND_BITS * (level % 2)
        old = (words[at_b] >> shift) & 0xFFFF
        # a small bound: a large one over a level that steps nothing only makes the walk long
        new = int(rng.integers(0, 3 * old + 4))
        words[at_b] = (words[at_b] & ~(0xFFFF << shift)) | (new << shift)
        what = (phase, f"bound {level}", new)
    elif field == "kind":
        code = int(rng.integers(16))
        words[at] = (words[at] & ~0xF) | code
        what = (phase, "kind", code)
    else:
        name = str(rng.choice(list(HEADER_LIMITS)))
        w, off, width = dataflow.HEADER_FIELDS[name]
        old = (words[at + w] >> off) & ((1 << width) - 1)
        new = _near(rng, old, HEADER_LIMITS[name](build) + 1) & ((1 << width) - 1)
        words[at + w] = (words[at + w] & ~(((1 << width) - 1) << off)) | (new << off)
        what = (phase, name, new)
    return words, what


#: Small builds of 2, 4 and 8 lanes for the hostile programs: the networks that fit are
#: near the memories' ends, and the executor walks them fast.
TIGHT_BUILDS = {P: spec.Build(name=f"tight{P}", lanes=P, weight_words=384 // P, act_bytes=256,
                              grad_words=48, scratch_entries=160, max_batch=12, max_layers=3,
                              max_width=12) for P in (2, 4, 8)}


@functools.lru_cache
def generator_bits(build):
    """SampleEngine.gen_bits: each generator's address width in the core."""
    engine = SampleEngine(build, tally=False)
    engine._MustUse__silence = True            # built for its widths, never elaborated
    return engine.gen_bits


def core_deltas(words, at, build):
    """The bases and deltas of the phase at word `at` as the core's registers hold them:
    truncated to each generator's width (generator_bits; a delta one bit wider, signed)."""
    bits = generator_bits(build)
    bases, deltas = {}, {}
    for g_i, g in enumerate(dataflow.GENERATORS):
        at_g = at + dataflow.HEADER_WORDS + dataflow.BOUND_WORDS + g_i * (1 + dataflow.LEVELS)
        bases[g] = words[at_g] & ((1 << bits[g]) - 1)
        w = bits[g] + 1
        deltas[g] = [(d & ((1 << w) - 1)) - ((d >> (w - 1) & 1) << w)
                     for d in words[at_g + 1:at_g + 1 + dataflow.LEVELS]]
    return bases, deltas


def core_walk_fault(words, build):
    """Walk every phase as the core does, step by step, independently of verify's closed
    form: its registers' bases and deltas (core_deltas), the run-time levels at each of
    their extreme bounds (the kept count 1 and N, PSG's passes 1 and 2), every address
    against dataflow.limits, the kept channels' (the last channel N - 1 at every step), the
    dX drain's (every lane) and the loss unit's. None, or (phase, what left a memory)."""
    phases = dataflow.decode(words)
    select = None
    for index, ph in enumerate(phases):
        at = index * dataflow.PHASE_WORDS
        bases, deltas = core_deltas(words, at, build)
        limits = dataflow.limits(ph.kind, build)
        run_time = dataflow.run_time_bounds(ph, select)     # verify found the select
        for picked in itertools.product(*[(1, most) for most in run_time.values()]):
            bounds = list(ph.bounds)
            for level, bound in zip(run_time, picked):
                bounds[level] = bound
            strides = {}
            for g in dataflow.GENERATORS:
                st = [0] * dataflow.LEVELS
                for i in range(dataflow.LEVELS - 1, -1, -1):
                    st[i] = deltas[g][i] + sum((bounds[j] - 1) * st[j]
                                               for j in range(i + 1, dataflow.LEVELS))
                strides[g] = st
            nest = dataflow.Nest(tuple(bounds), bases, strides)
            if nest.first_fault(limits) is not None:
                return index, f"a generator at bounds {bounds}"
            for step in nest.walk():
                a = step.addresses
                if ph.kind in dataflow.KEPT_LEVEL:
                    j = select.outputs - 1
                    if a["w"] + j * select.inputs >= limits["w"] or a["g"] + j >= limits["g"]:
                        return index, "a kept channel's address"
                if ph.kind == "input_grad" and a["o"] + build.lanes - 1 >= limits["o"]:
                    return index, "the dX drain"
                if ph.kind == "loss" and a["a"] + ph.outputs - 1 >= limits["a"]:
                    return index, "the loss unit"
        if ph.kind == "select":
            select = ph
    return None


def hostile_programs(rng, build, count):
    """`count` damaged programs (damage) of random networks' compiled train (most) and infer
    programs on `build`: (the case, the words, what was changed)."""
    for _ in range(count):
        layers, batch, weights, shifts, x = random_case(rng, build)
        y = rng.integers(0, layers[-1], batch)
        train = rng.random() < 0.75
        if train:
            phases = dataflow.train_program(layers, build, batch, shifts,
                                            psg_relative=bool(rng.integers(2)))
        else:
            phases = dataflow.infer_program(layers, build, batch, shifts)
        bad, what = damage(rng, dataflow.encode(phases, build), build)
        yield (layers, batch, weights, x, y), bad, what


@pytest.mark.parametrize("lanes", sorted(TIGHT_BUILDS))
def test_a_damaged_program_is_refused_or_runs_inside_the_memories(lanes):
    """Hundreds of programs with one field damaged: verify refuses each, naming its phase,
    or the executor runs it on memories that refuse an index outside them (with random step
    settings), and a step-by-step walk as the core makes it leaves no memory."""
    build = TIGHT_BUILDS[lanes]
    rng = np.random.default_rng(1000 + lanes)
    verdicts = {"refused": 0, "accepted": 0}
    for (layers, batch, weights, x, y), bad, what in hostile_programs(rng, build, 150):
        verdict = dataflow.verify(bad, build)
        if verdict is not None:
            verdicts["refused"] += 1
            index, reason = verdict
            assert reason.startswith(f"phase {index}"), (what, reason)
            continue
        verdicts["accepted"] += 1
        phases = dataflow.decode(bad)
        mem = bounded_memories(build)
        mem.load_network(layers, weights, batch)
        # labels are data, not program: below the classes of a damaged loss phase too
        classes = min([ph.outputs for ph in phases if ph.kind == "loss"], default=layers[-1])
        mem.load_inputs(x, y % classes)
        # the update mask register has a bit for every layer the build holds
        settings = random_step_settings(rng, build.max_layers)
        dataflow.execute(phases, mem, batch, settings=settings)
        assert core_walk_fault(bad, build) is None, what
    # both outcomes are common: the damage is neither always fatal nor always harmless
    assert verdicts["refused"] >= 40 and verdicts["accepted"] >= 20, verdicts


# ---------------------------------------------------------------- each check, by name
TIGHT = TIGHT_BUILDS[4]
#: A 2-layer network at a batch of 6 on TIGHT (4 lanes: two sample blocks, the last one
#: with 2 samples), and its train program (PSG relative).
LAYERS, BATCH = [6, 5, 4], 6


def tight_program():
    return dataflow.train_program(LAYERS, TIGHT, BATCH, shifts_for(LAYERS), psg_relative=True)


def first(phases, kind, layer=None):
    return next(i for i, ph in enumerate(phases)
                if ph.kind == kind and layer in (None, ph.layer))


def changed(phases, index, **fields):
    """A copy of `phases` with phase `index`'s header `fields` (shift, layer, ...), its
    generator bases (base_w=...), strides (stride_a=(level, stride)) or bounds
    (bound=(level, bound)) changed."""
    phases = list(phases)
    ph = phases[index]
    bases, strides, bounds = dict(ph.nest.bases), dict(ph.nest.strides), list(ph.bounds)
    header = {}
    for name, value in fields.items():
        if name.startswith("base_"):
            bases[name[5:]] = value
        elif name.startswith("stride_"):
            level, stride = value
            st = list(strides[name[7:]])
            st[level] = stride
            strides[name[7:]] = tuple(st)
        elif name == "bound":
            bounds[value[0]] = value[1]
        else:
            header[name] = value
    nest = dataflow.Nest(tuple(bounds), bases, strides)
    phases[index] = dataclasses.replace(ph, nest=nest, **header)
    return phases


def reach(ph, g):
    return ph.nest.span(g)[1]


def refusals():
    """(what, words, the phase verify must name, strings its reason must hold)."""
    P = tight_program()
    enc = lambda phases: dataflow.encode(phases, TIGHT)     # noqa: E731
    fwd, loss, ig = first(P, "forward"), first(P, "loss"), first(P, "input_grad")
    sel1, wg1 = first(P, "select", layer=1), first(P, "weight_grad", layer=1)
    words = enc(P)
    unknown = list(words)
    unknown[fwd * dataflow.PHASE_WORDS] = (unknown[fwd * dataflow.PHASE_WORDS] & ~0xF) | 12
    yield "kind", unknown, fwd, ["kind 12 is not one of"]
    yield "shift", enc(changed(P, fwd, shift=32)), fwd, ["shift 32", "31"]
    yield "layer", enc(changed(P, sel1, layer=3)), sel1, ["layer 3", "0..2"]
    yield "outputs", enc(changed(P, fwd, outputs=13)), fwd, ["outputs 13", "12"]
    yield "loss classes", enc(changed(P, loss, outputs=0)), loss, ["outputs 0"]
    yield "zero bound", enc(changed(P, fwd, bound=(3, 0))), fwd, ["level 3's bound is 0"]
    yield "no select", enc([P[ig]]), 0, ["no select phase"]
    yield "stale kept list", enc(changed(P, ig, layer=0)), ig, ["(0, 5, 4)", "(1, 5, 4)"]
    yield "pass stride", enc(changed(P, wg1, stride_a=(dataflow.PASS_LEVEL, 1))), wg1, \
        ["generator a steps 1 at level 2"]
    yield "kept stride", enc(changed(P, ig, stride_w=(dataflow.INNER, 1))), ig, \
        ["generator w steps 1 at level 4"]
    yield "channels", enc(changed(P, sel1, bound=(2, 2))), sel1, ["scores 8 channels", "4 outputs"]
    ph = changed(P, fwd, base_o=60)
    yield "range", enc(ph), fwd, [f"generator o reaches {reach(ph[fwd], 'o')}",
                                  "64 activation words"]
    yield "below 0", enc(changed(P, fwd, stride_a=(dataflow.INNER, -1))), fwd, \
        ["generator a reaches -5", "start at 0"]
    ph = changed(P, wg1, base_w=370)
    yield "kept weights", enc(ph), wg1, [f"{reach(ph[wg1], 'w')} + 3 * 5 = 388", "384 weights"]
    ph = changed(P, wg1, base_g=42)
    yield "kept dY", enc(ph), wg1, [f"{reach(ph[wg1], 'g')} + 3 = 49", "48 gradient words"]
    ph = changed(P, ig, base_o=122)
    yield "dX drain", enc(ph), ig, [f"{reach(ph[ig], 'o')} + 3 = 161", "160 dX scratch"]
    # the logits' words in range, the loss unit's last word (a + N - 1) past them
    top = TIGHT.grad_words - 1
    ph = changed(P, loss, base_a=top - (reach(P[loss], "a") - P[loss].nest.bases["a"]))
    n = P[loss].outputs
    yield "loss unit", enc(ph), loss, [f"{top} + {n - 1} = {top + n - 1}", "48 gradient words"]
    yield "no end", words[:-dataflow.HEADER_WORDS], len(P), ["no end phase"]
    many = words[:dataflow.PHASE_WORDS] * (TIGHT.program_words // dataflow.PHASE_WORDS + 1)
    yield "too long", many + [0, 0], TIGHT.program_words // dataflow.PHASE_WORDS, \
        [f"pass the program's end ({TIGHT.program_words} words)"]
    wide = list(words)
    wide[5] = 1 << 32
    yield "word", wide, 0, ["word 5 is 4294967296", "32-bit"]


@pytest.mark.parametrize("case", list(refusals()), ids=lambda c: c[0])
def test_a_refusal_names_the_phase_the_value_and_the_limit(case):
    what, words, index, parts = case
    assert dataflow.verify(dataflow.encode(tight_program(), TIGHT), TIGHT) is None
    verdict = dataflow.verify(words, TIGHT)
    assert verdict is not None and verdict[0] == index, (what, verdict)
    for part in parts:
        assert part in verdict[1], (what, verdict[1])


def test_what_the_core_sets_at_run_time_is_not_checked_as_written():
    """The written bounds of the kept channel and pass levels are not the core's (the kept
    count and PSG's passes are): 0 there passes, as does a level that repeats the walk
    inside the memories."""
    P = tight_program()
    ig, wg = first(P, "input_grad"), first(P, "weight_grad")
    for phases in (changed(P, ig, bound=(dataflow.KEPT_LEVEL["input_grad"], 0)),
                   changed(P, wg, bound=(dataflow.PASS_LEVEL, 0)),
                   changed(P, wg, bound=(dataflow.KEPT_LEVEL["weight_grad"], 0)),
                   changed(P, first(P, "forward"), bound=(0, 3))):
        assert dataflow.verify(dataflow.encode(phases, TIGHT), TIGHT) is None


# ---------------------------------------------------------------- the core agrees
def core_run(phases, settings=spec.StepSettings(), executor=True):
    """A training step of LAYERS at a batch of 8 (full sample blocks) on TIGHT in the
    Amaranth simulator (ember_sim.sample_core.simulate, the harness of
    tests/test_sample_engine.py) with the program of `phases`: (fault, the core's weights
    after it, the executor's after the same program (None without `executor`), the weights
    before it)."""
    rng = np.random.default_rng(7)
    weights = [rng.integers(-999, 999, (n, k)).astype(np.int16)
               for k, n in zip(LAYERS[:-1], LAYERS[1:])]
    x = rng.integers(0, 256, (8, LAYERS[0]))
    y = rng.integers(0, LAYERS[-1], 8)
    out = simulate(TIGHT, dataflow.encode(phases, TIGHT), LAYERS, weights, 8, x, y, settings)
    if not executor:
        return out["fault"], out["weights"], None, weights
    mem = dataflow.Memories(TIGHT)
    mem.load_network(LAYERS, weights, 8)
    mem.load_inputs(x, y)
    dataflow.execute(phases, mem, 8, settings=settings)
    return out["fault"], out["weights"], mem.read_weights(LAYERS, 8), weights


def full_blocks_program():
    return dataflow.train_program(LAYERS, TIGHT, 8, shifts_for(LAYERS))


@pytest.mark.parametrize("damage", ["kept weights", "dX drain", "loss unit"])
def test_a_program_refused_for_a_derived_address_faults_in_the_core(damage):
    """Addresses only the derived checks see (each generator's own range is inside its
    memory): the kept channel's weight (w + j * K), the dX drain's entry (o + lane), the
    loss unit's word (a + n). verify refuses each; the core stops it with fault."""
    P = full_blocks_program()
    if damage == "kept weights":
        wg = first(P, "weight_grad", layer=1)
        span = reach(P[wg], "w") - P[wg].nest.bases["w"]
        P = changed(P, wg, base_w=TIGHT.weight_words * TIGHT.lanes - span - 2)
    elif damage == "dX drain":
        ig = first(P, "input_grad")
        span = reach(P[ig], "o") - P[ig].nest.bases["o"]
        P = changed(P, ig, base_o=TIGHT.scratch_entries - span - 2)
    else:
        loss = first(P, "loss")
        span = reach(P[loss], "a") - P[loss].nest.bases["a"]
        P = changed(P, loss, base_a=TIGHT.grad_words - span - 2)
    words = dataflow.encode(P, TIGHT)
    verdict = dataflow.verify(words, TIGHT)
    assert verdict is not None and damage.split()[-1] in verdict[1], verdict
    ranges = dataflow.effective_nest(P[verdict[0]], P[first(P, "select", layer=1)])
    assert all(ranges.span(g)[1] < n for g, n in dataflow.limits(P[verdict[0]].kind,
                                                                  TIGHT).items())
    fault, _, _, _ = core_run(P, executor=False)
    assert fault


def test_a_damaged_program_verify_accepts_runs_in_the_core_as_in_the_executor():
    """A forward phase walked three times over (its outermost level's bound) and a select
    phase's unused weight generator moved inside the weights: verify accepts it, and the
    core runs it without a fault to the executor's weights."""
    P = full_blocks_program()
    P = changed(P, first(P, "forward"), bound=(0, 3))
    P = changed(P, first(P, "select", layer=0), base_w=100)
    assert dataflow.verify(dataflow.encode(P, TIGHT), TIGHT) is None
    fault, got, want, before = core_run(P, spec.StepSettings(lr_shift=6))
    assert not fault
    for g, w in zip(got, want):
        assert (g == w).all()
    assert any((w != w0).any() for w, w0 in zip(want, before))
