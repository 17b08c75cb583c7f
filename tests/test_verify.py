"""dataflow.verify, the static check of a v2 program before a run (the golden twin of the
shell's program checker): every program the host compiles passes it; a program it refuses
names the field, its value and its limit; a damaged program it accepts runs in the executor
without leaving a memory, and in the core (the Amaranth simulator) without a fault."""

import numpy as np
import pytest

from ember import dataflow, spec

from test_sample_engine import LANE_BUILDS, random_case

#: The test builds of 2, 4 and 8 lanes and every named build (verify reads only the sizes).
BUILDS = dict({b.name: b for b in LANE_BUILDS.values()}, **spec.BUILDS)


def shifts_for(layers):
    return [spec.HIDDEN_SHIFT] * (len(layers) - 2) + [spec.OUTPUT_SHIFT]


def compiled_programs(rng, build, cases):
    """(what, words) of random networks' infer and train programs (PSG relative and not) on
    `build`, as tests/test_sample_engine.py's random_case draws them; a program longer than
    the program memory, which encode refuses, is left out."""
    for _ in range(cases):
        layers, batch, _, shifts, _ = random_case(rng, build)
        programs = {"infer": dataflow.infer_program(layers, build, batch, shifts)}
        for relative in (False, True):
            programs["train", relative] = dataflow.train_program(layers, build, batch, shifts,
                                                                 psg_relative=relative)
        for kind, phases in programs.items():
            try:
                words = dataflow.encode(phases, build)
            except spec.ConfigError:
                assert len(phases) * dataflow.PHASE_WORDS > dataflow.PROGRAM_WORDS - 2
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
                                                    psg_relative=True)
                else:
                    phases = dataflow.infer_program(layers, build, batch, shifts_for(layers))
                words = dataflow.encode(phases, build)
                assert dataflow.verify(words, build) is None, (layers, batch, train)
                checked += 1
    assert checked >= 8
