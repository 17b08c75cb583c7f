"""ULX3S (ECP5 LFE5U-85F) top: the engine at spec.BUILDS["ulx3s"] behind an EHXPLLL.

Clock: the board's 25 MHz oscillator (pin G2) feeds an EHXPLLL with CLKOP fed back.
`ecp5_pll(25 MHz, build.clock_hz)` picks the dividers; for the 30 MHz target that is
CLKI_DIV=5, CLKFB_DIV=6, CLKOP_DIV=20: 25 MHz / 5 x 6 = 30.000 MHz exactly, VCO 600 MHz.

UART: the FT231X (FPGA pins M1 rx, L4 tx) at build.baud: 3 Mbaud for spec.BUILDS["ulx3s"] (the
FT231X's fastest rate), 10 cycles of 30 MHz per bit.
LEDs: LED 0 busy, LED 1 link_busy, LED 7 heartbeat.

Floorplan: each lane's multiplier is fixed to a DSP site (`lane_multiplier_sites`), the
lanes spread over up to three rows of DSP blocks, in lane order along a snake (the update
unit's shift registers run from lane to lane). Left to itself, nextpnr's placer put 25
of the 32 multipliers in one DSP row and each lane's logic spread over 40 to 70 columns; the
tiles around that row were the most congested, and routing never converged (docs/boards.md).
`floorplan_script` turns the sites into Yosys commands that the build runs after synthesis:
they set the ``BEL`` attribute of each lane's MULT18X18D, which nextpnr obeys, and fail the
build if a lane's multiplier is not exactly one cell of the expected name.

`EmberULX3SPlatform` is ULX3S_85F_Platform without openFPGALoader among its required tools:
amaranth-boards lists it even when nothing is programmed, and building a bitstream must not
need a programmer installed. Programming (``make prog``) calls openFPGALoader itself, and the
platform's own `toolchain_program` (``do_program=True``) still looks it up when it runs.
"""

from amaranth import Elaboratable, Instance, Module, Signal
from amaranth.lib import io
from amaranth_boards.ulx3s import ULX3S_85F_Platform

from ember import spec

from .common import ENGINE_CORE_CELLS, engine_domain, engine_on_uart, hold_cycles_for, output_pin
from .pll import ecp5_pll

__all__ = ["BOARD", "pll_for", "EmberULX3SPlatform", "ULX3STop", "floorplan_script",
           "lane_multiplier_sites", "platform"]

BOARD = "ulx3s"
#: The board oscillator (ULX3S platform's "clk25").
BOARD_CLOCK_HZ = 25_000_000
CLOCK_RESOURCE = "clk25"
#: The status LEDs: role (ember_boards.common.engine_on_uart) -> (resource, number).
LEDS = {"busy": ("led", 0), "link_busy": ("led", 1), "heartbeat": ("led", 7)}


#: The LFE5U-85F's DSP rows (nextpnr's Y; its block RAM rows are at Y 22, 46, 70 and 82, between
#: them) and its DSP blocks in each (the X of a block's first column; a block has MULT18X18D
#: sites at X, X+1, X+4 and X+5; the die is 126 columns wide). The floorplan takes two sites
#: per block, X and X+4, and at most LANES_PER_ROW lanes per row, spread evenly over up to
#: twice as many sites as the row has lanes: with lanes packed four to a block in two rows,
#: routing converged for one placement and not for the next; with the blocks of the left half
#: only (X 4 to 58), the 32-lane build crowded that half and routed only after 233 iterations
#: (docs/boards.md, session 21).
MULTIPLIER_ROWS = (34, 58, 10)          # in the order rows are taken
MULTIPLIER_BLOCKS = (4, 13, 22, 31, 40, 49, 58, 69, 78, 87, 96, 105, 114)
_BLOCK_SITES = ((0, 0), (4, 4))         # (X offset, MULT18_n)
LANES_PER_ROW = 11


def lane_multiplier_sites(lanes):
    """The DSP site (a nextpnr BEL name) of each lane's multiplier, lane 0 first: the lanes
    split evenly over as few rows as LANES_PER_ROW allows, top row first, and run along the
    rows as a snake (left to right, then right to left)."""
    rows = sorted(MULTIPLIER_ROWS[:-(-lanes // LANES_PER_ROW)])
    if lanes > LANES_PER_ROW * len(MULTIPLIER_ROWS):
        raise ValueError(f"the ULX3S floorplan places at most "
                         f"{LANES_PER_ROW * len(MULTIPLIER_ROWS)} lanes; {lanes} asked")
    along = [(x + dx, n) for x in MULTIPLIER_BLOCKS for dx, n in _BLOCK_SITES]
    sites = []
    for r, row in enumerate(rows):
        count = lanes // len(rows) + (r < lanes % len(rows))
        span = min(len(along), 2 * count)          # a few lanes stay close together
        picks = [round(i * (span - 1) / max(1, count - 1)) for i in range(count)]
        row_sites = [f"X{along[i][0]}/Y{row}/MULT18_{along[i][1]}" for i in picks]
        sites += row_sites if r % 2 == 0 else row_sites[::-1]
    return sites


#: The MAC lanes' submodule (ember_hw.lanes.MacLanes) below the engine core, by dataflow:
#: EngineCore's "lanes", and SampleCore's "lanes" of its core (ember_hw.sample_engine).
LANE_MODULES = {"outputs": "lanes.", "samples": "core.lanes."}


def floorplan_script(build):
    """Yosys commands (run after synth_ecp5) that fix lane i's multiplier, the MULT18X18D
    named after the lane's product signal ``prod<i>`` (ember_hw.lanes.MacLanes), to its
    site, for the engine of `build` (spec.Build)."""
    commands = []
    for lane, site in enumerate(lane_multiplier_sites(build.lanes)):
        cell = f"top/c:{ENGINE_CORE_CELLS}{LANE_MODULES[build.dataflow]}prod{lane}_MULT18X18D*"
        commands += [f"select -assert-count 1 {cell}", f'setattr -set BEL "{site}" {cell}']
    return commands


class EmberULX3SPlatform(ULX3S_85F_Platform):
    """ULX3S-85F that builds without openFPGALoader (see the module docstring)."""

    @property
    def required_tools(self):
        return [tool for tool in super().required_tools if tool != "openFPGALoader"]


def platform(platform_class=EmberULX3SPlatform):
    """The ULX3S-85F platform used for Ember builds.

    platform_class: EmberULX3SPlatform or a subclass of it (ember_sim.board_sim's simulation
    platform)."""
    return platform_class()


def pll_for(build):
    """The PLL setting (PllConfig) that makes `build.clock_hz` from the board's oscillator."""
    return ecp5_pll(BOARD_CLOCK_HZ, build.clock_hz)


class ULX3STop(Elaboratable):
    """The engine on a ULX3S-85F.

    build: the engine build (default spec.BUILDS["ulx3s"]); its clock_hz is the PLL target.
    The UART runs at build.baud (a simulation of the top, ember_sim.board_sim, may give a
    build with another rate).
    Attribute ``pll``: the PllConfig used; ``clock_hz``: the engine clock it gives; after
    elaboration, ``engine``: the EngineUartTop (its ``divisor`` is the UART's).
    """

    def __init__(self, build=spec.BUILDS[BOARD]):
        self.build = build
        self.pll = pll_for(build)
        self.clock_hz = self.pll.f_out_hz

    def elaborate(self, platform):
        m = Module()
        clk_pin = platform.request(CLOCK_RESOURCE, 0, dir="-")
        m.submodules.clk25_buf = clk25_buf = io.Buffer("i", clk_pin)
        pll_clk = Signal()
        pll_lock = Signal()
        prm = self.pll.params
        m.submodules.pll = Instance(
            "EHXPLLL",
            # the loop-filter settings ecppll (prjtrellis) emits for every configuration
            a_FREQUENCY_PIN_CLKI=f"{BOARD_CLOCK_HZ / 1e6:g}",
            a_FREQUENCY_PIN_CLKOP=f"{self.clock_hz / 1e6:g}",
            a_ICP_CURRENT="12", a_LPF_RESISTOR="8",
            a_MFG_ENABLE_FILTEROPAMP="1", a_MFG_GMCREF_SEL="2",
            p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
            p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA",
            p_CLKOP_ENABLE="ENABLED", p_FEEDBK_PATH="CLKOP",
            p_CLKI_DIV=prm["CLKI_DIV"], p_CLKFB_DIV=prm["CLKFB_DIV"],
            p_CLKOP_DIV=prm["CLKOP_DIV"], p_CLKOP_CPHASE=prm["CLKOP_CPHASE"], p_CLKOP_FPHASE=0,
            i_CLKI=clk25_buf.i, i_CLKFB=pll_clk,
            i_RST=0, i_STDBY=0, i_PHASESEL0=0, i_PHASESEL1=0, i_PHASEDIR=0, i_PHASESTEP=0,
            i_PHASELOADREG=0, i_PLLWAKESYNC=0, i_ENCLKOP=0,
            o_CLKOP=pll_clk, o_LOCK=pll_lock,
        )
        # nextpnr derives the engine clock's constraint from the PLL's dividers and the board
        # clock's constraint (its log: "Derived frequency constraint ... for net clk")
        engine_domain(m, pll_clk, pll_lock, hold_cycles_for(self.clock_hz))
        leds = {role: output_pin(m, platform, *resource) for role, resource in LEDS.items()}
        self.engine = engine_on_uart(m, platform, self.build, self.clock_hz, leds)
        return m
