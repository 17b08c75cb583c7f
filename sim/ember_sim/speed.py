"""How many clock cycles per second each RTL simulator runs, measured on the harness's smoke DUT.

``cycles_per_second(simulator)`` builds ``ByteSummer`` (reusing an existing build) and times,
inside the simulator, a span of ``cycles`` clock cycles with Python asleep (one ``Timer``):
the ceiling for benches that wake Python per batch. ``driven=True`` also times cycles where
Python writes an input at every rising edge, the floor for per-cycle benches. Simulator start-up
is excluded from both.

    python -m ember_sim.speed [--cycles N] [--simulator verilator|icarus ...] [--json]
    python -m ember_sim.speed --board [--build sim] [--cycles N] [--simulator ...] [--json]

``--board`` measures the simulated board itself (ember_sim.board's SimBoard, as `ember train
--backend sim` runs it) the same way, and reports the simulator process's CPU seconds too:
on a shared machine those do not grow with the other processes' load as wall seconds do.
"""

from __future__ import annotations

import argparse
import json
import time

from ember_sim import rtl
from ember_sim.benches.harness_dut import ByteSummer

BENCH = "ember_sim.benches.harness_bench"
TOPLEVEL = "byte_summer_s4"
DEFAULT_IDLE_CYCLES = {"verilator": 2_000_000, "icarus": 200_000}
DEFAULT_DRIVEN_CYCLES = {"verilator": 50_000, "icarus": 20_000}


def cycles_per_second(simulator: str, cycles: int | None = None, *, driven: bool = False,
                      driven_cycles: int | None = None) -> dict:
    """Measure ``simulator`` speed on the smoke DUT; return a dict of the numbers.

    Keys: ``simulator``, ``cycles``, ``seconds``, ``cycles_per_second`` (idle clock), ``build_seconds``
    (0-ish when the build was reused), ``built`` and, with ``driven``, ``driven_cycles``,
    ``driven_seconds``, ``driven_cycles_per_second``.
    """
    cycles = cycles or DEFAULT_IDLE_CYCLES[simulator]
    sim_build = rtl.build(lambda: ByteSummer(stall_period=4), TOPLEVEL, simulator)
    case = {"cycles": cycles}
    testcases = ["idle_speed"]
    if driven:
        testcases.append("driven_speed")
        case["driven_cycles"] = driven_cycles or DEFAULT_DRIVEN_CYCLES[simulator]
    outcome = rtl.run(sim_build, BENCH, testcase=testcases, case=case)
    measured = outcome.result
    report = {
        "simulator": simulator,
        "cycles": measured["idle_cycles"],
        "seconds": measured["idle_seconds"],
        "cycles_per_second": measured["idle_cycles"] / measured["idle_seconds"],
        "build_seconds": sim_build.seconds,
        "built": sim_build.built,
        "process_seconds": outcome.seconds,
    }
    if driven:
        report.update(
            driven_cycles=measured["driven_cycles"],
            driven_seconds=measured["driven_seconds"],
            driven_cycles_per_second=measured["driven_cycles"] / measured["driven_seconds"],
        )
    return report


def board_cycles_per_second(simulator: str, cycles: int | None = None,
                            build_name: str = "sim") -> dict:
    """Clock cycles per second of the simulated board (ember_sim.board.build_board) with
    Python asleep (the board bench's ``idle_speed``); keys ``simulator``, ``build``,
    ``cycles``, ``seconds``, ``cpu_seconds``, ``cycles_per_second`` (wall),
    ``cycles_per_cpu_second``, ``build_seconds``, ``built``."""
    from ember import spec
    from ember_sim import board
    cycles = cycles or 5 * DEFAULT_IDLE_CYCLES[simulator] // 4
    sim_build = board.build_board(spec.BUILDS[build_name], simulator)
    measured = rtl.run(sim_build, "ember_sim.benches.board_bench", testcase="idle_speed",
                       case={"cycles": cycles}).result
    return {"simulator": simulator, "build": build_name, "cycles": measured["cycles"],
            "seconds": measured["seconds"], "cpu_seconds": measured["cpu_seconds"],
            "cycles_per_second": measured["cycles"] / measured["seconds"],
            "cycles_per_cpu_second": measured["cycles"] / measured["cpu_seconds"],
            "build_seconds": sim_build.seconds, "built": sim_build.built}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simulator", action="append", choices=rtl.SIMULATORS,
                        help="simulator to measure (repeatable; default: all)")
    parser.add_argument("--cycles", type=int, help="idle cycles to time (default per simulator)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per simulator")
    parser.add_argument("--board", action="store_true",
                        help="measure the simulated board (SimBoard) instead of the smoke DUT")
    parser.add_argument("--build", default="sim", help="engine build of the board (--board)")
    args = parser.parse_args(argv)
    if args.board:
        for simulator in args.simulator or rtl.SIMULATORS:
            report = board_cycles_per_second(simulator, args.cycles, args.build)
            if args.json:
                print(json.dumps(report))
            else:
                print(f"{simulator:10s} board {args.build}: {report['cycles_per_second']:>10,.0f} "
                      f"cycles/s wall, {report['cycles_per_cpu_second']:>10,.0f} per CPU second "
                      f"({report['cycles']:,} cycles; build {report['build_seconds']:.1f} s"
                      f"{'' if report['built'] else ', reused'})")
        return
    for simulator in args.simulator or rtl.SIMULATORS:
        started = time.perf_counter()
        report = cycles_per_second(simulator, args.cycles, driven=True)
        report["wall_seconds"] = time.perf_counter() - started
        if args.json:
            print(json.dumps(report))
        else:
            print(f"{simulator:10s} idle {report['cycles_per_second']:>12,.0f} cycles/s  "
                  f"driven {report['driven_cycles_per_second']:>10,.0f} cycles/s  "
                  f"(build {report['build_seconds']:.1f} s{'' if report['built'] else ', reused'}, "
                  f"total {report['wall_seconds']:.1f} s)")


if __name__ == "__main__":
    main()
