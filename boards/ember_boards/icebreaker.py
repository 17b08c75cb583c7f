"""iCEBreaker (iCE40UP5K-SG48) top: the engine at spec.BUILDS["icebreaker"] behind an SB_PLL40_PAD.

Clock: the board's 12 MHz oscillator enters on pin 35, the PLL's own input pad, so the PLL is an
SB_PLL40_PAD (the pad drives the PLL directly and leaves the global buffer to its output).
`ice40_pll(12 MHz, build.clock_hz)` picks the dividers; for the 24 MHz target that is
DIVR=0, DIVF=63, DIVQ=5, FILTER_RANGE=1: 12 MHz x 64 = 768 MHz VCO / 32 = 24.000 MHz exactly.

UART: the FT2232H's second channel (pins 6 rx, 9 tx) at build.baud: 3 Mbaud for
spec.BUILDS["icebreaker"], 8 cycles of 24 MHz per bit.
LEDs: red (pin 11) busy, green (pin 37) heartbeat, and the snap-off board's LED 2 (PMOD2 pin 7)
link_busy; if the snap-off board is detached that pin is simply an unused PMOD output.
"""

from amaranth import Elaboratable, Instance, Module, Signal
from amaranth_boards.icebreaker import ICEBreakerPlatform

from ember import spec

from .common import engine_domain, engine_on_uart, hold_cycles_for, output_pin
from .pll import ice40_pll

__all__ = ["BOARD", "pll_for", "ICEBreakerTop", "platform"]

BOARD = "icebreaker"
#: The board oscillator (ICEBreakerPlatform's "clk12").
BOARD_CLOCK_HZ = 12_000_000
CLOCK_RESOURCE = "clk12"
#: The status LEDs: role (ember_boards.common.engine_on_uart) -> (resource, number).
LEDS = {"busy": ("led_r", 0), "heartbeat": ("led_g", 0), "link_busy": ("led_r", 1)}


def platform(platform_class=ICEBreakerPlatform):
    """The iCEBreaker platform with the snap-off LED board's resources added.

    platform_class: ICEBreakerPlatform or a subclass of it (ember_sim.board_sim's simulation
    platform)."""
    plat = platform_class()
    plat.add_resources(plat.break_off_pmod)
    return plat


def pll_for(build):
    """The PLL setting (PllConfig) that makes `build.clock_hz` from the board's oscillator."""
    return ice40_pll(BOARD_CLOCK_HZ, build.clock_hz)


class ICEBreakerTop(Elaboratable):
    """The engine on an iCEBreaker.

    build: the engine build (default spec.BUILDS["icebreaker"]); its clock_hz is the PLL target.
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
        pll_clk = Signal()
        pll_lock = Signal()
        prm = self.pll.params
        m.submodules.pll = Instance(
            "SB_PLL40_PAD",
            p_FEEDBACK_PATH="SIMPLE",
            p_DIVR=prm["DIVR"], p_DIVF=prm["DIVF"], p_DIVQ=prm["DIVQ"],
            p_FILTER_RANGE=prm["FILTER_RANGE"],
            i_PACKAGEPIN=clk_pin.io,
            i_RESETB=1, i_BYPASS=0,
            o_PLLOUTGLOBAL=pll_clk, o_LOCK=pll_lock,
        )
        # nextpnr derives the engine clock's constraint from the PLL's dividers and the board
        # clock's constraint (its log: "Derived frequency constraint ... for net clk")
        engine_domain(m, pll_clk, pll_lock, hold_cycles_for(self.clock_hz))
        leds = {role: output_pin(m, platform, *resource) for role, resource in LEDS.items()}
        self.engine = engine_on_uart(m, platform, self.build, self.clock_hz, leds)
        return m
