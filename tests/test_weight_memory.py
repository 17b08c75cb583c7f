"""The weight memory (ember_hw.weights.WeightMemory) against a Python model of lane-masked words:
the portable path in the Amaranth simulator, the SPRAM path (SB_SPRAM256KA instances) in Icarus
and Verilator with Yosys's iCE40 cell models; the sticky `conflict` flag; the builds that
select SPRAM; and the engine with its weights in SPRAM against the model backend (Icarus)."""

import dataclasses
import gc
import random
import warnings

import numpy as np
import pytest
from amaranth.back import rtlil
from amaranth.hdl import UnusedElaboratable
from amaranth.sim import Simulator

from ember import golden, spec
from ember.spec import ConfigError, StepSettings
from ember_hw.engine import EngineCore
from ember_hw.sample_engine import SampleEngine
from ember_hw.weights import WeightMemory
from ember_sim import rtl

BENCH = "ember_sim.benches.weight_memory_bench"
LANE = spec.WEIGHT_BITS


def random_ops(lanes, depth, cycles, seed):
    """Cycles `[rd_en, rd_addr, wr_en, wr_addr, wr_data]`, never a read and a write together:
    lane-masked writes and reads over a few hot addresses (the first and last word among them),
    reads of the word written in the cycle before, writes right after reads, idle cycles, and
    random values on every port that is not enabled."""
    rng = random.Random(seed)
    hot = sorted({0, depth - 1, *(rng.randrange(depth) for _ in range(20))})
    ops, last = [], None
    for _ in range(cycles):
        noise_addr, noise_data = rng.randrange(depth), rng.getrandbits(LANE * lanes)
        r = rng.random()
        if r < 0.4:
            last = rng.choice(hot)
            ops.append([0, noise_addr, rng.randrange(1, 1 << lanes), last,
                        rng.getrandbits(LANE * lanes)])
        elif r < 0.85:
            addr = last if last is not None and rng.random() < 0.3 else rng.choice(hot)
            ops.append([1, addr, 0, noise_addr, noise_data])
        else:
            ops.append([0, noise_addr, 0, rng.randrange(depth), noise_data])
    return ops


def check_reads(ops, data, lanes):
    """Compare every read with the model (lanes never written are not compared); return how
    many lanes were compared."""
    mem, compared = {}, 0
    for t, (rd_en, rd_addr, wr_en, wr_addr, wr_data) in enumerate(ops):
        assert not (rd_en and wr_en)
        if rd_en:
            word = data[t]
            assert len(word) == LANE * lanes
            for lane in range(lanes):
                want = mem.get((rd_addr, lane))
                if want is None:
                    continue
                got = word[len(word) - LANE * (lane + 1):len(word) - LANE * lane]
                assert got == format(want, f"0{LANE}b"), \
                    f"cycle {t}: word {rd_addr} lane {lane} reads {got}, wrote {want:016b}"
                compared += 1
        for lane in range(lanes):
            if wr_en >> lane & 1:
                mem[(wr_addr, lane)] = wr_data >> (LANE * lane) & 0xFFFF
    return compared


def play_pysim(dut, ops):
    out = {}

    async def bench(ctx):
        data = []
        for rd_en, rd_addr, wr_en, wr_addr, wr_data in ops:
            ctx.set(dut.rd.en, rd_en)
            ctx.set(dut.rd.addr, rd_addr)
            ctx.set(dut.wr.en, wr_en)
            ctx.set(dut.wr.addr, wr_addr)
            ctx.set(dut.wr.data, wr_data)
            await ctx.tick()
            data.append(format(ctx.get(dut.rd.data), f"0{LANE * dut.lanes}b") if rd_en else None)
        out["data"], out["conflict"] = data, ctx.get(dut.conflict)
        # a read and a write in one cycle: the flag rises and stays
        ctx.set(dut.rd.en, 1)
        ctx.set(dut.wr.en, 1)
        await ctx.tick()
        ctx.set(dut.rd.en, 0)
        ctx.set(dut.wr.en, 0)
        await ctx.tick().repeat(2)
        out["conflict_after"] = ctx.get(dut.conflict)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return out


@pytest.mark.parametrize("lanes, depth", [(4, 512), (8, 300), (2, 16384)])
def test_portable_path_matches_model(lanes, depth):
    ops = random_ops(lanes, depth, 3000, seed=lanes * depth)
    out = play_pysim(WeightMemory(lanes, depth), ops)
    assert check_reads(ops, out["data"], lanes) > 1000
    assert out["conflict"] == 0 and out["conflict_after"] == 1


SPRAM_CASES = [(4, spec.SPRAM_WORDS), (2, 600)]     # the iCEBreaker's, and a short odd depth


@pytest.mark.parametrize("lanes, depth", SPRAM_CASES, ids=[f"l{p}_d{d}" for p, d in SPRAM_CASES])
@pytest.mark.parametrize("simulator", rtl.simulator_params())
def test_spram_path_matches_model(simulator, lanes, depth):
    sim_build = rtl.build(lambda: WeightMemory(lanes, depth, spram=True),
                          f"weight_memory_spram_l{lanes}_d{depth}", simulator,
                          extra_sources=[rtl.ice40_cells_sim()], build_args=rtl.ICE40_MODEL_ARGS)
    ops = random_ops(lanes, depth, 3000, seed=lanes * depth)
    outcome = rtl.run(sim_build, BENCH, case={"ops": ops}, seed=1)
    res = outcome.result
    assert check_reads(ops, res["data"], lanes) > 1000
    assert res["conflict"] == 0
    assert (res["conflict_before"], res["conflict_after"]) == (0, 1)


def test_spram_path_instantiates_one_spram_per_lane():
    text = rtlil.convert(WeightMemory(4, spec.SPRAM_WORDS, spram=True))
    assert text.count("cell \\SB_SPRAM256KA ") == 4
    assert "$mem" not in text
    with warnings.catch_warnings():
        # The half-built component is never elaborated; that is the point.
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(ValueError, match="at most 16384 words"):
            WeightMemory(4, spec.SPRAM_WORDS + 1, spram=True)
        gc.collect()


def test_builds_select_spram():
    ice = spec.BUILDS["icebreaker"]
    # the iCEBreaker runs engine v2, which reads one weight a cycle for all lanes: every
    # weight in one SPRAM (the other three free for resident data), for any lane count
    assert ice.weight_spram and ice.dataflow == "samples" and ice.lanes == 2
    assert ice.weight_words * ice.lanes == spec.SPRAM_WORDS
    assert not any(b.weight_spram for name, b in spec.BUILDS.items() if name != "icebreaker")
    v2 = dataclasses.replace(ice, lanes=8, weight_words=spec.SPRAM_WORDS // 8)
    text = rtlil.convert(SampleEngine(v2, tally=False), name="core")
    assert text.count("cell \\SB_SPRAM256KA ") == 1
    with pytest.raises(ConfigError, match="weight_words 8193 x lanes 2 = 16386"):
        dataclasses.replace(ice, weight_words=spec.SPRAM_WORDS // 2 + 1)
    # engine v1 on SPRAMs takes one per lane, at most four, of at most SPRAM_WORDS words each
    v1 = dataclasses.replace(ice, dataflow="outputs", weight_words=spec.SPRAM_WORDS)
    with pytest.raises(ConfigError, match="lanes 8"):
        dataclasses.replace(v1, lanes=8)
    with pytest.raises(ConfigError, match="weight_words 16385"):
        dataclasses.replace(v1, weight_words=spec.SPRAM_WORDS + 1)
    # the engine of that build holds its weights in four SPRAMs
    text = rtlil.convert(EngineCore(dataclasses.replace(spec.BUILDS["tiny"], weight_spram=True)),
                         name="core")
    assert text.count("cell \\SB_SPRAM256KA ") == 4


def sim_session_matches_model(build, simulator, layers, weights, steps, x_infer):
    """Configure, load `weights`, train `steps` ((x, y, settings) each) and infer `x_infer` on
    the simulated board and on the model: the correct counts, predictions, weights and exact
    counters must agree. Returns the board's counters."""
    from ember.device import ModelDevice, open_device

    def run(dev):
        dev.configure(layers)
        dev.load_weights(weights)
        correct = [dev.train_batch(x, y, s) for x, y, s in steps]
        return correct, list(dev.infer(x_infer)), dev.read_weights(), dev.read_counters()

    with open_device("sim", build=build, simulator=simulator) as sim:
        a = run(sim)
    b = run(ModelDevice(build))
    assert a[0] == b[0] and a[1] == b[1]
    for l, (wa, wb) in enumerate(zip(a[2], b[2])):
        assert np.array_equal(wa, wb), f"layer {l} weights differ"
    for name in spec.EXACT_COUNTERS:
        assert a[3][name] == b[3][name], f"{name}: sim {a[3][name]} model {b[3][name]}"
    return a[3]


@pytest.mark.rtl
def test_engine_with_spram_weights_matches_model():
    """The iCEBreaker build (weights in an SB_SPRAM256KA per lane) in Icarus through the
    simulated board and the link protocol: weights, predictions and counters equal the
    model's."""
    build = spec.BUILDS["icebreaker"]
    rng = np.random.default_rng(7)
    layers = [13, 9, 6]
    weights = golden.init_weights(layers, 3)
    steps = []
    for settings in (StepSettings(lr_shift=9, zero_skip=True),
                     StepSettings(lr_shift=8, update_mask=(False, True))):
        x = rng.integers(0, 256, size=(5, layers[0]))
        x[rng.random(x.shape) < 0.4] = 0
        steps.append((x, rng.integers(0, layers[-1], size=5), settings))
    x_infer = rng.integers(0, 256, size=(3, layers[0]))

    counters = sim_session_matches_model(build, "icarus", layers, weights, steps, x_infer)
    assert counters["cycles"] > 0


@pytest.mark.rtl
def test_engine_v2_with_its_weights_in_one_spram_matches_model():
    """Engine v2 on the iCEBreaker's sizes and units with every weight in one SB_SPRAM256KA
    (Yosys's model, Verilator) through the simulated board: batches of one sample block (every
    weight-gradient step an update, the single-port waits) and of several give the model's
    weights, predictions and counters. A cycle that read and wrote the SPRAM would lose the
    read (its model writes), and the weights would differ."""
    build = spec.with_dataflow(spec.BUILDS["icebreaker"], "samples")
    assert build.weight_spram and build.weight_words * build.lanes == spec.SPRAM_WORDS
    rng = np.random.default_rng(11)
    layers = [13, 9, 6]
    weights = golden.init_weights(layers, 5)
    steps = []
    for batch, settings in ((2, StepSettings(lr_shift=9, zero_skip=True)),
                            (7, StepSettings(lr_shift=8)),
                            (1, StepSettings(lr_shift=8, update_mask=(True, False)))):
        x = rng.integers(0, 256, size=(batch, layers[0]))
        x[rng.random(x.shape) < 0.4] = 0
        steps.append((x, rng.integers(0, layers[-1], size=batch), settings))
    x_infer = rng.integers(0, 256, size=(3, layers[0]))

    counters = sim_session_matches_model(build, "verilator", layers, weights, steps, x_infer)
    assert counters["weight_writes"] > 0
