"""EngineCore in the Amaranth simulator against the golden model: weights and counters after
training steps, bit for bit and count for count."""

import numpy as np
import pytest

from conftest import random_batch
from engine_harness import BusDriver, EngineSession, golden_for, run_testbench
from ember import golden, regmap, spec
from ember.spec import Build, StepSettings
from ember_hw.engine import EngineCore

SMALL = Build(name="small", lanes=4, weight_words=256, act_bytes=512, grad_words=64,
              scratch_entries=128, max_batch=8, max_layers=3, max_width=32)


def check_against_golden(layers, batch, steps, seed=0, build=SMALL, infer=False,
                         weights=None, batches=None):
    rng = np.random.default_rng(seed)
    if weights is None:
        weights = golden.init_weights(layers, seed)
    g = golden_for(build, layers, weights)
    dut = EngineCore(build)
    if batches is None:
        batches = [(*random_batch(rng, layers, batch, zero_fraction=0.4), s) for s in steps]
    result = {}

    async def body(ctx):
        s = EngineSession(BusDriver(ctx, dut.bus), build, layers, batch)
        await s.configure(weights)
        result["correct"] = []
        for x, y, settings in batches:
            result["correct"].append(await s.train(x, y, settings))
        if infer:
            result["pred"] = await s.infer(batches[0][0])
        result["weights"] = await s.weights()
        result["counters"] = await s.counters()
        # the weight memory may be single-ported (SPRAM): never a read and a write in one cycle
        result["weight_conflict"] = ctx.get(dut.wmem.conflict)
        result["read_collision"] = ctx.get(dut.read_collision)

    run_testbench(dut, body)
    assert result["weight_conflict"] == 0, "the engine read and wrote weights in one cycle"
    assert result["read_collision"] == 0, "the engine used a read of a word written in its cycle"
    correct = [g.train_batch(x, y, st) for x, y, st in batches]
    pred = g.infer(batches[0][0]) if infer else None
    for l, (a, b) in enumerate(zip(result["weights"], g.weights)):
        assert np.array_equal(a, b), f"layer {l} weights differ:\n{a}\n{b}"
    for name in spec.EXACT_COUNTERS:
        if name.startswith("link"):
            continue
        assert result["counters"][name] == g.counters[name], \
            f"{name}: engine {result['counters'][name]} model {g.counters[name]}"
    assert result["correct"] == correct
    c = result["counters"]
    assert c["cycles"] == sum(c[name] for name in spec.CYCLE_COUNTERS if name != "cycles")
    assert c["cycles"] > 0
    if infer:
        assert list(result["pred"]) == list(pred)
    return result


def test_sgd_step_two_layers():
    check_against_golden([6, 5, 3], 3, [StepSettings(lr_shift=9)])


CASES = {
    "zero_skip": ([7, 6, 3], 4, [StepSettings(lr_shift=9, zero_skip=True)] * 2),
    "slu_bottom_frozen": ([5, 9, 6, 3], 2, [StepSettings(update_mask=(False, True, True))]),
    "slu_middle_frozen": ([5, 9, 6, 3], 2, [StepSettings(update_mask=(True, False, True))]),
    "slu_top_only": ([5, 9, 6, 3], 2, [StepSettings(update_mask=(False, False, True))]),
    "slu_nothing": ([5, 4, 3], 2, [StepSettings(update_mask=(False, False))]),
    "ssprop_topk": ([6, 10, 7], 3, [StepSettings(keep_q8=100)] * 2),
    # one sample: the score pass issues a channel every cycle, so its pipeline's last-channel
    # test must not fire on the channel before the last
    "ssprop_topk_batch1": ([6, 10, 7], 1, [StepSettings(keep_q8=100)] * 2),
    "ssprop_random": ([6, 10, 7], 3, [StepSettings(keep_q8=60, ssprop_random=True,
                                                   lfsr_seed=0xACE1)] * 2),
    "psg_abs": ([7, 6, 5], 4, [StepSettings(psg=True, psg_tau=3, psg_step_shift=5)] * 2),
    "psg_rel": ([7, 6, 5], 4, [StepSettings(psg=True, psg_relative=True, psg_tau=2)] * 2),
    # batch x hidden width (128) past what a layer-width counter holds (max_width 32)
    "full_batch_wide_hidden": ([6, 16, 5], 8, [StepSettings(lr_shift=9)]),
    "all": ([9, 7, 6, 4], 3, [StepSettings(psg=True, zero_skip=True, keep_q8=128,
                                           update_mask=(False, True, True))] * 2),
}


#: Each case's cycle counters (spec.CYCLE_COUNTERS: total, forward, loss, select, input
#: gradient, weight gradient, update), as the v1 engine counts them. Splitting the engine into
#: units (issue 13) keeps every one; a change of the sequencer or the dataflow that changes
#: them says so by changing this table.
V1_CYCLES = {
    "zero_skip": (1432, 358, 280, 134, 126, 382, 152),
    "slu_bottom_frozen": (709, 186, 70, 104, 39, 179, 131),
    "slu_middle_frozen": (742, 186, 70, 104, 107, 162, 113),
    "slu_top_only": (444, 186, 70, 104, 1, 46, 37),
    "slu_nothing": (206, 69, 70, 67, 0, 0, 0),
    "ssprop_topk": (2203, 462, 282, 550, 210, 466, 233),
    "ssprop_topk_batch1": (1564, 190, 94, 358, 90, 430, 402),
    "ssprop_random": (1960, 462, 282, 418, 210, 386, 202),
    "psg_abs": (2092, 454, 328, 134, 174, 900, 102),
    "psg_rel": (2933, 454, 328, 134, 174, 1744, 99),
    "full_batch_wide_hidden": (2383, 763, 328, 67, 399, 748, 78),
    "all": (1858, 480, 228, 423, 102, 501, 124),
}


@pytest.mark.parametrize("case", CASES)
def test_engine_matches_golden(case):
    layers, batch, steps = CASES[case]
    r = check_against_golden(layers, batch, steps, seed=len(case))
    assert tuple(r["counters"][name] for name in spec.CYCLE_COUNTERS) == V1_CYCLES[case]


def test_inference_and_random_shapes():
    rng = np.random.default_rng(11)
    for i in range(3):
        layers = [int(v) for v in rng.integers(2, 13, size=int(rng.integers(3, 5)))]
        layers[-1] = max(2, layers[-1])
        batch = int(rng.integers(1, 6))
        steps = [StepSettings(lr_shift=int(rng.integers(8, 12)),
                              zero_skip=bool(rng.integers(2)),
                              psg=bool(rng.integers(2)),
                              keep_q8=int(rng.choice([256, 90, 200])),
                              update_mask=tuple(bool(v) for v in rng.integers(0, 2, len(layers) - 1)))
                 for _ in range(2)]
        check_against_golden(layers, batch, steps, seed=i, infer=True)


@pytest.mark.parametrize("tau", [0, 32, 96])
def test_psg_threshold_edges(tau):
    # the hand-made case of test_golden.psg_case: predictions of exactly 0, 32 and 96
    x = np.array([[15, 255, 0], [16, 0, 0]])
    y = np.array([0, 1])
    weights = [np.zeros((4, 3), dtype=np.int16)]
    settings = StepSettings(psg=True, psg_tau=tau, psg_step_shift=3)
    r = check_against_golden([3, 4], 2, None, weights=weights, batches=[(x, y, settings)])
    assert r["counters"]["skip_psg"] == {0: 16, 32: 10, 96: 8}[tau]


def test_sums_at_the_build_limits_do_not_wrap():
    """Accumulators are sized from the build (spec.Build.lane_acc_bits, dx_acc_bits): the
    largest sums a full-width layer with extreme weights and activations forms still match
    the golden model's exact integers (a wrapped forward sum would turn 255s into ReLU zeros)."""
    width, batch = SMALL.max_width, SMALL.max_batch
    layers = [width, 16, 4]
    weights = [np.full((16, width), 32767, dtype=np.int64),
               np.where(np.arange(4 * 16).reshape(4, 16) % 3 == 0, 32767, -32768)]
    x = np.full((batch, width), 255, dtype=np.int64)
    y = np.arange(batch) % 4
    check_against_golden(layers, batch, [], weights=weights, build=SMALL,
                         batches=[(x, y, StepSettings(lr_shift=20)),
                                  (x, y, StepSettings(lr_shift=20, psg=True, psg_tau=0))])


def test_act_write_limit_follows_batch_and_inputs():
    # the bus writes only the input batch's batch * inputs bytes of the activation region; the
    # limit is recomputed (on the shared serial multiplier) after a write of either factor and
    # after a command, and a write right behind waits for it
    layers = [5, 3]                 # no hidden layer: commands write no activations
    dut = EngineCore(SMALL)
    totals = [0]

    async def body(ctx):
        d = BusDriver(ctx, dut.bus)
        await EngineSession(d, SMALL, layers, 2).configure(golden.init_weights(layers, 0))

        async def write_acts():
            await d.write_words(regmap.region("acts"), [0x04030201] * 8)      # 32 bytes
            totals.append(await d.read(regmap.counter("act_writes")))

        await d.write(regmap.region("labels"), 0)      # the batch's labels (a train needs)
        for control in (spec.CONTROL_INFER, spec.CONTROL_TRAIN):
            await d.write(regmap.reg("control"), control)
            await write_acts()
        for batch, inputs in [(2, 4), (3, 4), (3, 7), (1, 1), (8, 4)]:
            await d.write(regmap.reg("batch"), batch)
            await d.write(regmap.layer_field(0, "inputs"), inputs)
            await write_acts()

    run_testbench(dut, body)
    assert list(np.diff(totals)) == [10, 10, 8, 12, 21, 1, 32]


@pytest.mark.parametrize("features", [("zero_skip", "slu"), ("zero_skip", "slu", "psg"),
                                      ("zero_skip", "slu", "ssprop")])
def test_builds_without_optional_units(features):
    """A build may leave out PSG and ssProp (spec.Build.features; the iCEBreaker's does):
    the units it keeps still match the golden model exactly."""
    import dataclasses
    build = dataclasses.replace(SMALL, name="lean", features=features)
    steps = [StepSettings(lr_shift=9, zero_skip=True, update_mask=(False, True, True)),
             StepSettings(lr_shift=8)]
    if "psg" in features:
        steps.append(StepSettings(psg=True, psg_tau=3, zero_skip=True))
        steps.append(StepSettings(psg=True, psg_relative=True, psg_tau=2))
    if "ssprop" in features:
        steps.append(StepSettings(keep_q8=100, zero_skip=True))
    check_against_golden([9, 7, 6, 4], 3, steps, build=build, infer=True)


def test_left_out_units_are_not_built():
    """Elaboration: no selector, LFSR or kept-mask memory without ssProp, no predictor
    state without PSG; and the units every build has cannot be left out."""
    import dataclasses
    from amaranth.hdl import Fragment
    lean = dataclasses.replace(SMALL, name="lean", features=("zero_skip", "slu"))
    names = {sub[1] for sub in Fragment.get(EngineCore(lean), None).subfragments}
    full = {sub[1] for sub in Fragment.get(EngineCore(SMALL), None).subfragments}
    assert {"selector", "lfsr", "kmem"} <= full
    assert not {"selector", "lfsr", "kmem"} & names
    with pytest.raises(ValueError, match="always has the slu unit"):
        Fragment.get(EngineCore(dataclasses.replace(SMALL, features=("zero_skip",))), None)
