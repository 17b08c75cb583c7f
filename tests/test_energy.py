"""The energy model reproduces its source's points and interpolates as documented."""

import json
from dataclasses import replace

import pytest

from ember import energy, spec
from ember.spec import ConfigError


def test_profile_points_are_reproduced():
    p = energy.load_profile("horowitz45")
    assert energy.add_pj(p, 8) == pytest.approx(0.03)
    assert energy.add_pj(p, 32) == pytest.approx(0.1)
    assert energy.mult_pj(p, 8, 8) == pytest.approx(0.2)
    assert energy.mult_pj(p, 32, 32) == pytest.approx(3.1)
    assert energy.sram_pj(p, 8192, 64) == pytest.approx(10.0)
    assert energy.sram_pj(p, 32768, 64) == pytest.approx(20.0)
    assert energy.sram_pj(p, 1 << 20, 64) == pytest.approx(100.0)
    # log-size interpolation: 16 KiB is half way (in octaves) from 8 to 32 KiB
    assert energy.sram_pj(p, 16384, 64) == pytest.approx(15.0)
    assert energy.sram_pj(p, 16384, 16) == pytest.approx(3.75)


def test_every_costed_event_is_a_counter_and_totals_add_up():
    m = energy.EnergyModel()
    assert set(m.per_event) <= set(spec.COUNTERS)
    counters = {k: i + 1 for i, k in enumerate(spec.COUNTERS)}
    assert sum(m.grouped(counters).values()) == pytest.approx(m.total(counters))
    assert m.per_event["mac_weight_grad_low"] < m.per_event["mac_weight_grad"]


def test_custom_and_bad_profiles(tmp_path):
    p = energy.load_profile("horowitz45")
    p["name"] = "double"
    p["int_mult_pj"] = {"8": 0.4, "32": 6.2}
    path = tmp_path / "double.json"
    path.write_text(json.dumps(p))
    assert energy.load_profile(str(path))["name"] == "double"
    with pytest.raises(ConfigError, match="no bundled energy profile named 'nope'"):
        energy.load_profile("nope")
    path.write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        energy.load_profile(str(path))


# --- FPGA profiles (issue 16, item 4) ----------------------------------------------------------

ICE = spec.BUILDS["icebreaker"]
ULX = spec.BUILDS["ulx3s"]


@pytest.mark.parametrize("name", ["horowitz45", "ice40up5k", "ecp5-85f"])
def test_bundled_profiles_load_with_a_source_for_every_figure(name):
    p = energy.load_profile(name)
    assert name in energy.bundled_profiles()
    keys = energy.PROFILE_KEYS[p.get("kind", "asic")]
    assert p["source"]
    # every figure has its note (source or method) next to it
    assert set(keys) - {"bram_width_bits", "spram_width_bits"} <= set(p["notes"])


def test_fpga_profile_costs_per_operation_not_by_width_or_size():
    m = energy.EnergyModel("ice40up5k", ICE)
    p = m.profile
    add_bit = p["logic_add_pj_per_bit"]
    # a DSP multiply does not scale with a*b: the lanes' 16x8 and 16x16 MACs differ only in
    # their accumulators' widths
    assert m.per_event["mac_forward"] == pytest.approx(p["dsp_mult_pj"] + add_bit * ICE.lane_acc_bits())
    assert m.per_event["mac_input_grad"] == pytest.approx(p["dsp_mult_pj"] + add_bit * ICE.dx_acc_bits())
    assert m.per_event["loss_elements"] == pytest.approx(2 * p["dsp_mult_pj"] + 96 * add_bit)


def test_memory_costs_per_access_of_the_block_width_spram_for_spram_weights():
    p = energy.load_profile("ice40up5k")
    p.update(bram_access_pj=3.0, spram_access_pj=5.0)
    ice = energy.EnergyModel(p, ICE)                       # weights in SPRAM
    ulx = energy.EnergyModel(p, spec.BUILDS["ulx3s"])       # weights in block RAM
    assert ICE.weight_spram and not spec.BUILDS["ulx3s"].weight_spram
    assert ice.per_event["weight_reads"] == 5.0
    assert ulx.per_event["weight_reads"] == 3.0
    assert ice.per_event["act_reads"] == 3.0                # 8 bits: one 16-bit access
    assert ice.per_event["grad_reads"] == 6.0               # 32-bit dX entry: two accesses
    # not by log2(size): the same access on every build
    assert ice.per_event["grad_lane_reads"] == ulx.per_event["grad_lane_reads"] == 3.0


def test_static_energy_is_cycles_times_static_power_over_the_build_clock():
    p = energy.load_profile("ice40up5k")
    p["clock_pj_per_cycle"] = 0.0                           # static power alone
    cycles = 1_000_003
    for build in (ICE, replace(ICE, clock_hz=12_000_000)):
        m = energy.EnergyModel(p, build)
        expected_pj = cycles * p["static_mw"] * 1e-3 / build.clock_hz * 1e12
        assert m.total({"cycles": cycles}) == pytest.approx(expected_pj)
        assert m.grouped({"cycles": cycles})["clock"] == pytest.approx(expected_pj)
    # the clock is the build's own (spec.BUILDS, the PLL's target), not a number of the profile
    assert energy.EnergyModel(p, ICE).per_event["cycles"] == pytest.approx(
        p["static_mw"] * 1e9 / 24_000_000)
    full = energy.load_profile("ice40up5k")
    assert energy.EnergyModel(full, ICE).per_event["cycles"] == pytest.approx(
        full["static_mw"] * 1e9 / ICE.clock_hz + full["clock_pj_per_cycle"])


def test_link_byte_is_the_chip_and_bridge_power_over_a_byte_time_at_the_baud():
    p = energy.load_profile("ice40up5k")
    p["link_mw"] = 2.0
    m = energy.EnergyModel(p, ICE)
    chip_mw = p["static_mw"] + p["clock_pj_per_cycle"] * ICE.clock_hz * 1e-9
    byte_s = 10 / ICE.baud                  # the iCEBreaker's 3 Mbaud: 3.33 us a byte
    assert ICE.baud == 3_000_000
    assert m.per_event["link_rx_bytes"] == pytest.approx((2.0 + chip_mw) * 1e-3 * byte_s * 1e12)
    assert m.per_event["link_tx_bytes"] == m.per_event["link_rx_bytes"]
    # the same profile on the same build at the generic port's 115200 baud: 26 x the time
    slow = energy.EnergyModel(p, replace(ICE, baud=spec.DEFAULT_BAUD))
    assert slow.per_event["link_rx_bytes"] == pytest.approx(
        m.per_event["link_rx_bytes"] * ICE.baud / spec.DEFAULT_BAUD)


def test_horowitz45_is_unchanged_and_the_default_off_the_boards():
    assert energy.profile_for(spec.BUILDS["sim"]) == "horowitz45"
    assert energy.profile_for(spec.BUILDS["tiny"]) == "horowitz45"
    assert energy.profile_for(ICE) == "ice40up5k"
    assert energy.profile_for(ULX) == "ecp5-85f"
    assert energy.build_for("ecp5-85f") is ULX and energy.build_for("ice40up5k") is ICE
    assert energy.EnergyModel(None).per_event == energy.EnergyModel("horowitz45").per_event
    e = energy.EnergyModel("horowitz45").per_event
    # the figures docs/energy.md quotes: 16x8 multiply + 48-bit add, no link or clock energy
    assert e["mac_forward"] == pytest.approx(0.3933 + 0.1467, abs=1e-3)
    assert e["link_rx_bytes"] == e["cycles"] == 0.0


@pytest.mark.parametrize("change, message", [
    (lambda p: p.pop("static_mw"), "lacks 'static_mw'"),
    (lambda p: p.pop("dsp_mult_pj"), "lacks 'dsp_mult_pj'"),
    (lambda p: p.update(static_mw=-0.1), "'static_mw' is -0.1; it must be >= 0"),
    (lambda p: p.update(link_mw="fast"), "'link_mw' is 'fast'; it must be a number"),
    (lambda p: p.update(bram_width_bits=0), "'bram_width_bits' is 0; a block is at least 1"),
    (lambda p: p.update(kind="gpu"), "'kind' is 'gpu'"),
])
def test_bad_fpga_profile_names_the_key(tmp_path, change, message):
    p = energy.load_profile("ice40up5k")
    change(p)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(p))
    with pytest.raises(ConfigError, match=message):
        energy.load_profile(str(path))


def test_bad_asic_profile_names_the_nested_key():
    p = energy.load_profile("horowitz45")
    p["sram_read_64b_pj"]["8192"] = -10.0
    with pytest.raises(ConfigError, match=r"'sram_read_64b_pj.8192' is -10.0; it must be >= 0"):
        energy.EnergyModel(p)
    del p["int_add_pj"]
    with pytest.raises(ConfigError, match="lacks 'int_add_pj'"):
        energy.check_profile(p, "p")


# --- ecp5-85f: the ULX3S's LFE5U-85F, from fpga-reg-power's board-level measurements ----------

#: github.com/targeted/fpga-reg-power, docs/power_data.ods, row "ulx3s": flip-flops in the chain,
#: the board's idle power (W, design in reset) and its volts and amps at 25 MHz
REG_CHAIN, IDLE_W, V_25MHZ, A_25MHZ = 83_640, 0.202, 5.313, 0.1248
#: flip-flops of the ULX3S build (nextpnr, docs/boards.md session 14, 41c789d)
ULX_FLIP_FLOPS = 11_689


def test_ecp5_figures_are_the_arithmetic_of_their_notes():
    p = energy.load_profile("ecp5-85f")
    assert p["kind"] == "fpga"
    per_register_pj = (V_25MHZ * A_25MHZ - IDLE_W) / REG_CHAIN / 25e6 * 1e12
    assert per_register_pj == pytest.approx(0.2205, abs=1e-4)
    assert p["logic_add_pj_per_bit"] == pytest.approx(per_register_pj, rel=1e-3)
    assert p["static_mw"] == pytest.approx(IDLE_W * 1e3)
    assert p["clock_pj_per_cycle"] == pytest.approx(ULX_FLIP_FLOPS * per_register_pj, rel=1e-3)
    # not in the source, or not on the chip: excluded, each with its note
    for key in ("dsp_mult_pj", "bram_access_pj", "spram_access_pj", "link_mw"):
        assert p[key] == 0.0 and p["notes"][key]
    assert p["bram_width_bits"] == 18                        # DP16KD as 1,024 x 18
    assert not ULX.weight_spram                              # the ECP5 has no SPRAM


def test_ecp5_per_event_costs_at_the_ulx3s_build():
    m = energy.EnergyModel("ecp5-85f", ULX)
    p = m.profile
    add_bit = p["logic_add_pj_per_bit"]
    # no DSP figure: a MAC is its accumulator add, at the build's accumulator widths
    assert m.per_event["mac_forward"] == pytest.approx(add_bit * ULX.lane_acc_bits())
    assert m.per_event["mac_input_grad"] == pytest.approx(add_bit * ULX.dx_acc_bits())
    assert m.per_event["weight_reads"] == m.per_event["grad_reads"] == 0.0
    # a cycle: 202 mW over one 30 MHz period plus the flip-flops' clock estimate
    assert ULX.clock_hz == 30_000_000
    cycle_pj = 202e-3 / 30e6 * 1e12 + p["clock_pj_per_cycle"]
    assert m.per_event["cycles"] == pytest.approx(cycle_pj)
    # a link byte: the board's power (static and clock) over 10 bits at 3 Mbaud
    board_mw = p["static_mw"] + p["clock_pj_per_cycle"] * ULX.clock_hz * 1e-9
    assert m.per_event["link_rx_bytes"] == pytest.approx(board_mw * 1e-3 * 10 / ULX.baud * 1e12)
    assert m.per_event["link_rx_bytes"] > 1e5 * m.per_event["mac_forward"]


def _run(build, digits, profile=None, resident="off"):
    from ember.device import ModelDevice
    from ember.policies import make_config
    from ember.trainer import Trainer
    cfg = make_config("baseline", epochs=1, batch_size=16, profile=profile)
    return Trainer(ModelDevice(build), digits, cfg, progress=False, resident=resident).run()


def test_a_board_build_run_reports_its_board_profile_and_horowitz45(digits):
    r = _run(ICE, digits)
    assert r["profile"] == r["settings"]["profile"] == "ice40up5k"
    assert set(r["energy_by_profile"]) == {"ice40up5k", "horowitz45"}
    for name, rep in r["energy_by_profile"].items():
        m = energy.EnergyModel(name, ICE)
        assert rep["energy_pj"] == pytest.approx(m.total(r["counters"]))
        assert rep["energy_breakdown"] == pytest.approx(m.grouped(r["counters"]))
    assert r["energy_pj"] == pytest.approx(r["energy_by_profile"]["ice40up5k"]["energy_pj"])
    # the link moved the data: under the FPGA profile it is most of the energy, under the
    # ASIC profile none of it
    ice = r["energy_by_profile"]["ice40up5k"]["energy_breakdown"]
    assert ice["link"] > 0.5 * r["energy_pj"]
    assert r["energy_by_profile"]["horowitz45"]["energy_breakdown"]["link"] == 0.0
    # saved compares compute and memory only: the dense step moves no bytes, runs no cycles
    h = r["energy_by_profile"]["horowitz45"]
    assert h["saved_pj"] == pytest.approx(h["dense_energy_pj"] - h["energy_pj"])
    assert h["dense_energy_pj"] == pytest.approx(
        _run(ICE, digits, "horowitz45")["dense_energy_pj"])


def test_an_explicit_profile_wins_and_the_sim_build_stays_on_horowitz45(digits):
    r = _run(ICE, digits, "horowitz45")
    assert r["profile"] == "horowitz45"
    assert list(r["energy_by_profile"]) == ["horowitz45", "ice40up5k"]
    s = _run(spec.BUILDS["sim"], digits)
    assert s["profile"] == "horowitz45" and list(s["energy_by_profile"]) == ["horowitz45"]
    assert s["saved_pj"] == pytest.approx(s["dense_energy_pj"] - s["energy_pj"])


def test_a_ulx3s_build_run_reports_ecp5_85f_and_horowitz45(digits):
    r = _run(ULX, digits)
    assert r["profile"] == r["settings"]["profile"] == "ecp5-85f"
    assert list(r["energy_by_profile"]) == ["ecp5-85f", "horowitz45"]
    for name, rep in r["energy_by_profile"].items():
        m = energy.EnergyModel(name, ULX)
        assert rep["energy_pj"] == pytest.approx(m.total(r["counters"]))
    assert r["energy_pj"] == pytest.approx(r["energy_by_profile"]["ecp5-85f"]["energy_pj"])
    # streamed, the board's idle power over the link's byte times is nearly all of it
    ecp5 = r["energy_by_profile"]["ecp5-85f"]["energy_breakdown"]
    assert ecp5["link"] > 0.99 * r["energy_pj"]
    # with the data resident (the upload apart) the same work costs a small part of it
    held = _run(ULX, digits, resident="on")
    assert held["weights_sha256"] == r["weights_sha256"]
    assert held["energy_by_profile"]["ecp5-85f"]["energy_pj"] < 0.01 * r["energy_pj"]
    # the resident run reads its data memory (an ASIC charges it, the ECP5's block RAM is
    # priced 0), and so does its dense baseline: with every batch kept, the same saving
    h_held = held["energy_by_profile"]["horowitz45"]
    h_stream = r["energy_by_profile"]["horowitz45"]
    assert h_stream["energy_breakdown"]["data_memory"] == 0.0
    data_pj = h_held["energy_breakdown"]["data_memory"]
    assert data_pj == pytest.approx(held["counters"]["data_reads"]
                                    * energy.EnergyModel("horowitz45", ULX)
                                    .per_event["data_reads"]) and data_pj > 0
    assert h_held["energy_pj"] == pytest.approx(h_stream["energy_pj"] + data_pj)
    assert h_held["dense_energy_pj"] == pytest.approx(h_stream["dense_energy_pj"] + data_pj)
    assert h_held["saved_pj"] == pytest.approx(h_stream["saved_pj"])
