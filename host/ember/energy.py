"""Event counts -> energy, under a named per-event energy profile.

A profile (ember/assets/<name>.json, or any JSON file with the same keys) is one of two kinds:

- "asic" (horowitz45): primitive energies from a published source, integer adds and
  multiplies at two widths and SRAM reads at a few sizes, interpolated in width and size;
- "fpga" (ice40up5k, ecp5-85f): per-operation energies of an FPGA's blocks, which do not
  scale with a*b or log2(size): a DSP multiply (`dsp_mult_pj`), an adder in LUTs per bit
  (`logic_add_pj_per_bit`), a block RAM or SPRAM access of the block's width
  (`bram_access_pj`, `spram_access_pj`), static power (`static_mw`, charged per engine
  cycle at the build's clock), clock distribution per cycle (`clock_pj_per_cycle`) and the
  link (`link_mw` while a byte is on the UART at the build's Build.baud, plus the chip's
  static and clock power over that byte's time).

`EnergyModel` turns a profile into a cost for each counter of spec.COUNTERS for one build
(lane count, memory sizes, clock, which memory is SPRAM), as docs/energy.md explains.
`BOARD_PROFILES` names the profile of each board build; a run with no profile given uses its
build's (`profile_for`).
"""

import json
import math
from importlib import resources
from pathlib import Path

from . import spec
from .spec import ConfigError

DEFAULT_PROFILE = "horowitz45"
#: The energy profile of each board build (a run on such a build reports it by default, and
#: horowitz45 too). docs/energy.md gives each profile's sources and what each leaves out.
BOARD_PROFILES = {"icebreaker": "ice40up5k", "ulx3s": "ecp5-85f"}

#: Keys every profile of a kind must have (beyond "name"); every number in them is >= 0.
PROFILE_KEYS = {
    "asic": ("int_add_pj", "int_mult_pj", "sram_read_64b_pj"),
    "fpga": ("dsp_mult_pj", "logic_add_pj_per_bit", "bram_access_pj", "bram_width_bits",
             "spram_access_pj", "spram_width_bits", "static_mw", "clock_pj_per_cycle",
             "link_mw"),
}


def profile_for(build):
    """The profile a run on `build` reports by default: its board's, else DEFAULT_PROFILE."""
    return BOARD_PROFILES.get(build.name, DEFAULT_PROFILE)


def build_for(profile_name, default=spec.DEFAULT_BUILD):
    """The build a profile is costed at when no run's build says otherwise: its board's
    (BOARD_PROFILES), else `default`."""
    boards = [b for b, p in BOARD_PROFILES.items() if p == profile_name]
    return spec.BUILDS[boards[0]] if boards else default


def profiles_for(build, primary):
    """The profiles a run reports: its own (`primary`), the build's board profile and
    DEFAULT_PROFILE, each once, in that order."""
    out = []
    for name in (primary, profile_for(build), DEFAULT_PROFILE):
        if name not in out:
            out.append(name)
    return out


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
    check_profile(profile, name_or_path)
    return profile


def check_profile(profile, where="given"):
    """Raise ConfigError naming the key unless `profile` has every key of its kind and every
    number in them (nested tables too) is a non-negative number."""
    if not isinstance(profile, dict):
        raise ConfigError(f"energy profile {where} is not a JSON object")
    kind = profile.get("kind", "asic")
    if kind not in PROFILE_KEYS:
        raise ConfigError(f"energy profile {where}: 'kind' is {kind!r}; known: "
                          f"{', '.join(PROFILE_KEYS)}")
    for key in ("name",) + PROFILE_KEYS[kind]:
        if key not in profile:
            raise ConfigError(f"energy profile {where} lacks '{key}'")
    for key in PROFILE_KEYS[kind] + ("sram_write_factor", "link_byte_pj", "cycle_pj"):
        if key not in profile:
            continue
        value = profile[key]
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for sub, v in items:
            name = key if sub is None else f"{key}.{sub}"
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ConfigError(f"energy profile {where}: '{name}' is {v!r}; it must be a "
                                  "number")
            if v < 0:
                raise ConfigError(f"energy profile {where}: '{name}' is {v}; it must be >= 0")
            if key.endswith("_width_bits") and v < 1:
                raise ConfigError(f"energy profile {where}: '{name}' is {v}; a block is at "
                                  "least 1 bit wide")


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


def _asic_per_event(p, b):
    """An ASIC profile's per-event energies: adders and multipliers interpolated in width,
    SRAM reads in log2(size) (docs/energy.md, "How events are costed")."""
    acc = add_pj(p, spec.ACC_BITS)
    low_acc = add_pj(p, spec.PSG_ACT_MSBS + spec.PSG_GRAD_MSBS + 8)
    # weights and lane-read gradients sit in one bank per lane; the rest is one array. Engine
    # v2 (dataflow "samples") reads one weight at a time from P banks of the same size (the
    # address picks the bank) and banks the activations per lane (each lane reads its own)
    w_bank = b.weight_words * spec.WEIGHT_BITS // 8
    act_mem = b.act_bytes // b.lanes if b.dataflow == "samples" else b.act_bytes
    g_bank = b.grad_words * spec.GRAD_BITS // 8
    scratch = b.scratch_entries * spec.DX_BITS // 8
    write = float(p.get("sram_write_factor", 1.0))
    return {
        "mac_forward": mult_pj(p, spec.WEIGHT_BITS, spec.ACT_BITS) + acc,
        "mac_input_grad": mult_pj(p, spec.WEIGHT_BITS, spec.GRAD_BITS) + acc,
        "mac_weight_grad": mult_pj(p, spec.GRAD_BITS, spec.ACT_BITS) + acc,
        "mac_weight_grad_low": mult_pj(p, spec.PSG_GRAD_MSBS, spec.PSG_ACT_MSBS) + low_acc,
        # per output: subtract, multiply by log2(e), table, shift, sum, multiply by 1/S
        "loss_elements": 2 * mult_pj(p, 16, 16) + 3 * add_pj(p, 32),
        "weight_reads": sram_pj(p, w_bank, spec.WEIGHT_BITS),
        "weight_writes": write * sram_pj(p, w_bank, spec.WEIGHT_BITS),
        "act_reads": sram_pj(p, act_mem, spec.ACT_BITS),
        "act_writes": write * sram_pj(p, act_mem, spec.ACT_BITS),
        # single entries: logits and dY in the lane banks, dX in the scratch; charged as
        # 32-bit scratch accesses (the larger of the two)
        "grad_reads": sram_pj(p, scratch, spec.DX_BITS),
        "grad_writes": write * sram_pj(p, scratch, spec.DX_BITS),
        "grad_lane_reads": sram_pj(p, g_bank, spec.GRAD_BITS),
        # the predictor reads only the MSB bank of each memory (split by bit slice)
        "act_msb_reads": sram_pj(p, act_mem, spec.PSG_ACT_MSBS),
        "grad_msb_lane_reads": sram_pj(p, g_bank, spec.PSG_GRAD_MSBS),
        # the resident data unit's words, one array of data_bytes
        "data_reads": sram_pj(p, b.data_bytes, spec.BUS_DATA_BITS),
        "link_rx_bytes": float(p.get("link_byte_pj", 0.0)),
        "link_tx_bytes": float(p.get("link_byte_pj", 0.0)),
        "cycles": float(p.get("cycle_pj", 0.0)),
    }


def _fpga_per_event(p, b):
    """An FPGA profile's per-event energies for build `b` (docs/energy.md, "FPGA profiles").

    A lane MAC is one DSP multiply (its energy does not scale with the operand widths) and
    an accumulator add in LUTs; memories cost per access of their block's width: the weight
    memory is SPRAM when the build keeps it there (Build.weight_spram), every other memory
    block RAM. Each engine cycle costs the static power over one clock period plus the
    clock distribution; each link byte the bridge and I/O power (`link_mw`) plus the chip's
    static and clock power over the byte's time on the line at the build's baud (Build.baud;
    the engine counts only the cycles a command runs, and it waits while bytes cross)."""
    add_bit = float(p["logic_add_pj_per_bit"])
    mult = float(p["dsp_mult_pj"])
    bram = _access_pj(p["bram_access_pj"], p["bram_width_bits"])
    spram = _access_pj(p["spram_access_pj"], p["spram_width_bits"])
    weight_mem = spram if b.weight_spram else bram
    write = float(p.get("sram_write_factor", 1.0))
    acc = add_bit * b.lane_acc_bits()
    cycle = float(p["static_mw"]) * 1e9 / b.clock_hz + float(p["clock_pj_per_cycle"])
    chip_mw = float(p["static_mw"]) + float(p["clock_pj_per_cycle"]) * b.clock_hz * 1e-9
    byte_s = spec.UART_FRAME_BITS / b.baud
    link_byte = (float(p["link_mw"]) + chip_mw) * 1e9 * byte_s
    return {
        "mac_forward": mult + acc,
        "mac_input_grad": mult + add_bit * b.dx_acc_bits(),
        "mac_weight_grad": mult + acc,
        "mac_weight_grad_low": mult + add_bit * b.pred_bits(),
        # per output: two multiplies (DSP) and three 32-bit adds (LUTs), as for the ASIC
        "loss_elements": 2 * mult + 3 * 32 * add_bit,
        "weight_reads": weight_mem(spec.WEIGHT_BITS),
        "weight_writes": write * weight_mem(spec.WEIGHT_BITS),
        "act_reads": bram(spec.ACT_BITS),
        "act_writes": write * bram(spec.ACT_BITS),
        "grad_reads": bram(spec.DX_BITS),
        "grad_writes": write * bram(spec.DX_BITS),
        "grad_lane_reads": bram(spec.GRAD_BITS),
        "act_msb_reads": bram(spec.PSG_ACT_MSBS),
        "grad_msb_lane_reads": bram(spec.PSG_GRAD_MSBS),
        # the resident data memory sits where the build keeps its large memories
        "data_reads": weight_mem(spec.BUS_DATA_BITS),
        "link_rx_bytes": link_byte,
        "link_tx_bytes": link_byte,
        "cycles": cycle,
    }


def _access_pj(pj_per_access, width_bits):
    """An access of `bits` to a memory of blocks `width_bits` wide: one access per block the
    bits span (a 32-bit read of 16-bit blocks is two)."""
    return lambda bits: float(pj_per_access) * -(-bits // int(width_bits))


class EnergyModel:
    """Per-event energies (pJ) for one build under one profile (None: the build's own,
    `profile_for`)."""

    def __init__(self, profile=None, build=spec.DEFAULT_BUILD):
        if profile is None:
            profile = profile_for(build)
        if isinstance(profile, dict):
            check_profile(profile, repr(profile.get("name", "given")))
            self.profile = profile
        else:
            self.profile = load_profile(profile)
        self.build = build
        if self.profile.get("kind", "asic") == "fpga":
            self.per_event = _fpga_per_event(self.profile, build)
        else:
            self.per_event = _asic_per_event(self.profile, build)

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
            "data_memory": b["data_reads"],
            "link": b["link_rx_bytes"] + b["link_tx_bytes"],
            "clock": b["cycles"],
        }


#: Energy groups (EnergyModel.grouped) that the golden model's dense baseline step has no
#: counts for: it moves no link bytes and runs no cycles. "saved" leaves them out of both
#: sides. (A resident run's dense baseline reads its samples from the data memory as the run
#: does: trainer.dense_counters.)
UNCOUNTED_IN_DENSE = ("link", "clock")


def comparable_pj(grouped):
    """The part of a run's energy (EnergyModel.grouped, pJ per group) that the dense baseline
    also counts: everything but UNCOUNTED_IN_DENSE."""
    return sum(v for g, v in grouped.items() if g not in UNCOUNTED_IN_DENSE)


def saved(grouped, dense_pj):
    """(saved_pj, saved_fraction) of a run's energy `grouped` (pJ per group) against the
    dense baseline's `dense_pj`: both sides' compute and memory energy (comparable_pj)."""
    comparable = comparable_pj(grouped)
    return dense_pj - comparable, (1.0 - comparable / dense_pj if dense_pj else 0.0)


def report(model, counters, dense_counters):
    """Energy of a run's `counters` under `model`, against the dense baseline's counters:
    energy_pj, energy_breakdown, dense_energy_pj, saved_pj and saved_fraction. Saved compares
    the compute and memory energy only (UNCOUNTED_IN_DENSE excluded on both sides), which
    under horowitz45, whose link and clock energies are 0, is the whole of it."""
    grouped = model.grouped(counters)
    dense = model.total(dense_counters)
    saved_pj, saved_fraction = saved(grouped, dense)
    return {"energy_pj": sum(grouped.values()), "energy_breakdown": grouped,
            "dense_energy_pj": dense, "saved_pj": saved_pj, "saved_fraction": saved_fraction}
