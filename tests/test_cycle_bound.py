"""spec.command_cycle_bound against the engine in the Amaranth simulator: the `cycles` counter's
increase per command (and each phase counter's) never exceeds the bound, whatever the settings
and the data; for a dense step and for inference the bound for the command's own settings is
exactly its cycles, and the bound for every setting stays within EVERY_SETTING_OVER_DENSE of a
dense step on the sim build."""

import numpy as np
import pytest

from conftest import random_batch
from engine_harness import BusDriver, EngineSession, run_testbench
from ember import golden, regmap, spec
from ember.spec import CYCLE_PHASES, ConfigError, StepSettings
from ember_hw.engine import EngineCore
from ember_hw.loss import SoftmaxGradUnit
from test_engine_pysim import SMALL

CYCLES = spec.CYCLE_COUNTERS
assert spec.COUNTERS[-len(CYCLES):] == CYCLES
#: A dense step (zero skip off, every layer updated, no PSG, no ssProp): the bound for its
#: settings is exactly its cycles (as for inference)
DENSE = StepSettings()
#: The bound for every setting over a dense step's cycles on 64-32-10 at batch 16 (sim
#: build). No bound for every setting can be below the slowest step's cycles: relative PSG
#: with tau 0 recomputes every lane after its extra pass, and keep_q8 255 adds the ssProp
#: selection and drops no block (measured 33,494 cycles, 2.18 times the dense step's 15,375;
#: the bound is 33,725, 2.19 times).
EVERY_SETTING_OVER_DENSE = 2.25


def run_commands(build, layers, batch, commands, seed=0):
    """Run `commands` ((StepSettings or None for infer, zero fraction of the data)) one after
    another on one engine; each command's increase of every cycle counter."""
    rng = np.random.default_rng(seed)
    dut = EngineCore(build)
    deltas = []

    async def body(ctx):
        driver = BusDriver(ctx, dut.bus)
        s = EngineSession(driver, build, layers, batch)

        async def cycle_counters():
            # only the cycle counters (contiguous, the last of COUNTERS): reading all of them
            # after every command would cost the simulator a few hundred cycles each time
            words = await driver.read_words(regmap.counter(CYCLES[0]), 2 * len(CYCLES))
            return {name: words[2 * i] | words[2 * i + 1] << 32
                    for i, name in enumerate(CYCLES)}

        await s.configure(golden.init_weights(layers, seed))
        before = await cycle_counters()
        for settings, zeros in commands:
            x, y = random_batch(rng, layers, batch, zero_fraction=zeros)
            if settings is None:
                await s.infer(x)
            else:
                await s.train(x, y, settings)
            after = await cycle_counters()
            deltas.append({name: after[name] - before[name] for name in CYCLES})
            before = after

    run_testbench(dut, body)
    return deltas


def check_within_bound(build, layers, batch, settings, measured):
    """The command's cycles are within both bounds (every setting, and its own settings),
    and each phase group within its own; returns (bound for every setting, own bound)."""
    train = settings is not None
    every = spec.command_cycle_bound(build, layers, batch, train)
    own = spec.command_cycle_bound(build, layers, batch, train, settings)
    what = f"{layers} batch {batch} {settings}: measured {measured}"
    assert measured["cycles"] <= own <= every, f"{what}; bounds {own}, {every}"
    for group, bound in spec.command_cycle_bounds(build, layers, batch, train,
                                                  settings).items():
        assert sum(measured[name] for name in group) <= bound, f"{what}; {group} > {bound}"
    return every, own


def random_legal_shape(rng, build, depths, widths=None):
    """A network of depths[0]..depths[1] layers and a batch that check_network accepts on
    `build` (rejection sampling). Widths are 2..widths, or, without `widths`, 1 up to a
    random power of two up to build.max_width (so that wide builds' small networks come up
    too)."""
    while True:
        top = widths or min(build.max_width,
                            1 << int(rng.integers(1, build.max_width.bit_length() + 1)))
        depth = int(rng.integers(depths[0], depths[1] + 1))
        layers = [int(w) for w in rng.integers(2 if widths else 1, top + 1, size=depth + 1)]
        layers[-1] = max(2, layers[-1])
        batch = int(rng.integers(1, build.max_batch + 1))
        try:
            spec.check_network(layers, build, batch)
        except ConfigError:
            continue
        return layers, batch


def settings_for(rng, n_layers):
    """The worst cases and random settings of one shape: (settings or None, zero fraction)."""
    def mask():
        return tuple(bool(v) for v in rng.integers(0, 2, n_layers))
    seed = int(rng.integers(1, 1 << 16))
    return [
        (DENSE, 0.0),                                                   # no zeros at all
        (StepSettings(zero_skip=True), 0.8),                            # many zeros, skipped
        # the longest weight gradient: relative PSG, tau 0 recomputes every lane
        (StepSettings(psg=True, psg_relative=True, psg_tau=0), 0.0),
        (StepSettings(psg=True, psg_tau=int(rng.integers(0, 200)), zero_skip=True,
                      update_mask=mask()), 0.5),
        # ssProp keeping 1 channel (keep_q8 1), top-k then random; and a random ratio
        (StepSettings(keep_q8=1, psg=True, psg_relative=True, psg_tau=0), 0.0),
        (StepSettings(keep_q8=1, ssprop_random=True, lfsr_seed=seed), 0.0),
        (StepSettings(keep_q8=int(rng.integers(2, 256)), ssprop_random=bool(rng.integers(2)),
                      lfsr_seed=seed, psg=True, psg_relative=bool(rng.integers(2)),
                      psg_tau=int(rng.integers(0, 4)), zero_skip=bool(rng.integers(2)),
                      update_mask=mask()), float(rng.random())),
        (None, 0.3),                                                    # infer
    ]


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_bound_holds_on_random_shapes_and_settings(depth):
    """Random widths 2..32 and batches 1..8 that fit the SMALL build, `depth` layers; the
    worst cases of settings_for and random ones, data without zeros and with many."""
    seed = 10 + depth
    rng = np.random.default_rng(seed)
    layers, batch = random_legal_shape(rng, SMALL, (depth, depth), widths=32)
    commands = settings_for(rng, len(layers) - 1)
    measured = run_commands(SMALL, layers, batch, commands, seed)
    for (settings, _), m in zip(commands, measured):
        _, own = check_within_bound(SMALL, layers, batch, settings, m)
        if settings in (DENSE, None):
            assert own == m["cycles"], (layers, batch, settings, m["cycles"], own)


def test_default_build_64_32_10():
    """Engine v1 at the sim build's 8 lanes on the digits network at batch 16: a dense step and an
    e2train-like step (PSG with tau 0, an SLU mask that freezes the bottom layer). About
    20 s of the Amaranth simulator; inference (exact, like the dense step: tested on the
    SMALL build) or another step would take 5 to 10 s more."""
    build, layers, batch = spec.BUILDS["v1"], [64, 32, 10], 16
    commands = [(DENSE, 0.0),
                (StepSettings(psg=True, update_mask=(False, True)), 0.5)]
    measured = run_commands(build, layers, batch, commands)
    for (settings, _), m in zip(commands, measured):
        check_within_bound(build, layers, batch, settings, m)
    dense = measured[0]["cycles"]
    every, own = check_within_bound(build, layers, batch, DENSE, measured[0])
    assert own == dense
    assert every <= EVERY_SETTING_OVER_DENSE * dense, (dense, every)


def test_build_without_psg_and_ssprop():
    """Without the PSG and ssProp units (the iCEBreaker's features) no setting lengthens a
    step beyond the dense one: the bound for every setting is exactly a dense step's cycles."""
    import dataclasses
    lean = dataclasses.replace(SMALL, name="lean", features=("zero_skip", "slu"))
    rng = np.random.default_rng(7)
    layers, batch = random_legal_shape(rng, lean, (2, 2), widths=32)
    commands = [(DENSE, 0.0), (StepSettings(zero_skip=True, update_mask=(False, True)), 0.8),
                (None, 0.0)]
    measured = run_commands(lean, layers, batch, commands)
    for (settings, _), m in zip(commands, measured):
        check_within_bound(lean, layers, batch, settings, m)
    assert spec.command_cycle_bound(lean, layers, batch) == measured[0]["cycles"]


def test_max_command_cycles_bounds_every_legal_command():
    """Build.max_command_cycles is at least the bound of random networks and batches each
    build accepts (check_network), train and infer, on every build of spec.BUILDS."""
    rng = np.random.default_rng(5)
    for build in (*spec.BUILDS.values(), SMALL):
        most = build.max_command_cycles()
        assert most > 0
        largest = [build.max_width] * (build.max_layers + 1)
        assert most == spec.command_cycle_bound(build, largest, build.max_batch)
        for _ in range(200):
            layers, batch = random_legal_shape(rng, build, (1, build.max_layers))
            for train in (True, False):
                assert spec.command_cycle_bound(build, layers, batch, train) <= most, \
                    (build.name, layers, batch, train)
    # the watchdog register's width: every build's limit fits 32 bits
    assert max(b.max_command_cycles() for b in spec.BUILDS.values()) < 1 << 32


def test_loss_unit_term_is_the_units_timing():
    for classes in (2, 10, 1000):
        assert SoftmaxGradUnit.cycles(classes) == 3 * classes + spec.LOSS_UNIT_EXTRA_CYCLES


def test_bound_refuses_shapes_the_build_cannot_hold():
    b = spec.DEFAULT_BUILD
    with pytest.raises(ConfigError, match="width 1 of .* is 2000; build 'sim' holds at most "
                                          "1024 per layer"):
        spec.command_cycle_bound(b, [4, 2000, 3], 2)
    with pytest.raises(ConfigError, match=r"batch size 65 is outside 1\.\.64"):
        spec.command_cycle_bound(b, [4, 3], 65)
    with pytest.raises(ConfigError, match="9 layers; build 'sim' holds at most 8"):
        spec.command_cycle_bound(b, [4] * 10, 1)
    with pytest.raises(ConfigError, match="at least 2 widths"):
        spec.command_cycle_bound(b, [4], 1)
    assert set(spec.command_cycle_bounds(b, [4, 3], 1)) == set(CYCLE_PHASES)
