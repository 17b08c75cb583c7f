"""The simulated board as a process: `python -m ember_sim.board` builds the engine's RTL
(cached), starts it in Verilator or Icarus under cocotb, and serves its link on a loopback TCP
port that the host opens with pyserial's `socket://` URL (ember.device.open_device('sim')).

    python -m ember_sim.board --simulator verilator --build sim --port-file PATH [--uart]
    python -m ember_sim.board --top icebreaker|ulx3s [--build B] --port-file PATH

The chosen port is written to --port-file once the simulator listens; the process ends when
the host closes the connection. With --progress-file, the bench keeps the simulated time in
that file, and the host measures its link timeouts on it (ember.device.SimulationClock).

With --top, the simulated design is a board's real top (ember_sim.board_sim: the PLL, reset
hold, engine on the UART pins and LEDs of ember_boards.icebreaker or ember_boards.ulx3s, for
the board's own build unless --build names another) and every byte crosses its UART pins as
bits, --divisor clock cycles each (default the board's bitstream's, ember_sim.board_sim.
DEFAULT_DIVISOR: its clock over its build's baud). The bench's
findings (cycles, what the LED pins did) are printed as a last line
``board result: {json}``.
"""

import argparse
import json
import sys

from ember import spec


def toplevel_name(build, variant):
    # (a Verilog name: with_dataflow's builds have a "-" in theirs)
    name = build.name.replace("-", "_")
    return f"ember_board_{name}{'_spram' if build.weight_spram else ''}_{variant}"


def build_board(build, simulator, variant="stream", divisor=4):
    """Compile (or reuse) the simulated board for a build; returns the rtl.SimBuild.

    The board's clock runs inside the design (rtl.with_free_running_clock, period
    ember_sim.clock.CLOCK_PERIOD_NS), and only the top's ports are reachable from the bench
    (rtl.build's public="ports"): the two changes that make Verilator simulate it at full
    speed (docs/architecture.md, "Simulated board: where the time goes")."""
    from ember_sim import clock, rtl
    from ember_sim.board_top import SimBoard
    rtl.require_simulator(simulator)
    name = toplevel_name(build, variant)
    text = rtl.with_free_running_clock(rtl._verilog_text(SimBoard(build, variant, divisor), name),
                                       name, "clk", clock.CLOCK_PERIOD_NS * 1000, reset="rst")
    sources, args = [], []
    if simulator == "icarus":
        text = rtl.icarus_time_zero_fix(text)
    else:
        args += rtl.TIMING_BUILD_ARGS
    if build.weight_spram:
        # weights in SB_SPRAM256KA instances (ember_hw.weights): Yosys's models simulate them
        sources.append(rtl.ice40_cells_sim())
        args += rtl.ICE40_MODEL_ARGS
    path = rtl.default_build_dir(name, simulator) / f"{name}.v"
    path.parent.mkdir(parents=True, exist_ok=True)
    rtl._write_if_changed(path, text)
    return rtl.build(path, name, simulator, extra_sources=sources, build_args=args,
                     public="ports")


def main(argv=None):
    from ember_sim import board_sim
    ap = argparse.ArgumentParser(prog="python -m ember_sim.board", description=__doc__)
    ap.add_argument("--simulator", default="verilator", choices=("verilator", "icarus"))
    ap.add_argument("--build", choices=sorted(spec.BUILDS),
                    help="engine build (default: sim, or the board's own with --top)")
    ap.add_argument("--dataflow", choices=spec.DATAFLOWS,
                    help="the build on this engine instead of its own (spec.with_dataflow)")
    ap.add_argument("--top", choices=board_sim.BOARDS,
                    help="simulate this board's top through its pins")
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--progress-file",
                    help="keep the simulated time here for the host's link timeouts "
                         "(ember.device.SimulationClock)")
    ap.add_argument("--uart", action="store_true", help="bytes cross the engine's UART as bits")
    ap.add_argument("--divisor", type=int,
                    help="clock cycles per UART bit (default 4; with --top, the board's "
                         "bitstream's: ember_sim.board_sim.DEFAULT_DIVISOR)")
    ap.add_argument("--accept-timeout", type=float, default=120.0)
    ap.add_argument("--build-only", action="store_true")
    args = ap.parse_args(argv)
    from ember_sim import rtl
    if args.top:
        return _serve_top(args)
    build = spec.BUILDS[args.build or "sim"]
    if args.dataflow:
        build = spec.with_dataflow(build, args.dataflow)
    args.divisor = args.divisor or 4
    variant = "uart" if args.uart else "stream"
    sim_build = build_board(build, args.simulator, variant, args.divisor)
    if args.build_only:
        print(f"built {sim_build.toplevel} for {args.simulator} in {sim_build.seconds:.1f} s")
        return 0
    outcome = rtl.run(sim_build, "ember_sim.benches.board_bench", testcase="serve",
                      case={"port_file": args.port_file, "port": args.port,
                            "accept_timeout_s": args.accept_timeout,
                            "progress_file": args.progress_file,
                            # stream: `idle` covers every byte in flight; uart: bytes may
                            # still cross the wires (three bytes' time, and some)
                            "quiet_cycles": 64 + 30 * args.divisor if args.uart else 0})
    print("board result: " + json.dumps(outcome.result), flush=True)
    return 0


def _serve_top(args):
    from ember_sim import board_sim, rtl
    build = spec.BUILDS[args.build or args.top]
    divisor = args.divisor or board_sim.DEFAULT_DIVISOR[args.top]
    sim_build, top = board_sim.build_board_top(args.top, args.simulator, build, divisor)
    if args.build_only:
        print(f"built {sim_build.toplevel} for {args.simulator} in {sim_build.seconds:.1f} s")
        return 0
    outcome = rtl.run(sim_build, "ember_sim.benches.board_bench", testcase="serve_pins",
                      case={"port_file": args.port_file, "port": args.port,
                            "accept_timeout_s": args.accept_timeout,
                            "progress_file": args.progress_file,
                            "quiet_cycles": 64 + 30 * divisor,
                            **top.bench_case()})
    print("board result: " + json.dumps(outcome.result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
