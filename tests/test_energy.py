"""The energy model reproduces its source's points and interpolates as documented."""

import json

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
