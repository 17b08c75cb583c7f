"""`make bench` runs end to end on its smoke configuration (the figures are not asserted:
benchmarks measure, tests check)."""

import json

import pytest

from ember import bench


@pytest.mark.rtl
def test_bench_quick_runs(tmp_path):
    assert bench.main(["--quick", "--out", str(tmp_path)]) == 0
    r = json.loads((tmp_path / "results.json").read_text())
    assert set(r["configs"]) == set(bench.CONFIGS)
    assert r["configs"]["ember-all"]["sim_checked"] == 1
    assert r["configs"]["baseline"]["energy_ratio"] == 1.0
    assert r["configs"]["ember-all"]["energy_ratio"] < 1.0
    e = r["engine"]
    assert e["cycles_per_train_sample"] > 0 and 0 < e["utilization"]["forward"] <= 1
    assert e["sim_cycles_per_s"]["verilator"] > 0 and e["sim_cycles_per_s"]["icarus"] > 0
    assert (tmp_path / "results.md").read_text().startswith("| configuration")
    assert (tmp_path / "accuracy_energy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_energy_to_accuracy():
    history = [{"test_accuracy": 0.5, "energy_pj": 1.0}, {"test_accuracy": 0.9, "energy_pj": 2.0},
               {"test_accuracy": 0.95, "energy_pj": 3.0}]
    assert bench.energy_to_accuracy(history, 0.9) == 2.0
    assert bench.energy_to_accuracy(history, 0.96) is None
