"""Parts every board top shares: the engine clock domain behind a PLL, the engine on the
board's FTDI UART, and the status LEDs.

`engine_domain(m, pll_clk, pll_lock, hold_cycles)` makes the ``sync`` domain (the engine's)
from a PLL output and holds its reset until the PLL has locked and then `hold_cycles` more
cycles have passed. The hold covers the iCE40 block RAMs, which read as zero for about 3 us
after configuration (Amaranth's own iCE40 clock domain waits 15 us for the same reason), and
gives the PLL output time to settle. Losing lock asserts reset again at once (asynchronously);
release is synchronous to the engine clock.

`engine_on_uart(m, platform, build, clk_hz, leds)` adds `EngineUartTop(build)` with the
UART divisor of `build.baud` (the board's rate; a simulation may give a build with another)
for the clock the PLL really gives, wires it to ``platform.request("uart")`` and drives
three LEDs: ``busy`` (a command is running), ``link_busy`` (the bridge is handling a frame)
and ``heartbeat`` (toggles about once a second while the engine clock runs and is out of
reset). Busy pulses are stretched to about 0.1 s (2 to 3 ticks of 2**(n-4) cycles) so
a single short frame is visible.
"""

from amaranth import ClockDomain, ClockSignal, Module, Signal
from amaranth.lib import io
from amaranth.lib.cdc import FFSynchronizer, ResetSynchronizer

from ember import spec
from ember_hw.counters import COUNTER_MEMORY
from ember_hw.top import EngineUartTop
from ember_hw.uart import uart_divisor

__all__ = ["ENGINE_CORE_CELLS", "RESET_HOLD_SECONDS", "engine_domain", "hold_cycles_for",
           "engine_on_uart", "output_pin", "read_collision_script"]

#: Time the engine stays in reset after the PLL locks (5x the iCE40 BRAM start-up time).
RESET_HOLD_SECONDS = 15e-6


def engine_domain(m: Module, pll_clk, pll_lock, hold_cycles):
    """Create the ``sync`` domain on `pll_clk`, in reset until `pll_lock` has been high for
    `hold_cycles` cycles of `pll_clk`."""
    m.domains.sync = ClockDomain("sync")
    # A reset-less domain on the same clock counts the hold time: it must run while sync is
    # still in reset, and FPGA configuration starts its counter at zero.
    m.domains.por = ClockDomain("por", reset_less=True, local=True)
    m.d.comb += [ClockSignal("sync").eq(pll_clk), ClockSignal("por").eq(pll_clk)]

    locked = Signal()
    m.submodules.lock_sync = FFSynchronizer(pll_lock, locked, o_domain="por")
    hold = Signal(range(hold_cycles + 1))
    ready = Signal()
    m.d.comb += ready.eq(hold == hold_cycles)
    with m.If(~locked):
        m.d.por += hold.eq(0)
    with m.Elif(~ready):
        m.d.por += hold.eq(hold + 1)
    m.submodules.reset_sync = ResetSynchronizer(~pll_lock | ~ready, domain="sync")


def hold_cycles_for(clk_hz):
    """Cycles of `clk_hz` in RESET_HOLD_SECONDS (at least 16)."""
    return max(16, int(RESET_HOLD_SECONDS * clk_hz))


def output_pin(m: Module, platform, name, number=0):
    """The 1-bit output signal of resource `name` `number` (through the platform's buffer,
    which applies the resource's inversion: an active-low LED is lit by 1)."""
    port = platform.request(name, number, dir="-")
    m.submodules[f"pin_{name}_{number}"] = buf = io.Buffer("o", port)
    return buf.o


#: Where the engine core sits in a board top's hierarchy (``engine_on_uart``'s "engine", then
#: EngineUartTop's "top", then EngineTop's "core"): the prefix of the names Yosys gives the
#: core's cells once the design is flattened (a floorplan names cells with it).
ENGINE_CORE_CELLS = "engine.top.core."


def engine_on_uart(m: Module, platform, build: spec.Build, clk_hz, leds):
    """Add the engine (``m.submodules.engine``) on the board's UART at `build.baud`, which its
    BAUD register reads back.

    `clk_hz` is the engine clock the PLL gives; `leds` maps "busy", "link_busy" and
    "heartbeat" to 1-bit output signals (`output_pin`). Returns the engine top.
    Raises ValueError (uart_divisor) if `clk_hz` cannot make `build.baud`.
    """
    divisor = uart_divisor(int(round(clk_hz)), build.baud)
    m.submodules.engine = engine = EngineUartTop(build, divisor)
    uart = platform.request("uart", 0, dir="-")
    # the UART receiver has its own synchronizer, so the pin needs no register here
    m.submodules.pin_uart_rx = rx_buf = io.Buffer("i", uart.rx)
    m.submodules.pin_uart_tx = tx_buf = io.Buffer("o", uart.tx)
    m.d.comb += [engine.rx.eq(rx_buf.i), tx_buf.o.eq(engine.tx)]

    # heartbeat: bit n-1 of an n-bit counter toggles every 2**(n-1) cycles (0.5..1 s)
    n = max(2, int(clk_hz).bit_length() - 1)
    beat = Signal(n)
    m.d.sync += beat.eq(beat + 1)
    m.d.comb += leds["heartbeat"].eq(beat[-1])

    # pulse stretcher: an activity LED stays on for 2..3 ticks of 2**(n-4) cycles after its
    # signal falls, so a frame of a few bytes still shows
    tick = Signal()
    m.d.comb += tick.eq(beat[:n - 4] == 0)
    for name, source in (("busy", engine.busy), ("link_busy", engine.link_busy)):
        stretch = Signal(2, name=f"{name}_stretch")
        with m.If(source):
            m.d.sync += stretch.eq(3)
        with m.Elif(tick & (stretch != 0)):
            m.d.sync += stretch.eq(stretch - 1)
        m.d.comb += leds[name].eq(source | (stretch != 0))
    return engine


def read_collision_script():
    """Yosys commands, to run right after the design is read, that let the read port of each
    of the design's memories return any value for a word written in the same cycle.

    Amaranth's read ports are "read first" (not transparent): a read of the word being written
    returns the old word. The block RAMs of neither FPGA promise that for a read and a write on
    different ports, so Yosys builds it from logic: a register of the written data and address
    and a comparator and multiplexer on the read data, for every memory (about 280 logic cells
    of the iCEBreaker build, 5 % of the UP5K). Ember never uses a read of a word written in the
    same cycle (ember_hw.engine, "Memory collisions"; the simulation tests check it), so the
    read ports are marked as such (Yosys's COLLISION_X_MASK, which Amaranth does not expose)
    and map onto the block RAMs as they are.

    The counters' memory is left alone: its write port is on the falling edge (ember_hw.counters),
    so a read and a write never share a clock edge and Yosys needs no collision logic for it.
    """
    return [f"setparam -set COLLISION_X_MASK 1 t:$memrd_v2 r:MEMID=\\{COUNTER_MEMORY} %d"]
