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
    dev.clear_counters()
    dev.configure(layers)
    dev.load_weights(weights)
    correct = [dev.train_batch(x, y, s) for x, y, s in steps]
    pred = dev.infer(x_infer)
    return correct, pred, dev.read_weights(), dev.read_counters()


@pytest.mark.parametrize("simulator", rtl.simulator_params())
def test_engine_rtl_matches_model(simulator):
    rng = np.random.default_rng(2026)
    model = ModelDevice(BUILD)
    with open_device("sim", build=BUILD, simulator=simulator) as sim:
        assert sim.identify()["lanes"] == BUILD.lanes
        for method in METHODS:
            layers = random_network(rng)
            batch = int(rng.integers(1, BUILD.max_batch + 1))
            weights = golden.init_weights(layers, int(rng.integers(1000)))
            steps = []
            for _ in range(2):
                x = rng.integers(0, 256, size=(batch, layers[0]))
                x[rng.random(x.shape) < 0.4] = 0
                y = rng.integers(0, layers[-1], size=batch)
                steps.append((x, y, settings_for(method, rng, len(layers) - 1)))
            x_infer = rng.integers(0, 256, size=(int(rng.integers(1, BUILD.max_batch + 1)),
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
