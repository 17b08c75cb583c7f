"""Real bitstreams from a fresh clone: the ULX3S flow (Amaranth platform, PLL, YoWASP Yosys,
nextpnr-ecp5 and ecppack from PyPI) builds the board's own 32-lane engine (spec.BUILDS["ulx3s"],
with its floorplan) and the 4-lane engine (spec.BUILDS["tiny"]) on the ECP5-85F, each with
timing met at its PLL clock, and writes a report.json with every field docs/boards.md
describes.

The 32-lane build takes about 10 minutes of single-threaded place and route (docs/boards.md);
the 4-lane one about 2.
"""

import json
from pathlib import Path

import pytest

from ember import spec
from ember_boards import build as board_build

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.bitstream
@pytest.mark.parametrize("engine_build", ["ulx3s", "tiny"])
def test_ulx3s_bitstream_meets_timing(monkeypatch, engine_build):
    # YoWASP tools see the working directory tree only: build below the repository
    monkeypatch.chdir(ROOT)
    out = Path("build") / f"test-ulx3s-{engine_build}"
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
