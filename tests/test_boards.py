"""Board tops and the bitstream build script, without running synthesis: PLL parameters, UART
divisors, reset hold, elaboration of each top to RTLIL with its constraints, and the parsers
that read nextpnr's output."""

import dataclasses
import json

import pytest
from amaranth import Fragment, Module, ResetSignal, Signal
from amaranth.sim import Simulator

from ember import spec
from ember_boards import build as board_build
from ember_boards import icebreaker, ulx3s
from ember_boards.common import engine_domain
from ember_boards.pll import (ECP5_PFD_HZ, ECP5_VCO_HZ, ICE40_PFD_HZ, ICE40_VCO_HZ, ecp5_pll,
                              ice40_pll)
from ember_hw.uart import uart_divisor


def ice40_out(f_in, p):
    return f_in * (p["DIVF"] + 1) / ((p["DIVR"] + 1) * 2 ** p["DIVQ"])


def ecp5_out(f_in, p):
    return f_in * p["CLKFB_DIV"] / p["CLKI_DIV"]


# ---------------------------------------------------------------------------------------- PLLs

def test_ice40_pll_hits_the_icebreaker_target_exactly():
    cfg = ice40_pll(icebreaker.BOARD_CLOCK_HZ, spec.BUILDS["icebreaker"].clock_hz)
    assert cfg.params == {"DIVR": 0, "DIVF": 63, "DIVQ": 5, "FILTER_RANGE": 1}
    assert cfg.f_out_hz == spec.BUILDS["icebreaker"].clock_hz == 24_000_000


def test_ecp5_pll_hits_the_ulx3s_target_exactly():
    cfg = ecp5_pll(ulx3s.BOARD_CLOCK_HZ, spec.BUILDS["ulx3s"].clock_hz)
    assert cfg.f_out_hz == spec.BUILDS["ulx3s"].clock_hz == 30_000_000
    assert cfg.params["CLKOP_CPHASE"] == cfg.params["CLKOP_DIV"] - 1
    # the VCO near the middle of its 400..800 MHz range, not at an edge
    assert cfg.f_vco_hz == 600e6


@pytest.mark.parametrize("target_mhz", [16, 20, 24, 30, 33, 36, 40, 42, 48, 50, 60, 66, 72, 100])
def test_ice40_pll_is_legal_and_close(target_mhz):
    f_in, target = 12e6, target_mhz * 1e6
    cfg = ice40_pll(f_in, target)
    p = cfg.params
    assert cfg.f_out_hz == pytest.approx(ice40_out(f_in, p))
    assert ICE40_PFD_HZ[0] <= f_in / (p["DIVR"] + 1) <= ICE40_PFD_HZ[1]
    assert ICE40_VCO_HZ[0] <= cfg.f_vco_hz <= ICE40_VCO_HZ[1]
    assert 1 <= p["FILTER_RANGE"] <= 6
    assert cfg.error(target) < 0.01


@pytest.mark.parametrize("target_mhz", [25, 40, 48, 50, 62.5, 75, 80, 100, 125, 150])
def test_ecp5_pll_is_legal_and_close(target_mhz):
    f_in, target = 25e6, target_mhz * 1e6
    cfg = ecp5_pll(f_in, target)
    p = cfg.params
    assert cfg.f_out_hz == pytest.approx(ecp5_out(f_in, p))
    assert ECP5_PFD_HZ[0] <= f_in / p["CLKI_DIV"] <= ECP5_PFD_HZ[1]
    assert ECP5_VCO_HZ[0] <= cfg.f_vco_hz == pytest.approx(cfg.f_out_hz * p["CLKOP_DIV"])
    assert cfg.f_vco_hz <= ECP5_VCO_HZ[1]
    assert cfg.error(target) < 0.03


def test_ecp5_pll_48mhz_is_the_closest_legal_setting():
    # 48 = 25 * 48/25 needs a 1 MHz PFD (below 3.125); 25 * 15/8 = 46.875 is the nearest
    assert ecp5_pll(25e6, 48e6).f_out_hz == 46.875e6


def test_pll_rejects_out_of_range():
    with pytest.raises(ValueError, match="outside"):
        ice40_pll(12e6, 300e6)
    with pytest.raises(ValueError, match="outside"):
        ice40_pll(5e6, 36e6)
    with pytest.raises(ValueError, match="outside"):
        ecp5_pll(25e6, 1e6)


# ---------------------------------------------------------------------------------------- UART

def test_uart_divisors_of_the_board_clocks():
    assert uart_divisor(36_000_000, spec.DEFAULT_BAUD) == 312
    assert uart_divisor(100_000_000, spec.DEFAULT_BAUD) == 868
    for divisor, clk in ((312, 36e6), (868, 100e6)):
        assert abs(clk / divisor - spec.DEFAULT_BAUD) / spec.DEFAULT_BAUD < 0.005
    # the boards' own rates at their PLL clocks: 3 Mbaud, 8 and 10 cycles per bit, exact
    assert uart_divisor(spec.BUILDS["icebreaker"].clock_hz, spec.BUILDS["icebreaker"].baud) == 8
    assert uart_divisor(spec.BUILDS["ulx3s"].clock_hz, spec.BUILDS["ulx3s"].baud) == 10


# ---------------------------------------------------------------------------------------- reset

def test_reset_held_until_lock_and_hold_time():
    m = Module()
    pll_clk, lock = Signal(), Signal()
    engine_domain(m, pll_clk, lock, hold_cycles=16)
    rst = Signal()
    m.d.comb += rst.eq(ResetSignal("sync"))
    sim = Simulator(m)
    seen = {}

    async def testbench(ctx):
        async def cycles(n):
            for _ in range(n):
                ctx.set(pll_clk, 1)
                await ctx.delay(5e-9)
                ctx.set(pll_clk, 0)
                await ctx.delay(5e-9)

        await cycles(40)
        seen["before_lock"] = ctx.get(rst)
        ctx.set(lock, 1)
        await cycles(10)
        seen["during_hold"] = ctx.get(rst)
        await cycles(20)
        seen["after_hold"] = ctx.get(rst)
        ctx.set(lock, 0)
        await ctx.delay(1e-9)
        seen["lock_lost"] = ctx.get(rst)

    sim.add_testbench(testbench)
    sim.run()
    assert seen == {"before_lock": 1, "during_hold": 1, "after_hold": 0, "lock_lost": 1}


# ---------------------------------------------------------------------------------------- tops

def small_build(board):
    # the tiny engine elaborates in a second; the board's clock and baud keep the real PLL
    # setting and UART
    return dataclasses.replace(spec.BUILDS["tiny"], clock_hz=spec.BUILDS[board].clock_hz,
                               baud=spec.BUILDS[board].baud)


@pytest.mark.parametrize("board, top_class", [("icebreaker", icebreaker.ICEBreakerTop),
                                               ("ulx3s", ulx3s.ULX3STop)])
def test_top_builds_its_uart_at_the_builds_baud(board, top_class):
    """The UART the elaborated top holds runs within 0.5 % of its build's baud at the clock
    its PLL gives (both boards: exactly)."""
    plat = icebreaker.platform() if board == "icebreaker" else ulx3s.platform()
    top = top_class(small_build(board))
    Fragment.get(top, plat)
    engine = top.engine
    assert engine.divisor == {"icebreaker": 8, "ulx3s": 10}[board]
    rate = top.clock_hz / engine.divisor
    assert abs(rate / spec.BUILDS[board].baud - 1) < 0.005
    assert rate == spec.BUILDS[board].baud


def test_icebreaker_top_elaborates_with_pins_and_pll():
    plat = icebreaker.platform()
    top = icebreaker.ICEBreakerTop(small_build("icebreaker"))
    plan = plat.prepare(top, name="top", debug_verilog=False, synth_opts="-dsp")
    il, pcf, ys = (plan.files[f] for f in ("top.il", "top.pcf", "top.ys"))
    assert "SB_PLL40_PAD" in il and "DIVF" in il
    for line in ("set_io clk12_0__io 35", "set_io uart_0__rx__io 6", "set_io uart_0__tx__io 9",
                 "set_io led_r_0__io 11", "set_io led_g_0__io 37", "set_frequency clk12_0__io 12"):
        assert line in pcf
    assert "synth_ice40 -dsp" in ys


def test_ulx3s_top_elaborates_with_pins_and_pll():
    plat = ulx3s.platform()
    top = ulx3s.ULX3STop(small_build("ulx3s"))
    plan = plat.prepare(top, name="top", debug_verilog=False)
    il, lpf = plan.files["top.il"], plan.files["top.lpf"]
    assert "EHXPLLL" in il and "CLKFB_DIV" in il
    for site in ('"uart_0__rx__io" SITE "M1"', '"uart_0__tx__io" SITE "L4"',
                 '"clk25_0__io" SITE "G2"', '"led_0__io" SITE "B2"', '"led_7__io" SITE "H3"'):
        assert site in lpf
    assert 'FREQUENCY PORT "clk25_0__io" 25000000' in lpf


def test_ulx3s_builds_without_openfpgaloader():
    tools = ulx3s.platform().required_tools
    assert "openFPGALoader" not in tools
    assert {"yosys", "nextpnr-ecp5", "ecppack"} <= set(tools)


# ---------------------------------------------------------------------------------------- reports

NEXTPNR_LOG = """\
Info: Device utilisation:
Info: 	         ICESTORM_LC:  11979/  5280   226%
Info: 	        ICESTORM_RAM:     21/    30    70%
Info: 	        ICESTORM_DSP:     12/     8   150%
Info: Max frequency for clock 'clk12_0__io': 300.00 MHz (PASS at 12.00 MHz)
Info: Max frequency for clock 'clk': 31.50 MHz (FAIL at 36.00 MHz)
Info: Max frequency for clock 'clk': 33.25 MHz (FAIL at 36.00 MHz)
ERROR: Unable to place cell 'x', no BELs remaining to implement cell type 'ICESTORM_DSP'
"""


def test_parse_nextpnr_log():
    got = board_build.parse_nextpnr_log(NEXTPNR_LOG)
    assert got["utilization"]["ICESTORM_LC"] == {"used": 11979, "available": 5280}
    assert got["utilization"]["ICESTORM_DSP"] == {"used": 12, "available": 8}
    # the routed figure (printed last) wins over the placed one
    assert got["clocks"]["clk"] == {"achieved_mhz": 33.25, "constraint_mhz": 36.0}
    assert got["errors"] == [NEXTPNR_LOG.splitlines()[-1]]
    assert board_build._engine_clock(got["clocks"], 36.0) == "clk"


def test_summarize_nextpnr_report():
    step = {"cell": "a", "port": "Q", "loc": [1, 2]}
    report = {
        "fmax": {"$glbnet$clk": {"achieved": 41.5, "constraint": 36.0}},
        "utilization": {"ICESTORM_LC": {"used": 5000, "available": 5280}},
        "critical_paths": [{"from": "posedge $glbnet$clk", "to": "posedge $glbnet$clk", "path": [
            {"type": "clk-to-q", "delay": 0.5, "from": step, "to": step},
            {"type": "routing", "delay": 2.0, "net": "n1", "from": step, "to": step},
            {"type": "logic", "delay": 0.25, "from": step, "to": {**step, "cell": "b"}},
        ]}],
    }
    got = board_build.summarize_report(json.loads(json.dumps(report)))
    assert got["clocks"] == {"$glbnet$clk": {"achieved_mhz": 41.5, "constraint_mhz": 36.0}}
    path = got["critical_paths"][0]
    assert path["delay_ns"] == 2.75 and path["logic_levels"] == 1
    assert (path["start_cell"], path["end_cell"]) == ("a", "b")
    assert path["slowest_nets"] == [{"net": "n1", "delay_ns": 2.0}]


def test_build_report_names_the_units_built(tmp_path):
    """`--features` builds the board's engine with fewer optional units; report.json says
    which (report-only mode: no tool runs)."""
    from ember_boards import build as board_build
    report, _ = board_build.build("ulx3s", tmp_path, run_tools=False,
                                  features=["zero_skip", "slu"])
    assert report["features"] == ["zero_skip", "slu"]
    assert report["build"] == "ulx3s" and report["lanes"] == 32
    full, _ = board_build.build("ulx3s", tmp_path, run_tools=False)
    assert full["features"] == list(spec.FEATURES)             # resident data included
    # the iCEBreaker's own build leaves out PSG and ssProp (the UP5K's size)
    ice, _ = board_build.build("icebreaker", tmp_path, run_tools=False)
    assert ice["features"] == ["zero_skip", "slu"] and ice["lanes"] == 2


def test_implied_throughput_arithmetic():
    from ember_boards.throughput import implied
    figures = {"cycles_per_train_sample": 400.0, "cycles_per_infer_sample": 100.0,
               "utilization": {"forward": 0.5}, "link_bytes_per_train_sample": 72.0}
    r = implied(figures, 20.0, baud=115200)
    assert r["engine_samples_per_s"] == 50_000                # 20e6 / 400
    assert r["link_samples_per_s"] == 160.0                   # 11520 bytes/s / 72
    # one after the other: 1 / (1/50000 + 1/160)
    assert r["streaming_samples_per_s"] == 159.5
    assert r["bound_by"] == "link" and r["baud"] == 115200
    assert r["resident_samples_per_s"] is None
    fast = implied(figures, 20.0, baud=3_000_000)
    assert fast["link_samples_per_s"] == 4166.7               # 300,000 bytes/s / 72
    assert fast["streaming_samples_per_s"] == 3846.2
    assert implied(figures, 20.0, baud=10**9)["bound_by"] == "engine"
    # with the resident unit: its cycles (the gather in them) and the epoch's link bytes,
    # 0.2 of them sent while the engine works
    held = dict(figures, resident_cycles_per_train_sample=440.0,
                resident_link_bytes_per_train_sample=0.3,
                resident_overlapped_link_bytes_per_train_sample=0.2)
    r = implied(held, 20.0, baud=3_000_000)
    # 1 / (max(440 / 20e6, 0.2 * 10 / 3e6) + 0.1 * 10 / 3e6) = 1 / (22 + 1/3) us
    assert r["resident_samples_per_s"] == 44776.1
    assert r["resident_of_engine"] == round(44776.1 / 50_000, 3)
    # a link slower than the engine: the overlapped bytes set the pace
    slow = implied(held, 20.0, baud=50_000)
    # 1 / (max(22, 0.2 * 200) + 0.1 * 200) us = 1 / 60 us
    assert slow["resident_samples_per_s"] == 16666.7
