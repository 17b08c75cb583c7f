"""Synthesis-only area of the engine core: what each engine build costs on an FPGA family,
in minutes instead of a full place and route.

    python -m ember_boards.area --build icebreaker [--family ice40] [--features zero_skip,slu]
                                [--core v1|v2|v2-top] [--per-module] [--json out.json]

Converts ``EngineCore(spec.BUILDS[build])`` to RTLIL, runs ``synth_ice40 -dsp`` (or
``synth_ecp5``) on YoWASP Yosys, after the board builds' ``common.read_collision_script``, and
prints the cell counts of the flattened design (SB_LUT4, SB_CARRY, SB_DFF*, SB_MAC16,
SB_RAM40_4K, SB_SPRAM256KA; or LUT4, CCU2C, TRELLIS_FF, MULT18X18D, DP16KD). docs/boards.md
quotes these figures.

``--core v2-top`` synthesizes engine v2 as a board holds it: ``EngineUartTop`` (the UARTs,
the link bridge and ``SampleCore``, the shell with its register bank, memory window, counter
file and stop unit) with the build's dataflow set to "samples". ``--per-module`` keeps the
hierarchy (``synth_ice40 -noflatten``) and adds each module's own cells ("modules": module
-> counts, the cells of its submodules not included) to the result.
"""

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ember import spec

from .build import _yosys_cells, _yowasp_environment
from .common import read_collision_script

FAMILIES = {"ice40": "synth_ice40 -dsp -top top", "ecp5": "synth_ecp5 -top top"}
DEFAULT_FAMILY = {"icebreaker": "ice40", "tiny": "ice40", "ulx3s": "ecp5", "sim": "ecp5",
                  "v1": "ecp5"}


#: The engine cores: v1's EngineCore, and engine v2's core (ember_hw.sample_engine, not yet
#: on a board build) without its bus.
CORES = ("v1", "v2", "v2-top")


def _v2_counted(build):
    """Engine v2's core with its events in a counter file (ember_hw.counters), as the shell
    will hold them: without one, synthesis would drop the core's counting logic."""
    from amaranth import Module
    from amaranth.lib import wiring
    from amaranth.lib.wiring import In, Out

    from ember_hw.counters import CounterFile
    from ember_hw.sample_engine import SampleEngine, event_bounds

    class CountedCore(wiring.Component):
        def __init__(self):
            self.core = SampleEngine(build, tally=False)
            self.counters = CounterFile(event_bounds(build))
            ports = {name: In(p.shape) if p.flow == wiring.In else Out(p.shape)
                     for name, p in self.core.signature.members.items()
                     if name != "inc" and p.is_port}
            ports.update({"read_req": In(1), "read_index": In(len(self.counters.read_index)),
                          "read_valid": Out(1),
                          "read_data": Out(len(self.counters.read_data))})
            super().__init__(ports)

        def elaborate(self, platform):
            m = Module()
            m.submodules.core, m.submodules.counters = self.core, self.counters
            for name in self.core.signature.members:
                if name == "inc":
                    continue
                ours, theirs = getattr(self, name), getattr(self.core, name)
                flow = self.core.signature.members[name].flow
                m.d.comb += (theirs.eq(ours) if flow == wiring.In else ours.eq(theirs))
            c = self.counters
            m.d.comb += [c.inc.eq(self.core.inc), c.clear.eq(self.start),
                         c.read_req.eq(self.read_req), c.read_index.eq(self.read_index),
                         self.read_valid.eq(c.read_valid), self.read_data.eq(c.read_data)]
            return m

    return CountedCore()


def core_rtlil(build, core="v1"):
    from amaranth.back import rtlil
    if core == "v2":
        return rtlil.convert(_v2_counted(build), name="top")
    if core == "v2-top":
        from ember_hw.top import EngineUartTop
        return rtlil.convert(EngineUartTop(build), name="top")
    from ember_hw.engine import EngineCore
    return rtlil.convert(EngineCore(spec.with_dataflow(build, "outputs")), name="top")


def module_cells(log):
    """Each module's own cell counts (module -> {cell: count}) from the last ``stat`` of a
    hierarchical (``-noflatten``) Yosys log, the submodules' cells not included."""
    start = log.rfind("Printing statistics.")
    cells, name = {}, None
    for line in log[start:].splitlines():
        head = re.match(r"^=== (\S+) ===", line)
        if head:
            name = head.group(1)
            cells[name] = {}
            continue
        if name is None or "design hierarchy" in line:
            if "design hierarchy" in line:
                name = None
            continue
        m = re.match(r"^\s+(\d+)\s+((?:SB_)\S*)\s*$", line)
        if m:
            cells[name][m.group(2)] = int(m.group(1))
    return cells


def synthesize(build, family, core="v1", per_module=False):
    """Cell counts (dict) of the engine core of `build` synthesized for `family`; with
    `per_module`, (counts, module_cells) of the design synthesized with its hierarchy."""
    _yowasp_environment()
    # YoWASP tools see the working directory tree only: work in a directory below it
    with tempfile.TemporaryDirectory(dir=Path.cwd(), prefix=".area-") as tmp:
        tmp = Path(tmp).relative_to(Path.cwd())
        (tmp / "core.il").write_text(core_rtlil(build, core))
        script = "; ".join([f"read_rtlil {tmp / 'core.il'}", *read_collision_script(),
                            FAMILIES[family] + (" -noflatten" if per_module else ""),
                            "stat"])
        out = subprocess.run([os.environ["YOSYS"], "-q", "-l", str(tmp / "yosys.log"),
                              "-p", script], capture_output=True, text=True)
        log = (tmp / "yosys.log").read_text() if (tmp / "yosys.log").exists() else ""
        if out.returncode != 0:
            raise RuntimeError(f"yosys failed ({out.returncode}):\n{out.stderr[-2000:]}")
    if per_module:
        return _yosys_cells(log), module_cells(log)
    return _yosys_cells(log)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ember_boards.area", description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="icebreaker", choices=sorted(spec.BUILDS))
    ap.add_argument("--family", choices=sorted(FAMILIES))
    ap.add_argument("--features", help="comma-separated units to build instead of the "
                    f"build's own (from {', '.join(spec.FEATURES)})")
    ap.add_argument("--core", default="v1", choices=CORES,
                    help="v1: EngineCore (the boards' engine); v2: engine v2's core with its "
                    "counter file; v2-top: engine v2 behind its shell, link and UARTs")
    ap.add_argument("--per-module", action="store_true",
                    help="keep the hierarchy and report each module's own cells")
    ap.add_argument("--lanes", type=int, help="lanes instead of the build's own")
    ap.add_argument("--weight-words", type=int, help="weight words instead of the build's own")
    ap.add_argument("--json", help="also write the counts to this file")
    args = ap.parse_args(argv)
    family = args.family or DEFAULT_FAMILY.get(args.build, "ice40")
    t0 = time.monotonic()
    build = spec.BUILDS[args.build]
    if args.features is not None:
        build = dataclasses.replace(build, features=tuple(f for f in args.features.split(",")
                                                          if f))
    changes = {name: getattr(args, name) for name in ("lanes", "weight_words")
               if getattr(args, name) is not None}
    if args.core != "v1":
        changes["dataflow"] = "samples"
        if build.weight_spram and "weight_words" not in changes:
            # engine v2 keeps every weight in one SPRAM (spec.Build)
            lanes = changes.get("lanes", build.lanes)
            changes["weight_words"] = min(build.weight_words, spec.SPRAM_WORDS // lanes)
    build = dataclasses.replace(build, **changes)
    cells = synthesize(build, family, args.core, args.per_module)
    modules = None
    if args.per_module:
        cells, modules = cells
    result = {"build": args.build, "core": args.core, "lanes": build.lanes,
              "weight_words": build.weight_words,
              "features": list(build.features), "family": family,
              "cells": cells, **({"modules": modules} if modules is not None else {}),
              "seconds": round(time.monotonic() - t0, 1)}
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
