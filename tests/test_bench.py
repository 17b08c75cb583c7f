"""`make bench` runs end to end on its smoke configuration (the figures are not asserted:
benchmarks measure, tests check)."""

import json

import pytest

from ember import bench, energy, spec


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
    v2 = r["engine_v2"]
    assert v2["batch"] == 8 and all(0 < u <= 1 for u in v2["utilization"].values())
    assert 0 < v2["weight_reads_per_train_sample"] < v2["v1_weight_reads_per_train_sample"]
    assert 0 < v2["dense_pj_per_sample"] and 0 < v2["v1_dense_pj_per_sample"]
    assert (tmp_path / "results.md").read_text().startswith("| configuration")
    assert r["setup"]["profiles"] == list(bench.BENCH_PROFILES)
    assert all(r["profiles"][p]["baseline"]["energy_ratio"] == 1.0 for p in bench.BENCH_PROFILES)
    table = (tmp_path / "results.md").read_text()
    assert "ice40up5k: energy / baseline" in table and "ecp5-85f: energy / baseline" in table
    assert (tmp_path / "accuracy_energy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_energy_to_accuracy():
    history = [{"test_accuracy": 0.5, "energy_pj": 1.0}, {"test_accuracy": 0.9, "energy_pj": 2.0},
               {"test_accuracy": 0.95, "energy_pj": 3.0}]
    assert bench.energy_to_accuracy(history, 0.9) == 2.0
    assert bench.energy_to_accuracy(history, 0.96) is None


def test_profile_ratios_recost_the_same_counters_under_each_profile():
    # two configurations: "smd" drops half the batches (half the MACs and half the link
    # bytes), "psg" skips half the MACs but moves every byte
    dense = {"mac_forward": 1000, "weight_reads": 1000, "link_rx_bytes": 500}
    half_work = dict(dense, mac_forward=500, weight_reads=500)
    runs = {"baseline": [{"model": {"counters": dense}}],
            "smd": [{"model": {"counters": {k: v // 2 for k, v in dense.items()}}}],
            "psg": [{"model": {"counters": half_work}}]}
    r = bench.profile_ratios(runs)
    assert list(r) == list(bench.BENCH_PROFILES)
    # horowitz45 charges no link: both halve the energy
    assert r["horowitz45"]["smd"]["energy_ratio"] == pytest.approx(0.5)
    assert r["horowitz45"]["psg"]["energy_ratio"] == pytest.approx(0.5)
    # ice40up5k: the link dominates, so skipping work without skipping bytes saves little
    m = energy.EnergyModel("ice40up5k", spec.BUILDS["icebreaker"])
    assert r["ice40up5k"]["psg"]["energy_ratio"] == pytest.approx(
        m.total(half_work) / m.total(dense))
    assert r["ice40up5k"]["psg"]["energy_ratio"] > 0.99
    assert r["ice40up5k"]["smd"]["energy_ratio"] == pytest.approx(0.5)
    assert r["ice40up5k"]["smd"]["rank"] == 1 and r["ice40up5k"]["baseline"]["rank"] == 3
    assert r["ice40up5k"]["baseline"]["link_share"] > 0.99
    # without the link, the FPGA profile sees psg's saved MACs again (memory is not costed)
    assert r["ice40up5k"]["psg"]["compute_ratio"] == pytest.approx(0.5)
    # ecp5-85f, costed at the ULX3S build: the board's idle power over the byte times leads
    ulx = energy.EnergyModel("ecp5-85f", spec.BUILDS["ulx3s"])
    assert r["ecp5-85f"]["psg"]["energy_ratio"] == pytest.approx(
        ulx.total(half_work) / ulx.total(dense))
    assert r["ecp5-85f"]["psg"]["energy_ratio"] > 0.9999
    assert r["ecp5-85f"]["smd"]["energy_ratio"] == pytest.approx(0.5)
    assert r["ecp5-85f"]["baseline"]["link_share"] > 0.9999
    assert r["ecp5-85f"]["psg"]["compute_ratio"] == pytest.approx(0.5)
    table = bench.profile_markdown(r)
    assert "| psg | 0.500 (1) | " in table or "| psg | 0.500 (2) | " in table
    assert table.splitlines()[0].count("energy / baseline (rank)") == 3
