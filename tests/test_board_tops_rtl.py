"""Each board top end to end through its UART pins with the Device API.

The real tops of ember_boards (ICEBreakerTop, ULX3STop: PLL instance, reset hold, the engine on
the UART pins, the LEDs) with their pins as the ports of the simulated module
(ember_sim.board_sim), in Verilator and Icarus, served by ember_sim.benches.board_bench
(``serve_pins``) and opened with ``open_device("sim", ..., top=board)``: every byte crosses the
top's rx and tx pins as 8N1 bits. Each runs the board's own engine build (the iCEBreaker's
4 lanes with weights in SB_SPRAM256KA, the ULX3S's 32 lanes), so the model it is compared with
is ModelDevice of that build.

What is not the bitstream's netlist: the PLL is modelled (it passes through a clock the bench
drives at the PLL's output frequency and raises LOCK after 64 cycles), the pins' vendor buffer
primitives are Amaranth's generic buffers. The UART runs at the bitstream's rate, the board
build's baud: 3 Mbaud, 8 clock cycles per bit on the iCEBreaker and 10 on the ULX3S.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from ember import golden, spec
from ember.device import ModelDevice, open_device
from ember.schedule import EpochSchedule
from ember.spec import StepSettings
from ember_sim import board_sim, rtl
from engine_harness import without_resends

LAYERS = [12, 8, 4]


def settings_for(build):
    """Zero skipping, PSG and ssProp where the build has those units."""
    return StepSettings(lr_shift=9, zero_skip="zero_skip" in build.features,
                        psg="psg" in build.features,
                        keep_q8=160 if "ssprop" in build.features else spec.KEEP_ONE)


def session(dev, build):
    """identify, configure, load weights, one training batch, infer, read back."""
    rng = np.random.default_rng(11)
    info = dev.identify()
    dev.configure(LAYERS)
    dev.load_weights(golden.init_weights(LAYERS, 4))
    x = rng.integers(0, 256, size=(6, LAYERS[0]))
    x[rng.random(x.shape) < 0.3] = 0
    y = rng.integers(0, LAYERS[-1], size=6)
    correct = dev.train_batch(x, y, settings_for(build))
    predictions = dev.infer(rng.integers(0, 256, size=(5, LAYERS[0])))
    weights = dev.read_weights()
    # a frame the host sent again is counted by the device twice: take it out
    return info, correct, list(predictions), weights, without_resends(dev.read_counters(),
                                                                      dev.link)


def assert_same_weights_and_counters(got, want, where):
    """(weights, counters) of the top against the model's: every layer, every exact counter."""
    for layer, (a, b) in enumerate(zip(got[0], want[0])):
        assert np.array_equal(a, b), f"layer {layer} weights ({where})"
    for name in spec.EXACT_COUNTERS:
        assert got[1][name] == want[1][name], \
            f"{name}: top {got[1][name]} model {want[1][name]} ({where})"


def board_result(log_path):
    """What the bench saw (ember_sim.board prints it last)."""
    lines = [line for line in Path(log_path).read_text().splitlines()
             if line.startswith("board result: ")]
    assert lines, f"no board result in {log_path}"
    return json.loads(lines[-1].removeprefix("board result: "))


#: (simulator, board) of the pins test: every board on Verilator, the iCEBreaker's on Icarus
#: too. Icarus on the ULX3S's 32-lane top took 179 s of CI; the same core runs on Icarus
#: in test_resident and test_system_rtl, and the top's pins on Verilator here.
TOPS = [pytest.param(s, b, id=f"{s}-{b}", marks=pytest.mark.rtl)
        for s in rtl.SIMULATORS for b in board_sim.BOARDS if (s, b) != ("icarus", "ulx3s")]


@pytest.mark.parametrize("simulator, board", TOPS)
def test_board_top_through_its_uart_pins(board, simulator):
    build = spec.BUILDS[board]
    with open_device("sim", build=build, simulator=simulator, top=board) as dev:
        got = session(dev, build)
        log_path = dev.log_path
    want = session(ModelDevice(build), build)
    seen = board_result(log_path)
    where = f"{board} top on {simulator}"

    assert got[0] == want[0] and got[0]["build"] == board, where
    assert got[0]["baud"] == build.baud == 3_000_000, where      # the BAUD register
    assert got[1] == want[1], f"correct count ({where})"
    assert got[2] == want[2], f"predictions ({where})"
    assert_same_weights_and_counters(got[3:], want[3:], where)
    assert got[4]["link_rx_bytes"] > 1000 and got[4]["cycles"] > 0
    assert seen["line_errors"] == [], f"garbled bytes on the tx pin ({where})"

    # LEDs: driven (0 or 1, never x or z) from the end of the reset hold on, all dark then;
    # busy and link_busy lit by the session (their pulses are stretched to millions of
    # cycles, so they are still lit at the end); the heartbeat toggles every 2**24 cycles
    # (2**26 on the ULX3S), far beyond the session, so it only has to stay driven and dark
    for role, led in seen["leds"].items():
        dark, lit = ("1", "0") if led["active_low"] else ("0", "1")
        assert set(led["seen"]) <= {"0", "1"}, f"{role} LED {led} ({where})"
        assert led["start"] == dark, f"{role} LED {led} ({where})"
        if role == "heartbeat":
            assert led["end"] == dark and led["changes"] == 0, f"{role} LED {led} ({where})"
        else:
            assert led["end"] == lit and led["changes"] >= 1, f"{role} LED {led} ({where})"


def resident_session(dev, build):
    """Upload a small data set, one epoch in one command (a dropped batch, SLU masks, PSG and
    ssProp where the build has them), the evaluation, read back."""
    rng = np.random.default_rng(12)
    dev.configure(LAYERS)
    dev.load_weights(golden.init_weights(LAYERS, 5))
    n, batch = 45, 12
    x = rng.integers(0, 256, size=(n + 10, LAYERS[0]))
    x[rng.random(x.shape) < 0.3] = 0
    y = rng.integers(0, LAYERS[-1], size=n + 10)
    dev.load_data(x[:n], y[:n], x[n:], y[n:])
    dev.prepare_epochs(batch)
    batches = -(-n // batch)
    layers = len(LAYERS) - 1
    drops = (False, True) + (False,) * (batches - 2)
    schedule = EpochSchedule(0xBEE5, n, batch, settings_for(build), drops,
                             tuple(None if d else (b % 2 == 0, True)[:layers]
                                   for b, d in enumerate(drops)),
                             tuple(0 if d else int(rng.integers(1, 1 << 16)) for d in drops))
    correct = dev.train_epoch(schedule)
    test_correct = dev.evaluate_resident()
    return correct, test_correct, dev.read_weights(), without_resends(dev.read_counters(),
                                                                      dev.link)


@pytest.mark.rtl
@pytest.mark.parametrize("simulator", ["verilator"])
def test_resident_epoch_through_the_ulx3s_top_pins(simulator):
    """Resident data through the ULX3S top's UART pins: the upload, an epoch in one command
    (its batches gathered while the one before trains) and the evaluation give the model's
    weights, counts and event counters. Verilator only: Icarus runs the same SampleCore's
    resident epochs in tests/test_resident.py and this top's pins in
    test_board_top_through_its_uart_pins, and this session took 134 s of CI on it."""
    build = spec.BUILDS["ulx3s"]
    assert "resident" in build.features
    with open_device("sim", build=build, simulator=simulator, top="ulx3s") as dev:
        got = resident_session(dev, build)
    want = resident_session(ModelDevice(build), build)
    where = f"ulx3s top on {simulator}"
    assert got[:2] == want[:2], f"correct and test_correct ({where})"
    assert_same_weights_and_counters(got[2:], want[2:], where)
    assert got[3]["samples"] > 0 and got[3]["cycles"] > 0


@pytest.mark.parametrize("board", board_sim.BOARDS)
def test_board_top_pins_are_module_ports(board):
    """The simulated top's ports are its board pins (a tiny build elaborates quickly); its
    UART runs at the board's bitstream's rate (its clock and baud, whatever the build)."""
    text, top = board_sim.board_verilog(board, spec.BUILDS["tiny"])
    header = text[text.index(f"module {top.toplevel}("):].split(";", 1)[0]
    pins = {top.clock, top.rx, top.tx, *(pin for pin, _ in top.leds.values())}
    assert pins == {p.strip() for p in header.split("(", 1)[1].rstrip(")").split(",")}
    assert f"input {top.clock};" in text and f"input {top.rx};" in text
    assert f"output {top.tx};" in text
    assert ("SB_PLL40_PAD" if board == "icebreaker" else "EHXPLLL") in text
    assert top.clock_hz == spec.BUILDS[board].clock_hz
    assert top.divisor == {"icebreaker": 8, "ulx3s": 10}[board] == board_sim.DEFAULT_DIVISOR[board]
    assert top.build.baud == spec.BUILDS[board].baud == top.clock_hz / top.divisor
    # another divisor: the build's baud (the BAUD register) follows it
    _, fast = board_sim.board_verilog(board, spec.BUILDS["tiny"], divisor=5)
    assert fast.divisor == 5 and fast.build.baud == spec.BUILDS[board].clock_hz // 5
