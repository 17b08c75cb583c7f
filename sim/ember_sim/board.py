"""The simulated board as a process: `python -m ember_sim.board` builds the engine's RTL
(cached), starts it in Verilator or Icarus under cocotb, and serves its link on a loopback TCP
port that the host opens with pyserial's `socket://` URL (ember.device.open_device('sim')).

    python -m ember_sim.board --simulator verilator --build sim --port-file PATH [--uart]
    python -m ember_sim.board --top icebreaker|ulx3s [--build B] --port-file PATH

The chosen port is written to --port-file once the simulator listens; the process ends when
the host closes the connection.

With --top, the simulated design is a board's real top (ember_sim.board_sim: the PLL, reset
hold, engine on the UART pins and LEDs of ember_boards.icebreaker or ember_boards.ulx3s, for
the board's own build unless --build names another) and every byte crosses its UART pins as
bits, --divisor clock cycles each (default ember_sim.board_sim.DEFAULT_DIVISOR). The bench's
findings (cycles, what the LED pins did) are printed as a last line
``board result: {json}``.
"""

import argparse
import json
import sys

from ember import spec


def toplevel_name(build, variant):
    return f"ember_board_{build.name}{'_spram' if build.weight_spram else ''}_{variant}"


def build_board(build, simulator, variant="stream", divisor=4):
    """Compile (or reuse) the simulated board for a build; returns the rtl.SimBuild."""
    from ember_sim import rtl
    from ember_sim.board_top import SimBoard
    rtl.require_simulator(simulator)
    models = {}
    if build.weight_spram:
        # weights in SB_SPRAM256KA instances (ember_hw.weights): Yosys's models simulate them
        models = {"extra_sources": [rtl.ice40_cells_sim()], "build_args": rtl.ICE40_MODEL_ARGS}
    # the bench touches the SimBoard's ports only (ember_sim.rtl.build, public="ports")
    return rtl.build(lambda: SimBoard(build, variant, divisor), toplevel_name(build, variant),
                     simulator, public="ports", **models)


def main(argv=None):
    from ember_sim import board_sim
    ap = argparse.ArgumentParser(prog="python -m ember_sim.board", description=__doc__)
    ap.add_argument("--simulator", default="verilator", choices=("verilator", "icarus"))
    ap.add_argument("--build", choices=sorted(spec.BUILDS),
                    help="engine build (default: sim, or the board's own with --top)")
    ap.add_argument("--top", choices=board_sim.BOARDS,
                    help="simulate this board's top through its pins")
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--uart", action="store_true", help="bytes cross the engine's UART as bits")
    ap.add_argument("--divisor", type=int,
                    help="clock cycles per UART bit (default 4; with --top, "
                         "ember_sim.board_sim.DEFAULT_DIVISOR)")
    ap.add_argument("--accept-timeout", type=float, default=120.0)
    ap.add_argument("--build-only", action="store_true")
    args = ap.parse_args(argv)
    from ember_sim import rtl
    if args.top:
        return _serve_top(args)
    build = spec.BUILDS[args.build or "sim"]
    args.divisor = args.divisor or 4
    variant = "uart" if args.uart else "stream"
    sim_build = build_board(build, args.simulator, variant, args.divisor)
    if args.build_only:
        print(f"built {sim_build.toplevel} for {args.simulator} in {sim_build.seconds:.1f} s")
        return 0
    outcome = rtl.run(sim_build, "ember_sim.benches.board_bench", testcase="serve",
                      case={"port_file": args.port_file, "port": args.port,
                            "accept_timeout_s": args.accept_timeout,
                            "quiet_cycles": 64 + (30 * args.divisor if args.uart else 0)})
    print("board result: " + json.dumps(outcome.result), flush=True)
    return 0


def _serve_top(args):
    from ember_sim import board_sim, rtl
    build = spec.BUILDS[args.build or args.top]
    divisor = args.divisor or board_sim.DEFAULT_DIVISOR
    sim_build, top = board_sim.build_board_top(args.top, args.simulator, build, divisor)
    if args.build_only:
        print(f"built {sim_build.toplevel} for {args.simulator} in {sim_build.seconds:.1f} s")
        return 0
    outcome = rtl.run(sim_build, "ember_sim.benches.board_bench", testcase="serve_pins",
                      case={"port_file": args.port_file, "port": args.port,
                            "accept_timeout_s": args.accept_timeout,
                            "quiet_cycles": 64 + 30 * divisor,
                            **top.bench_case()})
    print("board result: " + json.dumps(outcome.result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
