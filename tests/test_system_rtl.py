"""System level: the engine's RTL (Verilator and Icarus, under cocotb) driven through its
byte-stream port with the real link protocol by the host's Device API gives the same weights,
predictions and event counters (link bytes included) as the model backend, over random
network shapes (widths that are not multiples of the lane count), data and every method alone
and combined."""

import numpy as np
import pytest

from ember import golden, spec
from ember.device import ModelDevice, open_device
from ember.spec import StepSettings
from ember_sim import rtl
from engine_harness import without_resends

BUILD = spec.BUILDS["tiny"]

METHODS = {
    "baseline": {},
    "zero_skip": {"zero_skip": True},
    "slu": {"update_mask": "random"},
    "ssprop_topk": {"keep_q8": 77},
    "ssprop_random": {"keep_q8": 128, "ssprop_random": True},
    "psg_abs": {"psg": True, "psg_tau": 2, "psg_step_shift": 5},
    "psg_rel": {"psg": True, "psg_relative": True, "psg_tau": 3},
    "all": {"zero_skip": True, "update_mask": "random", "keep_q8": 100, "psg": True},
}


def random_network(rng):
    depth = int(rng.integers(2, 4))
    layers = [int(rng.integers(3, 21))] + [int(rng.integers(2, 17)) for _ in range(depth)]
    return layers


def settings_for(method, rng, n_layers):
    kw = dict(METHODS[method])
    if kw.get("update_mask") == "random":
        kw["update_mask"] = tuple(bool(v) for v in rng.integers(0, 2, n_layers))
    return StepSettings(lr_shift=int(rng.integers(8, 12)),
                        lfsr_seed=int(rng.integers(1, 1 << 16)), **kw)


def run_case(dev, layers, weights, steps, x_infer):
    """Train and infer from cleared counters; the counters are those of a session without
    resent frames (without_resends: a resend is allowed, and taken out of the link bytes)."""
    # before the clear: a resend of the clear itself reaches the device after it
    cleared = dev.link.resend_counts()
    dev.clear_counters()
    dev.configure(layers)
    dev.load_weights(weights)
    correct = [dev.train_batch(x, y, s) for x, y, s in steps]
    pred = dev.infer(x_infer)
    weights = dev.read_weights()
    return correct, pred, weights, without_resends(dev.read_counters(), dev.link, cleared)


@pytest.mark.parametrize("simulator", rtl.simulator_params())
def test_engine_rtl_matches_model(simulator):
    rtl_matches_model(BUILD, simulator, np.random.default_rng(2026))


@pytest.mark.parametrize("simulator", rtl.simulator_params())
def test_engine_v2_rtl_matches_model(simulator):
    """Engine v2 (ember_hw.sample_core) on the simulated board: the host writes each command's
    program, and the RTL answers as the model backend does. Verilator runs the "sim" build
    (32 lanes, batches up to 13); Icarus, some ten times slower on it, runs the 4-lane "tiny"
    build on engine v2 (batches up to 8: two sample blocks), which takes the same paths
    through the same units."""
    if simulator == "verilator":
        v2, max_batch = spec.BUILDS["sim"], 13
    else:
        v2, max_batch = spec.with_dataflow(spec.BUILDS["tiny"], "samples"), None
    rtl_matches_model(v2, simulator, np.random.default_rng(2027), max_batch=max_batch)


def rtl_matches_model(build, simulator, rng, max_batch=None):
    """Every method on a random network and batch: the simulated board and the model give
    the same correct counts, predictions, weights and exact counters."""
    model = ModelDevice(build)
    max_batch = max_batch or build.max_batch
    with open_device("sim", build=build, simulator=simulator) as sim:
        assert sim.identify()["lanes"] == build.lanes
        assert sim.identify()["dataflow"] == build.dataflow
        for method in METHODS:
            layers = random_network(rng)
            batch = int(rng.integers(1, max_batch + 1))
            weights = golden.init_weights(layers, int(rng.integers(1000)))
            steps = []
            for _ in range(2):
                x = rng.integers(0, 256, size=(batch, layers[0]))
                x[rng.random(x.shape) < 0.4] = 0
                y = rng.integers(0, layers[-1], size=batch)
                steps.append((x, y, settings_for(method, rng, len(layers) - 1)))
            x_infer = rng.integers(0, 256, size=(int(rng.integers(1, max_batch + 1)),
                                                 layers[0]))
            a = run_case(sim, layers, weights, steps, x_infer)
            b = run_case(model, layers, weights, steps, x_infer)
            where = f"{method} on {layers}, batch {batch}, {simulator}"
            assert a[0] == b[0], f"correct counts differ ({where})"
            assert list(a[1]) == list(b[1]), f"predictions differ ({where})"
            for l, (wa, wb) in enumerate(zip(a[2], b[2])):
                assert np.array_equal(wa, wb), f"layer {l} weights differ ({where})"
            for name in spec.EXACT_COUNTERS:
                assert a[3][name] == b[3][name], \
                    f"{name}: sim {a[3][name]} model {b[3][name]} ({where})"
            assert a[3]["cycles"] > 0 and b[3]["cycles"] == 0


@pytest.mark.parametrize("simulator", rtl.simulator_params())
def test_board_answers_a_frame(simulator):
    """The simulated board's FIFO path, without the socket: one READ answered."""
    from ember_sim import board
    rtl.run(board.build_board(BUILD, simulator), "ember_sim.benches.board_bench",
            testcase="answers_a_frame")


@pytest.mark.parametrize("simulator", rtl.simulator_params())
def test_counters_of_a_fresh_board_equal_the_model(simulator):
    """Counters read before any command: only the link bytes of the frames so far, as in the
    model (an X in a counter, e.g. from a signal Icarus never evaluated, fails the read)."""
    from ember.device import ModelDevice, open_device
    with open_device("sim", build=BUILD, simulator=simulator) as dev:
        sim = without_resends(dev.read_counters(), dev.link)
    model = ModelDevice(BUILD).read_counters()
    assert {k: sim[k] for k in spec.EXACT_COUNTERS} == {k: model[k] for k in spec.EXACT_COUNTERS}
    assert sim["link_rx_bytes"] > 0


def _train_json(tmp_path, name, *args):
    from ember import cli
    path = tmp_path / f"{name}.json"
    assert cli.main(["train", "--quiet", "--json", str(path), *args]) == 0
    result = __import__("json").loads(path.read_text())
    result.pop("wall_s")
    return result


def _exact(counters):
    return {k: v for k, v in counters.items() if k in spec.EXACT_COUNTERS or k == "skip_smd"}


@pytest.mark.rtl
def test_cli_sim_equals_model_default_network(tmp_path):
    """`ember train --backend sim` and `--backend model`: same weights_sha256 and counters,
    64-32-10 on digits with E2-Train settings plus ssProp and zero skipping (one epoch)."""
    args = ("--preset", "all", "--epochs", "1", "--seed", "3")
    sim = _train_json(tmp_path, "sim", "--backend", "sim", *args)
    model = _train_json(tmp_path, "model", "--backend", "model", *args)
    assert sim["weights_sha256"] == model["weights_sha256"]
    assert _exact(sim["counters"]) == _exact(model["counters"])
    assert _exact(sim["eval_counters"]) == _exact(model["eval_counters"])
    assert sim["test_accuracy"] == model["test_accuracy"]
    assert sim["counters"]["cycles"] > 0 and model["counters"]["cycles"] == 0


@pytest.mark.rtl
@pytest.mark.parametrize("shape, preset", [("12-7-5", "e2train"), ("9-13-6-4", "all")])
def test_cli_sim_equals_model_random_shapes(tmp_path, shape, preset):
    rng = np.random.default_rng(len(shape))
    widths = [int(w) for w in shape.split("-")]
    x = rng.random((60, widths[0]))
    x[x < 0.3] = 0
    y = rng.integers(0, widths[-1], size=60)
    data = tmp_path / "data.npz"
    np.savez(data, X=x, y=y)
    args = ("--preset", preset, "--epochs", "2", "--layers", shape, "--build", "tiny",
            "--batch-size", "8", "--dataset", str(data), "--ssprop-variant", "random",
            "--ssprop-keep", "0.5", "--ssprop-warmup", "0")
    sim = _train_json(tmp_path, "sim", "--backend", "sim", *args)
    model = _train_json(tmp_path, "model", "--backend", "model", *args)
    assert sim["weights_sha256"] == model["weights_sha256"]
    assert _exact(sim["counters"]) == _exact(model["counters"])


@pytest.mark.rtl
def test_uart_bits_on_the_wire():
    """A few training batches with every byte crossing the engine's UART pins as 8N1 bits
    (Verilator), equal to the model backend."""
    rng = np.random.default_rng(5)
    layers = [10, 7, 4]
    weights = golden.init_weights(layers, 1)
    steps = [(rng.integers(0, 256, size=(6, 10)), rng.integers(0, 4, size=6),
              StepSettings(zero_skip=True, psg=bool(i % 2))) for i in range(3)]
    x_infer = rng.integers(0, 256, size=(5, 10))
    model = ModelDevice(BUILD)
    with open_device("sim", build=BUILD, simulator="verilator", uart=True) as sim:
        a = run_case(sim, layers, weights, steps, x_infer)
    b = run_case(model, layers, weights, steps, x_infer)
    assert a[0] == b[0] and list(a[1]) == list(b[1])
    assert all(np.array_equal(p, q) for p, q in zip(a[2], b[2]))
    assert _exact(a[3]) == _exact(b[3])
    assert a[3]["link_rx_bytes"] > 1000
