"""A real bitstream from a fresh clone: the ULX3S flow (Amaranth platform, PLL, YoWASP Yosys,
nextpnr-ecp5 and ecppack from PyPI) builds the 4-lane engine (spec.BUILDS["tiny"]) on the
ECP5-85F with timing met at its PLL clock, and writes a report.json with every field
docs/boards.md describes.

This is the fast build of the board flow (a few minutes of single-threaded place and route);
the board's own 32-lane build is `make bitstream BOARD=ulx3s` (docs/boards.md gives its time).
"""

import json
from pathlib import Path

import pytest

from ember import spec
from ember_boards import build as board_build

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.bitstream
def test_ulx3s_tiny_bitstream_meets_timing(monkeypatch):
    # YoWASP tools see the working directory tree only: build below the repository
    monkeypatch.chdir(ROOT)
    out = Path("build") / "test-ulx3s-tiny"
    report, problems = board_build.build("ulx3s", out, engine_build="tiny")
    assert problems == [], problems
    assert report["stage"] == "done", report["errors"]
    assert report["fits"] is True and report["timing_met"] is True
    assert report["fmax_mhz"] >= report["target_mhz"] > 0
    assert report["lanes"] == spec.BUILDS["tiny"].lanes
    assert report["device"] == "LFE5U-85F"
    # the PLL makes the engine clock from the board's 25 MHz oscillator
    assert report["pll"]["f_in_mhz"] == 25.0
    assert abs(report["pll"]["f_out_mhz"] - report["target_mhz"]) < 1e-6
    for resource in ("luts", "ffs", "dsp", "bram"):
        entry = report["utilization"][resource]
        assert 0 < entry["used"] <= entry["available"]
        assert entry["percent"] == pytest.approx(100 * entry["used"] / entry["available"], abs=0.1)
    assert report["utilization"]["dsp"]["used"] >= spec.BUILDS["tiny"].lanes
    bitstream = ROOT / report["bitstream"]
    assert bitstream.stat().st_size > 100_000          # an ECP5-85F bitstream
    on_disk = json.loads((ROOT / out / "report.json").read_text())
    assert on_disk["fmax_mhz"] == report["fmax_mhz"]
