"""Real bitstreams from a fresh clone, with the YoWASP tools from PyPI (Amaranth platform, PLL,
Yosys, nextpnr, icepack/ecppack): the ULX3S flow builds the board's own 32-lane engine
(spec.BUILDS["ulx3s"], with its floorplan) on the ECP5-85F; the iCEBreaker flow builds the
board's own engine (spec.BUILDS["icebreaker"]) on the iCE40UP5K. Each meets timing at its PLL
clock and writes a report.json with every field docs/boards.md describes.

The 32-lane build takes 10 to 20 minutes of single-threaded place and route (docs/boards.md),
the iCEBreaker about 1 to 3. The 4-lane `tiny` engine on the ULX3S (`--build tiny`) checks
the same flow on a smaller design and is left to the command line: the board's own build
covers every step of it.
"""

import json
from pathlib import Path

import pytest

from ember import spec
from ember_boards import build as board_build

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.bitstream
def test_ulx3s_bitstream_meets_timing(monkeypatch):
    engine_build = "ulx3s"
    # YoWASP tools see the working directory tree only: build below the repository
    monkeypatch.chdir(ROOT)
    out = Path("build") / "test-ulx3s"
    report, problems = board_build.build("ulx3s", out, engine_build=engine_build)
    assert problems == [], problems
    assert report["stage"] == "done", report["errors"]
    assert report["fits"] is True and report["timing_met"] is True
    assert report["fmax_mhz"] >= report["target_mhz"] > 0
    lanes = spec.BUILDS[engine_build].lanes
    assert report["lanes"] == lanes
    assert report["device"] == "LFE5U-85F"
    # the PLL makes the engine clock from the board's 25 MHz oscillator
    assert report["pll"]["f_in_mhz"] == 25.0
    assert abs(report["pll"]["f_out_mhz"] - report["target_mhz"]) < 1e-6
    for resource in ("luts", "ffs", "dsp", "bram"):
        entry = report["utilization"][resource]
        assert 0 < entry["used"] <= entry["available"]
        assert entry["percent"] == pytest.approx(100 * entry["used"] / entry["available"], abs=0.1)
    assert report["utilization"]["dsp"]["used"] >= lanes
    # the floorplan put every lane's multiplier on its own DSP site
    sites = report["floorplan"]["lane_multipliers"]
    assert len(sites) == len(set(sites)) == lanes
    bitstream = ROOT / report["bitstream"]
    assert bitstream.stat().st_size > 100_000          # an ECP5-85F bitstream
    on_disk = json.loads((ROOT / out / "report.json").read_text())
    assert on_disk["fmax_mhz"] == report["fmax_mhz"]


@pytest.mark.bitstream
def test_icebreaker_bitstream_fits_and_meets_timing(monkeypatch):
    monkeypatch.chdir(ROOT)
    out = Path("build") / "test-icebreaker"
    report, problems = board_build.build("icebreaker", out)
    assert problems == [], problems
    assert report["stage"] == "done", report["errors"]
    assert report["fits"] is True and report["timing_met"] is True
    assert report["fmax_mhz"] >= report["target_mhz"] > 0
    build = spec.BUILDS["icebreaker"]
    assert report["lanes"] == build.lanes and report["device"] == "iCE40UP5K"
    assert report["features"] == list(build.features)
    # the PLL makes the engine clock from the board's 12 MHz oscillator
    assert report["pll"]["f_in_mhz"] == 12.0
    assert abs(report["pll"]["f_out_mhz"] - report["target_mhz"]) < 1e-6
    util = report["utilization"]
    for resource in ("logic_cells", "dsp", "bram", "spram"):
        entry = util[resource]
        assert 0 < entry["used"] <= entry["available"]
    # a multiplier per lane on the DSPs, and (engine v2) every weight in one SPRAM, which
    # leaves three of the four free for resident data
    assert build.dataflow == "samples" and util["dsp"]["used"] >= build.lanes
    assert util["spram"]["used"] == 1 and util["spram"]["available"] - 1 >= 3
    bitstream = ROOT / report["bitstream"]
    assert bitstream.stat().st_size > 100_000          # an iCE40UP5K bitstream (104,090 bytes)
    on_disk = json.loads((ROOT / out / "report.json").read_text())
    assert on_disk["fmax_mhz"] == report["fmax_mhz"]


@pytest.mark.bitstream
def test_a_build_past_its_time_limit_is_stopped(monkeypatch):
    """nextpnr's router does not give up on a design it cannot route: the build stops its
    tools (every process the script started) at the time limit and says so."""
    import os
    monkeypatch.chdir(ROOT)
    out = Path("build") / "test-time-limit"
    report, problems = board_build.build("icebreaker", out, time_limit_s=2)
    assert report["stage"] == "synthesis" and report["bitstream"] is None
    assert any("stopped after 2 s" in p for p in problems), problems
    here = (ROOT / out).resolve()
    left = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and Path(f"/proc/{pid}/cwd").resolve() == here:
                left.append(pid)
        except OSError:
            pass
    assert left == [], f"processes still running in {out}: {left}"
