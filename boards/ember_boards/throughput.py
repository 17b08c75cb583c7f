"""On-board training throughput a board's bitstream implies, from the simulated engine.

    python -m ember_boards.throughput --board ulx3s [--report build/ulx3s/report.json] [--json]

Runs the dense baseline step (64-32-10 on digits, SGD, every layer) on the simulated board with
the board's own engine build (Verilator; the same RTL as the bitstream), and turns the
measured cycles per training sample into samples per second at the engine clock: the clock
nextpnr met (`fmax_mhz` of the build's report.json, when timing was met, capped at the PLL's
target) or else the PLL target. The link is the board's UART at its build's baud
(spec.Build.baud, what the bitstream runs at), 10 bits per byte (8N1); the link bytes per
sample (both directions) are measured on the same run.

Figures:
  engine_samples_per_s     the engine alone, the data already in place;
  link_samples_per_s       the UART alone: baud / 10 / link bytes per sample;
  streaming_samples_per_s  the host streaming every mini-batch: the link's time and the
                           engine's add up (the host sends a batch, the engine trains on
                           it, the host reads the answer; nothing overlaps yet). The USB
                           bridge's latency per transfer is not in it;
  resident_samples_per_s   training on data held in the board's memory (a build with the
                           resident unit; null on one without): a dense epoch of the
                           digits' training split on the simulated board, as the trainer
                           runs one after another (bench.dense_resident_figures): its
                           cycles per sample with the device's gather and each batch's
                           overhead, and its link bytes (its settings and command, and the
                           next epoch's schedule; not the upload, once per run) at the
                           baud. The next schedule's bytes cross while the engine works
                           (the longer of the two counts); the rest, in turn;
  resident_link_bytes_per_train_sample, resident_overlapped_link_bytes_per_train_sample,
  resident_cycles_per_train_sample: behind it;
  baud_error               the UART's real rate (clock / divisor) relative to the baud, minus 1.
"""

import argparse
import importlib
import json
import sys
from pathlib import Path

from ember import bench, data, spec
from ember_hw.uart import baud_error, uart_divisor

from .build import BOARDS


def throughput(board, report=None, batches=2):
    """The throughput figures of `board` (module docstring), as a dict."""
    build = spec.BUILDS[board]
    batch = min(32, build.max_batch)
    digits = data.load_digits()
    figures = bench.dense_engine_figures(digits, batches=batches, build=build,
                                         batch_size=batch)
    if "resident" in build.features:
        figures.update(bench.dense_resident_figures(digits, build, batch_size=batch))
    clock_mhz, source = build.clock_hz / 1e6, "PLL target (spec.BUILDS)"
    if report and Path(report).exists():
        r = json.loads(Path(report).read_text())
        if r.get("timing_met") and r.get("target_mhz"):
            clock_mhz, source = r["target_mhz"], f"met in {report}"
    return {"board": board, "lanes": build.lanes, "batch_size": batch,
            "clock_source": source, **link_of(board),
            **implied(figures, clock_mhz, build.baud)}


def link_of(board):
    """The UART of `board`'s bitstream: its build's baud, the divisor at the clock the PLL
    gives, and the rate error that divisor leaves."""
    build = spec.BUILDS[board]
    clk_hz = int(round(importlib.import_module(f"ember_boards.{board}").pll_for(build).f_out_hz))
    return {"uart_divisor": uart_divisor(clk_hz, build.baud),
            "baud_error": round(baud_error(clk_hz, build.baud), 6)}


def implied(figures, clock_mhz, baud):
    """Training samples per second of the engine at `clock_mhz`, of a UART link at `baud`
    (8N1: 10 bits per byte) and of the two in turn (streaming), from
    dense_engine_figures-style `figures`."""
    cycles = figures["cycles_per_train_sample"]
    link_bytes = figures["link_bytes_per_train_sample"]
    engine_rate = clock_mhz * 1e6 / cycles
    link_rate = baud / spec.UART_FRAME_BITS / link_bytes
    return {
        "clock_mhz": clock_mhz,
        "cycles_per_train_sample": round(cycles, 1),
        "cycles_per_infer_sample": round(figures["cycles_per_infer_sample"], 1),
        "utilization": {k: round(v, 3) for k, v in figures["utilization"].items()},
        "engine_samples_per_s": round(engine_rate),
        "link_bytes_per_train_sample": round(link_bytes, 1),
        "baud": baud,
        "link_samples_per_s": round(link_rate, 1),
        "streaming_samples_per_s": round(1 / (1 / engine_rate + 1 / link_rate), 1),
        "resident_samples_per_s": None,
        "bound_by": "link" if link_rate < engine_rate else "engine",
        **resident(figures, clock_mhz, baud, engine_rate),
    }


def resident(figures, clock_mhz, baud, engine_rate):
    """The resident figures (module docstring) of a build with the unit, else
    resident_samples_per_s None."""
    if "resident_cycles_per_train_sample" not in figures:
        return {"resident_samples_per_s": None}
    cycles = figures["resident_cycles_per_train_sample"]
    link_bytes = figures["resident_link_bytes_per_train_sample"]
    overlapped = figures["resident_overlapped_link_bytes_per_train_sample"]
    per_byte = spec.UART_FRAME_BITS / baud
    rate = 1 / (max(cycles / (clock_mhz * 1e6), overlapped * per_byte)
                + (link_bytes - overlapped) * per_byte)
    return {"resident_cycles_per_train_sample": round(cycles, 1),
            "resident_link_bytes_per_train_sample": round(link_bytes, 3),
            "resident_overlapped_link_bytes_per_train_sample": round(overlapped, 3),
            "resident_samples_per_s": round(rate, 1),
            "resident_of_engine": round(rate / engine_rate, 3)}


def _summary(r):
    resident = r["resident_samples_per_s"]
    return "\n".join([
        f"{r['board']}: {r['lanes']} lanes, batch {r['batch_size']}, "
        f"{r['cycles_per_train_sample']} cycles per training sample at {r['clock_mhz']:g} MHz "
        f"({r['clock_source']})",
        f"  link: {r['baud']} baud (divisor {r['uart_divisor']}, error {r['baud_error']:+.2%}), "
        f"{r['link_bytes_per_train_sample']} bytes per sample",
        f"  samples/s: engine {r['engine_samples_per_s']}, link {r['link_samples_per_s']}, "
        f"streaming {r['streaming_samples_per_s']} (bound by the {r['bound_by']}), "
        "resident " + (f"{resident} ({r['resident_of_engine']:.1%} of the engine's; "
                       f"{r['resident_cycles_per_train_sample']} cycles and "
                       f"{r['resident_link_bytes_per_train_sample']} link bytes per sample, "
                       f"{r['resident_overlapped_link_bytes_per_train_sample']} of them "
                       "while the engine works)"
                       if resident is not None else "n/a (the build has no resident data)"),
    ])


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ember_boards.throughput",
                                 description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__[__doc__.index("Figures:"):])
    ap.add_argument("--board", required=True, choices=sorted(BOARDS))
    ap.add_argument("--report", help="the build's report.json (default build/<board>/)")
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--json", action="store_true",
                    help="print one JSON object: engine_samples_per_s, link_samples_per_s, "
                         "streaming_samples_per_s, resident_samples_per_s (null on a "
                         "build without resident data), baud, baud_error and the figures "
                         "behind them")
    args = ap.parse_args(argv)
    report = args.report or f"build/{args.board}/report.json"
    result = throughput(args.board, report, args.batches)
    print(json.dumps(result, indent=1) if args.json else _summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
