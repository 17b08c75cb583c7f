"""Engine v2 behind the bus (ember_hw.sample_core.SampleCore) in the Amaranth simulator: the
host's bus operations (descriptors, weights, program, settings, batch, CONTROL) as on the
model backend, against the golden model: weights, correct counts, predictions and every
exact counter, bit for bit and count for count; a program that leaves a memory ends the
command with the answer `fault`."""

import dataclasses

import numpy as np
import pytest

from conftest import random_batch
from engine_harness import BusDriver, BusError, golden_for, random_step_settings, run_testbench
from test_liveness import Bench, left_as_stopped_says
from ember import dataflow, golden, program, regmap, spec
from ember.spec import Build, StepSettings
from ember_hw.sample_core import SampleCore

SMALL = Build(name="v2-small", dataflow="samples", lanes=4, weight_words=256, act_bytes=512,
              grad_words=64, scratch_entries=128, max_batch=8, max_layers=3, max_width=32,
              features=("zero_skip", "slu", "psg", "ssprop", "ssprop_random"))
#: ... with the iCEBreaker build's units only: the core's PSG and ssProp logic is left out
LEAN = dataclasses.replace(SMALL, name="v2-lean", features=("zero_skip", "slu"))


def shifts_of(layers):
    return [spec.HIDDEN_SHIFT] * (len(layers) - 2) + [spec.OUTPUT_SHIFT]


class Session:
    """The host's bus operations for engine v2 (what ember.device.EngineDevice sends)."""

    def __init__(self, ctx, dut, build, layers):
        self.d, self.build, self.layers = BusDriver(ctx, dut.bus), build, layers

    async def writes(self, pairs):
        for addr, v in pairs:
            await self.d.write(addr, v)

    async def program(self, phases):
        for base, words in regmap.program_writes(dataflow.encode(phases, self.build)):
            await self.d.write_words(base, words)

    async def configure(self, weights, batch):
        await self.writes(regmap.descriptor_writes(self.layers, self.build, batch))
        await self.writes(sorted(regmap.pack_weights(weights, self.layers, self.build).items()))

    async def load(self, x, y, st):
        """A train command's program, settings and batch."""
        await self.program(dataflow.train_program(
            self.layers, self.build, len(x), shifts_of(self.layers),
            psg_relative=st.psg and st.psg_relative))
        await self.writes(regmap.settings_writes(st, len(self.layers) - 1))
        for base, words in regmap.batch_writes(x, y, self.build):
            await self.d.write_words(base, words)

    async def train(self, x, y, st):
        await self.load(x, y, st)
        await self.d.write(regmap.reg("control"), spec.CONTROL_TRAIN)
        return await self.d.read(regmap.reg("correct"))

    async def infer(self, x):
        await self.program(dataflow.infer_program(self.layers, self.build, len(x),
                                                  shifts_of(self.layers)))
        for base, words in regmap.batch_writes(x, None, self.build):
            await self.d.write_words(base, words)
        await self.d.write(regmap.reg("control"), spec.CONTROL_INFER)
        words = await self.d.read_words(regmap.region("predictions"), (len(x) + 1) // 2)
        return regmap.unpack_halves(words, len(x))

    async def weights(self):
        size = sum(k * n for k, n in zip(self.layers[:-1], self.layers[1:]))
        words = await self.d.read_words(regmap.region("weights"), size + 1)
        return regmap.unpack_weights(lambda a, c: words[:c], self.layers, self.build)

    async def counters(self):
        words = await self.d.read_words(regmap.region("counters"), 2 * len(spec.COUNTERS))
        return regmap.counters_from_words(words)


def accepted(settings, build):
    """`settings` as the host sends them to `build`: without the settings of units it
    leaves out (the host refuses them)."""
    if "psg" not in build.features:
        settings = dataclasses.replace(settings, psg=False, psg_relative=False)
    if "ssprop" not in build.features:
        settings = dataclasses.replace(settings, keep_q8=spec.KEEP_ONE, ssprop_random=False)
    return settings


@pytest.mark.parametrize("build, seed", [(SMALL, 0), (SMALL, 1), (LEAN, 2)],
                         ids=["every-unit-0", "every-unit-1", "lean-2"])
def test_train_and_infer_through_the_bus_match_the_golden_model(build, seed):
    rng = np.random.default_rng(seed)
    layers = [int(rng.integers(3, 12)), int(rng.integers(2, 10)), int(rng.integers(2, 6))]
    batch = int(rng.integers(1, build.max_batch + 1))
    weights = golden.init_weights(layers, seed)
    g = golden_for(build, layers, weights)
    steps = [(*random_batch(rng, layers, batch, zero_fraction=0.4),
              accepted(random_step_settings(rng, len(layers) - 1), build)) for _ in range(2)]
    dut = SampleCore(build)
    out = {}

    async def body(ctx):
        s = Session(ctx, dut, build, layers)
        await s.configure(weights, batch)
        out["correct"] = [await s.train(x, y, st) for x, y, st in steps]
        out["pred"] = await s.infer(steps[0][0])
        out["weights"] = await s.weights()
        out["counters"] = await s.counters()

    run_testbench(dut, body)
    correct = [g.train_batch(x, y, st) for x, y, st in steps]
    pred = g.infer(steps[0][0])
    for l, (a, b) in enumerate(zip(out["weights"], g.weights)):
        assert np.array_equal(a, b), f"layer {l} weights differ:\n{a}\n{b}"
    assert out["correct"] == correct
    assert list(out["pred"]) == list(pred)
    diff = {n: (out["counters"][n], g.counters[n]) for n in spec.EXACT_COUNTERS
            if not n.startswith("link") and out["counters"][n] != g.counters[n]}
    assert not diff, diff
    c = out["counters"]
    assert c["cycles"] == sum(c[n] for n in spec.CYCLE_COUNTERS if n != "cycles") > 0


def test_a_program_that_leaves_a_memory_ends_the_command_with_fault():
    layers = [6, 5, 3]
    weights = golden.init_weights(layers, 1)
    rng = np.random.default_rng(1)
    x, y = random_batch(rng, layers, 4)
    phases = dataflow.infer_program(layers, SMALL, 4, shifts_of(layers))
    # the first layer's outputs written past the end of the activation memory
    bad = phases[0]
    bases = dict(bad.nest.bases, o=SMALL.act_bytes // SMALL.lanes - 2)
    phases[0] = dataclasses.replace(bad, nest=program.Nest(bad.bounds, bases, bad.nest.strides))
    dut = SampleCore(SMALL)
    out = {}

    async def body(ctx):
        s = Session(ctx, dut, SMALL, layers)
        await s.configure(weights, 4)
        await s.program(phases)
        for base, words in regmap.batch_writes(x, None, SMALL):
            await s.d.write_words(base, words)
        try:
            await s.d.write(regmap.reg("control"), spec.CONTROL_INFER)
            out["status"] = "ok"
        except BusError as e:
            out["status"] = e.status
        out["counters"] = await s.counters()
        out["weights"] = await s.weights()

    run_testbench(dut, body)
    assert out["status"] == "fault"
    assert out["counters"]["infer_samples"] == 0
    for a, b in zip(out["weights"], weights):
        assert np.array_equal(a, b)


# --- Stopping a command: the watchdog and the abort on engine v2 (issue 15's, for v2) -------
DEFENDED = dataclasses.replace(SMALL, name="v2-small-defended",
                               features=spec.DEFAULT_FEATURES)
MAX_WATCHDOG = DEFENDED.settings()["watchdog"].hi
LAYERS, BATCH = [9, 6, 3], 3
# every unit on: zero skip, ssProp top-k (a kept count below the width), PSG relative
EVERY_UNIT = StepSettings(lr_shift=4, zero_skip=True, keep_q8=160, psg=True,
                          psg_relative=True, psg_tau=3)


class Stoppable(Bench):
    """test_liveness's start and end of a command left running, on engine v2's bus."""

    def __init__(self, ctx, dut):
        self.ctx, self.dut, self.drv = ctx, dut, BusDriver(ctx, dut.bus)


def run_stops(stops, seed=3):
    """For each of `stops` (("watchdog", n) or ("abort", cycle)), in one simulation: train a
    step from the first weights stopped that way, read what it left, then reload the first
    weights and train a clean step, which must match the golden model's. Returns each stop's
    results, the first weights, and the golden model's weights after the full step."""
    rng = np.random.default_rng(seed)
    w0 = golden.init_weights(LAYERS, seed)
    first = random_batch(rng, LAYERS, BATCH, zero_fraction=0.3)
    second = random_batch(rng, LAYERS, BATCH, zero_fraction=0.3)
    dut = SampleCore(DEFENDED)
    outs = []

    async def body(ctx):
        s, b = Session(ctx, dut, DEFENDED, LAYERS), Stoppable(ctx, dut)
        await s.configure(w0, BATCH)
        for kind, when in stops:
            out = {}
            await s.writes(sorted(regmap.pack_weights(w0, LAYERS, DEFENDED).items()))
            await s.load(*first, EVERY_UNIT)
            await s.d.write(regmap.reg("watchdog"),
                            when if kind == "watchdog" else MAX_WATCHDOG)
            await s.d.write(regmap.reg("control"), spec.CONTROL_CLEAR_COUNTERS)
            await b.start()

            async def abort(cycle):
                if cycle == when:
                    await s.d.write(regmap.reg("control"), spec.CONTROL_ABORT)
                else:
                    await ctx.tick()
            out["status"] = await b.end(abort if kind == "abort" else None)
            out["stopped"] = spec.stop_fields(await s.d.read(regmap.reg("stopped")))
            out["cycles"] = (await s.counters())["cycles"]
            out["left"] = await s.weights()
            await s.d.write(regmap.reg("watchdog"), MAX_WATCHDOG)
            await s.writes(sorted(regmap.pack_weights(w0, LAYERS, DEFENDED).items()))
            await s.d.write(regmap.reg("control"), spec.CONTROL_CLEAR_COUNTERS)
            out["correct"] = await s.train(*second, EVERY_UNIT)
            out["weights"] = await s.weights()
            out["counters"] = await s.counters()
            outs.append(out)

    run_testbench(dut, body)
    clean = golden_for(DEFENDED, LAYERS, w0)
    correct = clean.train_batch(*second, EVERY_UNIT)
    for stop, out in zip(stops, outs):
        assert out["correct"] == correct, stop
        for l, (a, want) in enumerate(zip(out["weights"], clean.weights)):
            assert np.array_equal(a, want), f"{stop}: layer {l} differs after the clean step"
        for name in spec.EXACT_COUNTERS:
            if not name.startswith("link"):
                assert out["counters"][name] == clean.counters[name], (stop, name)
    stepped = golden_for(DEFENDED, LAYERS, w0)
    stepped.train_batch(*first, EVERY_UNIT)
    return outs, w0, stepped.weights


def test_v2_watchdog_stops_at_its_bound_and_says_what_it_left():
    """The command's cycles are within spec.command_cycle_bound (for its settings, and for
    every setting); with the watchdog at them it runs to its end, and with any n below it
    stops in its cycle n + 1 with STOPPED naming what it left: the layers above STOPPED's
    layer updated, those below untouched. The next command is bit-exact either way."""
    (full,), w0, stepped = run_stops([("watchdog", MAX_WATCHDOG)])
    cycles = full["cycles"]
    assert full["status"] == "ok" and full["stopped"]["stopped"] == 0
    own = spec.command_cycle_bound(DEFENDED, LAYERS, BATCH, True, EVERY_UNIT)
    assert cycles <= own <= spec.command_cycle_bound(DEFENDED, LAYERS, BATCH), (cycles, own)
    for l, w in enumerate(full["left"]):
        assert np.array_equal(w, stepped[l]), l
    rng = np.random.default_rng(5)
    points = sorted({1, cycles - 1, *rng.integers(1, cycles, size=2).tolist()})
    (exact, *stopped), _, _ = run_stops([("watchdog", n) for n in [cycles] + points])
    assert exact["status"] == "ok" and exact["cycles"] == cycles
    changed = 0
    for n, got in zip(points, stopped):
        assert got["status"] == "watchdog" and got["cycles"] == n + 1, (n, got)
        changed += left_as_stopped_says(got, w0, stepped, n)
    assert 0 < changed, "a stop should fall after the first update"


def test_v2_abort_before_the_first_weight_write_leaves_the_weights():
    """An abort early in a training step stops it with `aborted`, the weights as they were;
    the next step is bit-exact."""
    outs, w0, _ = run_stops([("abort", 0), ("abort", 50)])
    for got in outs:
        assert got["status"] == "aborted"
        assert got["stopped"] == {"stopped": 1, "watchdog": 0, "weights_changed": 0,
                                  "layer": 0}
        for l, w in enumerate(got["left"]):
            assert np.array_equal(w, w0[l]), l


def test_a_program_the_checker_refuses_changes_nothing():
    """With the command check, a program dataflow.verify refuses is refused before it runs
    (bad_value, REJECTED "program"): weights, counters and predictions stay as they were.
    The compiled program, written after it, passes the check and runs; a refused program
    written over it is refused again (the verdict is redone after each program write)."""
    layers, batch = [6, 5, 3], 4
    weights = golden.init_weights(layers, 1)
    rng = np.random.default_rng(1)
    x, _ = random_batch(rng, layers, batch)
    good = dataflow.infer_program(layers, DEFENDED, batch, shifts_of(layers))
    bad = list(good)
    ph = bad[0]                 # layer 0's outputs written past the activation memory
    bad[0] = dataclasses.replace(ph, nest=program.Nest(
        ph.bounds, dict(ph.nest.bases, o=DEFENDED.act_bytes // DEFENDED.lanes - 2),
        ph.nest.strides))
    assert dataflow.verify(dataflow.encode(bad, DEFENDED), DEFENDED) is not None
    dut = SampleCore(DEFENDED)
    out = {}

    async def infer(s, phases):
        await s.program(phases)
        try:
            await s.d.write(regmap.reg("control"), spec.CONTROL_INFER)
            return "ok", await s.d.read(regmap.reg("rejected"))
        except BusError as e:
            return e.status, await s.d.read(regmap.reg("rejected"))

    async def body(ctx):
        s = Session(ctx, dut, DEFENDED, layers)
        await s.configure(weights, batch)
        for base, words in regmap.batch_writes(x, None, DEFENDED):
            await s.d.write_words(base, words)
        out["bad"] = await infer(s, bad)
        out["after_bad"] = (await s.counters(), await s.weights())
        out["good"] = await infer(s, good)
        out["pred"] = regmap.unpack_halves(await s.d.read_words(
            regmap.region("predictions"), (batch + 1) // 2), batch)
        out["bad_again"] = await infer(s, bad)

    run_testbench(dut, body)
    program_check = 1 + list(spec.COMMAND_CHECKS).index("program")
    assert out["bad"] == ("bad_value", program_check)
    counters, left = out["after_bad"]
    assert counters["cycles"] == 0 and counters["infer_samples"] == 0
    for a, b in zip(left, weights):
        assert np.array_equal(a, b)
    assert out["good"] == ("ok", 0)
    g = golden_for(DEFENDED, layers, weights)
    assert list(out["pred"]) == list(g.infer(x))
    assert out["bad_again"] == ("bad_value", program_check)
