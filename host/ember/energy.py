"""Event counts -> energy, under a named per-event energy profile.

A profile (ember/assets/<name>.json, or any JSON file with the same keys) gives primitive
energies from a published source: integer adds and multiplies at two widths and SRAM reads at
a few sizes. `EnergyModel` turns them into a cost for each counter of spec.COUNTERS for one
build (lane count and memory sizes), as docs/energy.md explains. Savings are reported as
ratios, which depend little on the profile.
"""

import json
import math
from importlib import resources
from pathlib import Path

from . import spec
from .spec import ConfigError

DEFAULT_PROFILE = "horowitz45"


def load_profile(name_or_path=DEFAULT_PROFILE):
    """A bundled profile by name, or a JSON file by path."""
    path = Path(str(name_or_path))
    if path.suffix == ".json" or path.exists():
        if not path.exists():
            raise ConfigError(f"energy profile {path} does not exist")
        text = path.read_text()
    else:
        res = resources.files("ember.assets").joinpath(f"{name_or_path}.json")
        if not res.is_file():
            raise ConfigError(f"no bundled energy profile named '{name_or_path}'; "
                              f"bundled: {', '.join(bundled_profiles())}")
        text = res.read_text()
    try:
        profile = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"energy profile {name_or_path} is not valid JSON ({e})") from None
    for key in ("name", "int_add_pj", "int_mult_pj", "sram_read_64b_pj"):
        if key not in profile:
            raise ConfigError(f"energy profile {name_or_path} lacks '{key}'")
    return profile


def bundled_profiles():
    return sorted(p.name[:-5] for p in resources.files("ember.assets").iterdir()
                  if p.name.endswith(".json"))


def _two_points(table):
    (x0, y0), (x1, y1) = sorted((int(k), float(v)) for k, v in table.items())[:2]
    return x0, y0, x1, y1


def add_pj(profile, bits):
    """An adder of `bits` width: linear in width through the profile's two points."""
    x0, y0, x1, y1 = _two_points(profile["int_add_pj"])
    return max(0.0, y0 + (bits - x0) * (y1 - y0) / (x1 - x0))


def mult_pj(profile, a_bits, b_bits):
    """An a x b multiplier: linear in a*b through the profile's (n x n) points."""
    x0, y0, x1, y1 = _two_points(profile["int_mult_pj"])
    area = a_bits * b_bits
    return max(0.0, y0 + (area - x0 * x0) * (y1 - y0) / (x1 * x1 - x0 * x0))


def sram_pj(profile, size_bytes, bits):
    """Reading `bits` from an SRAM of `size_bytes`: linear in log2(size) between the
    profile's points (clamped at the ends), proportional to the bits read."""
    pts = sorted((int(k), float(v)) for k, v in profile["sram_read_64b_pj"].items())
    s = max(pts[0][0], min(pts[-1][0], size_bytes))
    for (s0, e0), (s1, e1) in zip(pts, pts[1:]):
        if s0 <= s <= s1:
            e64 = e0 + (math.log2(s) - math.log2(s0)) * (e1 - e0) / (math.log2(s1) - math.log2(s0))
            break
    return e64 * bits / 64


class EnergyModel:
    """Per-event energies (pJ) for one build under one profile."""

    def __init__(self, profile=DEFAULT_PROFILE, build=spec.DEFAULT_BUILD):
        self.profile = profile if isinstance(profile, dict) else load_profile(profile)
        self.build = build
        p, b = self.profile, build
        acc = add_pj(p, spec.ACC_BITS)
        low_acc = add_pj(p, spec.PSG_ACT_MSBS + spec.PSG_GRAD_MSBS + 8)
        # weights and lane-read gradients sit in one bank per lane; the rest is one array
        w_bank = b.weight_words * spec.WEIGHT_BITS // 8
        g_bank = b.grad_words * spec.GRAD_BITS // 8
        scratch = b.scratch_entries * spec.DX_BITS // 8
        write = float(p.get("sram_write_factor", 1.0))
        self.per_event = {
            "mac_forward": mult_pj(p, spec.WEIGHT_BITS, spec.ACT_BITS) + acc,
            "mac_input_grad": mult_pj(p, spec.WEIGHT_BITS, spec.GRAD_BITS) + acc,
            "mac_weight_grad": mult_pj(p, spec.GRAD_BITS, spec.ACT_BITS) + acc,
            "mac_weight_grad_low": mult_pj(p, spec.PSG_GRAD_MSBS, spec.PSG_ACT_MSBS) + low_acc,
            # per output: subtract, multiply by log2(e), table, shift, sum, multiply by 1/S
            "loss_elements": 2 * mult_pj(p, 16, 16) + 3 * add_pj(p, 32),
            "weight_reads": sram_pj(p, w_bank, spec.WEIGHT_BITS),
            "weight_writes": write * sram_pj(p, w_bank, spec.WEIGHT_BITS),
            "act_reads": sram_pj(p, b.act_bytes, spec.ACT_BITS),
            "act_writes": write * sram_pj(p, b.act_bytes, spec.ACT_BITS),
            # single entries: logits and dY in the lane banks, dX in the scratch; charged as
            # 32-bit scratch accesses (the larger of the two)
            "grad_reads": sram_pj(p, scratch, spec.DX_BITS),
            "grad_writes": write * sram_pj(p, scratch, spec.DX_BITS),
            "grad_lane_reads": sram_pj(p, g_bank, spec.GRAD_BITS),
            # the predictor reads only the MSB bank of each memory (split by bit slice)
            "act_msb_reads": sram_pj(p, b.act_bytes, spec.PSG_ACT_MSBS),
            "grad_msb_lane_reads": sram_pj(p, g_bank, spec.PSG_GRAD_MSBS),
            "link_rx_bytes": float(p.get("link_byte_pj", 0.0)),
            "link_tx_bytes": float(p.get("link_byte_pj", 0.0)),
            "cycles": float(p.get("cycle_pj", 0.0)),
        }

    @property
    def name(self):
        return self.profile["name"]

    def breakdown(self, counters):
        """Energy per counter (pJ), for the counters that cost energy."""
        return {k: counters.get(k, 0) * e for k, e in self.per_event.items()}

    def total(self, counters):
        return sum(self.breakdown(counters).values())

    def grouped(self, counters):
        """Energy by component: arithmetic per phase and memory per memory."""
        b = self.breakdown(counters)
        return {
            "forward_macs": b["mac_forward"],
            "input_grad_macs": b["mac_input_grad"],
            "weight_grad_macs": b["mac_weight_grad"],
            "predictor_macs": b["mac_weight_grad_low"],
            "loss_unit": b["loss_elements"],
            "weight_memory": b["weight_reads"] + b["weight_writes"],
            "activation_memory": b["act_reads"] + b["act_writes"] + b["act_msb_reads"],
            "gradient_memory": (b["grad_reads"] + b["grad_writes"] + b["grad_lane_reads"]
                                + b["grad_msb_lane_reads"]),
            "link": b["link_rx_bytes"] + b["link_tx_bytes"],
            "clock": b["cycles"],
        }
