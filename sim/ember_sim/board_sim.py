"""The board tops in simulation, end to end through their pins.

`build_board_top(board, build, simulator)` compiles the real top of a board
(ember_boards.icebreaker.ICEBreakerTop, ember_boards.ulx3s.ULX3STop: the PLL instance, the
reset hold, the engine on the UART pins, the LEDs) for Verilator or Icarus, and returns with it
the `BoardTopSim` that tells the bench (ember_sim.benches.board_bench, test ``serve_pins``)
which port is which. The clock pin is driven inside the simulated design (a wrapper module,
ember_sim.rtl.with_free_running_clock), the bench turns the host's bytes into UART bits
on the rx pin and the tx pin's bits back into bytes, and serves them on a loopback socket
like the simulated board of ember_sim.board; ``python -m ember_sim.board --top icebreaker``
and ``ember.device.open_device("sim", ..., top="icebreaker")`` use it.

How the pins become ports
-------------------------
`simulation_platform(base)` subclasses the board's amaranth-boards platform (the class that
``ember_boards.<board>.platform()`` builds) and changes two things. Its ``toolchain_prepare``,
where a bitstream build writes RTLIL and scripts, returns the design as Verilog. Everything
before that is ``Platform.prepare`` as for a bitstream: the top is elaborated with the
board's resources, so ``platform.request("uart")``, the clock and the LEDs return the board's
pins (with their inversion: the iCEBreaker's red and green LEDs are active low), and every pin
becomes a port of the top module, named as in the constraint files (``clk12_0__io``,
``uart_0__rx__io``, ``led_r_0__io``...). And its ``get_io_buffer`` gives each ``io.Buffer``
Amaranth's generic implementation (an IOBufferInstance after the resource's inversion) instead
of the vendor primitive (SB_IO on the iCE40, IB/OBZ on the ECP5), so the pins are plain
``input`` and ``output`` ports. Those buffers are the one part of the netlist that differs from
a bitstream's: Yosys's models of them do not build in Verilator (SB_IO's pad is an ``inout``
with tristate logic that Verilator does not support on top-level ports; TRELLIS_IO drives its
input pad with z).

Primitive models
----------------
The iCEBreaker build keeps its weights in SB_SPRAM256KA, simulated by Yosys's
share/ice40/cells_sim.v as in ember_sim.board. The PLLs are MODELLED, NOT SIMULATED
(models/pll_models.v): SB_PLL40_PAD and EHXPLLL pass their reference clock through and raise
LOCK after 64 reference cycles. The bench therefore drives the board's clock pin at the PLL's
*output* frequency (the top's ``clock_hz``: 24 MHz on the iCEBreaker, 30 MHz on the ULX3S),
in whole picoseconds (BoardTopSim.clock_period_ps),
not at the oscillator's; what the PLL dividers give is checked by tests/test_boards.py and, on
the chip, by nextpnr. Yosys's cells_sim.v declares SB_PLL40_PAD as an empty blackbox, so the
iCEBreaker simulation compiles a copy of it without that module (build/sim/models/).

UART speed
----------
The top's UART runs at its build's baud (ember_boards.common.engine_on_uart), by default the
board's own: 3 Mbaud, 8 cycles per bit of the iCEBreaker's 24 MHz and 10 of the ULX3S's
30 MHz, as in the bitstream. The bench's side of the line uses the same bit time. A `divisor`
given instead makes the build's baud the clock divided by it (the BAUD register reads that).
"""

import dataclasses
import hashlib
import importlib
import re
from pathlib import Path

from ember import spec

__all__ = ["BOARDS", "TOPS", "DEFAULT_DIVISOR", "PLL_MODELS", "BoardTopSim",
           "simulation_platform", "board_top", "toplevel_name", "board_verilog",
           "build_board_top", "model_sources"]

BOARDS = spec.BOARDS
#: Clock cycles per UART bit of each board's bitstream (and so of its simulated top): its
#: clock over its build's baud.
DEFAULT_DIVISOR = {board: spec.BUILDS[board].clock_hz // spec.BUILDS[board].baud
                   for board in BOARDS}
PLL_MODELS = Path(__file__).resolve().parent / "models" / "pll_models.v"
#: Reference cycles from reset release to LOCK in models/pll_models.v (parameter LOCK_CYCLES).
PLL_LOCK_CYCLES = 64


@dataclasses.dataclass(frozen=True)
class BoardTopSim:
    """A board top as simulated: what the bench needs to drive it through its pins.

    build: the engine build the top was given (its clock_hz is the board's PLL target);
    clock_hz: the PLL's output, at which the bench drives the clock pin (see the module
    docstring); divisor: clock cycles per UART bit; clock, rx, tx: port names of the pins;
    leds: role (busy, link_busy, heartbeat) -> (port name, active low); startup_cycles:
    cycles after which the engine is surely out of reset (PLL lock and the reset hold).
    """
    board: str
    toplevel: str
    build: spec.Build
    clock_hz: float
    divisor: int
    clock: str
    rx: str
    tx: str
    leds: dict
    startup_cycles: int

    @property
    def clock_period_ps(self):
        """The clock pin's period in whole picoseconds (even, for two equal halves)."""
        return 2 * round(1e12 / self.clock_hz / 2)

    def bench_case(self):
        """The pin part of the bench's case (ember_sim.benches.board_bench.serve_pins)."""
        return {"clock": self.clock, "rx": self.rx, "tx": self.tx,
                "leds": {role: list(led) for role, led in self.leds.items()},
                "clock_period_ps": self.clock_period_ps, "divisor": self.divisor,
                "startup_cycles": self.startup_cycles}


def simulation_platform(base):
    """A subclass of the board platform class `base` whose ``prepare(top, name)`` returns
    (Verilog text, {(resource, number): the port ``request`` returned})."""

    from amaranth.lib import io

    class SimulationPlatform(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.requested_ports = {}

        def request(self, name, number=0, **kwargs):
            port = super().request(name, number, **kwargs)
            self.requested_ports[name, number] = port
            return port

        def get_io_buffer(self, buffer):
            # Amaranth's generic buffer (IOBufferInstance, with the resource's inversion) in
            # place of the vendor's primitive: see "How the pins become ports"
            if type(buffer) is not io.Buffer:
                raise TypeError(f"{buffer!r}: the simulated board tops use io.Buffer only")
            return io.Buffer.elaborate(buffer, None)

        def toolchain_prepare(self, design, name, **kwargs):
            # what a bitstream build converts to RTLIL: the design with the pins as its ports
            from amaranth.back import verilog
            from ember_sim import rtl
            with rtl.builtin_yosys():        # the same Verilog whatever YOSYS names
                text, _ = verilog.convert_fragment(design, name=name, emit_src=False,
                                                   propagate_domains=False)
            return text, dict(self.requested_ports)

    SimulationPlatform.__name__ = SimulationPlatform.__qualname__ = f"Simulation{base.__name__}"
    return SimulationPlatform


def _board_module(board):
    if board not in BOARDS:
        raise ValueError(f"board '{board}' is not one of {', '.join(BOARDS)}")
    return importlib.import_module(f"ember_boards.{board}")


#: The top class of each board's module.
TOPS = {"icebreaker": "ICEBreakerTop", "ulx3s": "ULX3STop"}


def board_top(board, build=None, divisor=None):
    """The real top of `board` for `build` (default the board's own), with a UART of `divisor`
    clock cycles per bit (default the board's, DEFAULT_DIVISOR). The top keeps its board's
    clock (the PLL setting of a bitstream) and, unless `divisor` says otherwise, its board's
    baud whatever the build, as tests/test_boards.py does. Returns (module, top)."""
    from ember_hw.uart import uart_divisor
    mod = _board_module(board)
    top_class = getattr(mod, TOPS[board])
    divisor = divisor or DEFAULT_DIVISOR[board]
    clock_hz = spec.BUILDS[board].clock_hz
    build = dataclasses.replace(build or spec.BUILDS[board], clock_hz=clock_hz,
                                baud=clock_hz // divisor)
    top = top_class(build)
    # the top derives its divisor from the clock its PLL really gives
    if uart_divisor(int(round(top.clock_hz)), build.baud) != divisor:
        raise ValueError(f"{board}: {build.baud} baud is not {divisor} cycles per bit at "
                         f"{top.clock_hz / 1e6:g} MHz")
    return mod, top


def toplevel_name(board, build, divisor):
    """Verilog name (and build directory) of a simulated top; a build that is not one of
    spec.BUILDS gets a digest of its fields."""
    name = f"ember_top_{board}_{build.name}_d{divisor}"
    if spec.BUILDS.get(build.name) != build:
        name += "_" + hashlib.sha256(repr(build).encode()).hexdigest()[:8]
    return name


def board_verilog(board, build=None, divisor=None):
    """Verilog of the board top with its pins as ports; returns (text, BoardTopSim)."""
    from ember_boards.common import hold_cycles_for
    divisor = divisor or DEFAULT_DIVISOR[board]
    mod, top = board_top(board, build, divisor)
    name = toplevel_name(board, build or spec.BUILDS[board], divisor)
    plat = mod.platform(simulation_platform(type(mod.platform())))
    text, ports = plat.prepare(top, name=name)

    def pin(resource, number=0, sub=None):
        port = ports[resource, number]
        port = getattr(port, sub) if sub else port
        return port.io.name, bool(port.invert[0])

    uart = ("uart", 0)
    info = BoardTopSim(
        board=board, toplevel=name, build=top.build, clock_hz=top.clock_hz, divisor=divisor,
        clock=pin(mod.CLOCK_RESOURCE)[0], rx=pin(*uart, "rx")[0], tx=pin(*uart, "tx")[0],
        leds={role: pin(*resource) for role, resource in mod.LEDS.items()},
        startup_cycles=PLL_LOCK_CYCLES + hold_cycles_for(top.clock_hz) + 64)
    header = re.search(rf"^module {re.escape(name)}\((.*?)\);", text, re.M | re.S)
    missing = [p for p in (info.clock, info.rx, info.tx, *(n for n, _ in info.leds.values()))
               if not header or p not in header.group(1)]
    if missing:
        raise RuntimeError(f"{name}: pins {missing} are not ports of the top module")
    return text, info


def _write_if_changed(path, text):
    from ember_sim import rtl
    path.parent.mkdir(parents=True, exist_ok=True)
    rtl._write_if_changed(path, text)
    return path


def _ice40_cells_without_pll():
    """Yosys's iCE40 cell models without their blackbox SB_PLL40_PAD (models/pll_models.v
    has the model); written under build/sim/models/, rewritten only when it changes."""
    from ember_sim import rtl
    text = rtl.ice40_cells_sim().read_text()
    text, found = re.subn(r"\(\* blackbox \*\)\s*module SB_PLL40_PAD \(.*?^endmodule\n", "",
                          text, flags=re.S | re.M)
    if found != 1:
        raise RuntimeError(f"{rtl.ice40_cells_sim()}: found {found} SB_PLL40_PAD blackboxes")
    return _write_if_changed(rtl.BUILD_ROOT / "models" / "ice40_cells_sim_no_pll.v", text)


def model_sources(board):
    """(extra Verilog sources, build arguments) that simulate `board`'s primitives."""
    from ember_sim import rtl
    if board == "icebreaker":
        return [_ice40_cells_without_pll(), PLL_MODELS], list(rtl.ICE40_MODEL_ARGS)
    return [PLL_MODELS], []


def build_board_top(board, simulator, build=None, divisor=None):
    """Compile (or reuse) the simulated top of `board`; returns (rtl.SimBuild, BoardTopSim)."""
    from ember_sim import rtl
    rtl.require_simulator(simulator)
    text, info = board_verilog(board, build, divisor)
    # the clock pin is driven inside the design, at the PLL's output frequency (the bench
    # waits on its edges); see rtl.with_free_running_clock for why
    text = rtl.with_free_running_clock(text, info.toplevel, info.clock, info.clock_period_ps)
    timing = []
    if simulator == "icarus":
        text = rtl.icarus_time_zero_fix(text)
    else:
        timing = list(rtl.TIMING_BUILD_ARGS)
    path = _write_if_changed(rtl.default_build_dir(info.toplevel, simulator)
                             / f"{info.toplevel}.v", text)
    sources, args = model_sources(board)
    # the bench drives and reads the top's pins only (ember_sim.rtl.build, public="ports")
    return rtl.build(path, info.toplevel, simulator, extra_sources=sources,
                     build_args=args + timing, public="ports"), info
