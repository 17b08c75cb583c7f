"""On-board training throughput a board's bitstream implies, from the simulated engine.

    python -m ember_boards.throughput --board ulx3s [--report build/ulx3s/report.json]

Runs the dense baseline step (64-32-10 on digits, SGD, every layer) on the simulated board with
the board's own engine build (Verilator; the same RTL as the bitstream), and turns the
measured cycles per training sample into samples per second at the engine clock: the clock
nextpnr met (`fmax_mhz` of the build's report.json, when timing was met, capped at the PLL's
target) or else the PLL target. The link bounds what a host can stream: link bytes per sample
(both directions, measured on the same run) at spec.DEFAULT_BAUD with 10 bits per byte (8N1).
Prints one JSON object.
"""

import argparse
import json
import sys
from pathlib import Path

from ember import bench, data, spec

from .build import BOARDS


def throughput(board, report=None, batches=2):
    build = spec.BUILDS[board]
    batch = min(32, build.max_batch)
    figures = bench.dense_engine_figures(data.load_digits(), batches=batches, build=build,
                                         batch_size=batch)
    clock_mhz, source = build.clock_hz / 1e6, "PLL target (spec.BUILDS)"
    if report and Path(report).exists():
        r = json.loads(Path(report).read_text())
        if r.get("timing_met") and r.get("target_mhz"):
            clock_mhz, source = r["target_mhz"], f"met in {report}"
    return {"board": board, "lanes": build.lanes, "batch_size": batch,
            "clock_source": source, **implied(figures, clock_mhz)}


def implied(figures, clock_mhz, baud=spec.DEFAULT_BAUD):
    """Training samples per second of the engine at `clock_mhz` and of a UART link at `baud`
    (8N1: 10 bits per byte), from dense_engine_figures-style `figures`."""
    cycles = figures["cycles_per_train_sample"]
    link_bytes = figures["link_bytes_per_train_sample"]
    engine_rate = clock_mhz * 1e6 / cycles
    link_rate = baud / spec.UART_FRAME_BITS / link_bytes
    return {
        "clock_mhz": clock_mhz,
        "cycles_per_train_sample": round(cycles, 1),
        "cycles_per_infer_sample": round(figures["cycles_per_infer_sample"], 1),
        "utilization": {k: round(v, 3) for k, v in figures["utilization"].items()},
        "engine_train_samples_per_s": round(engine_rate),
        "link_bytes_per_train_sample": round(link_bytes, 1),
        "baud": baud,
        "link_train_samples_per_s": round(link_rate, 1),
        "bound_by": "link" if link_rate < engine_rate else "engine",
    }


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ember_boards.throughput",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--board", required=True, choices=sorted(BOARDS))
    ap.add_argument("--report", help="the build's report.json (default build/<board>/)")
    ap.add_argument("--batches", type=int, default=2)
    args = ap.parse_args(argv)
    report = args.report or f"build/{args.board}/report.json"
    print(json.dumps(throughput(args.board, report, args.batches), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
