"""The simulated board: an engine top with wide host-side burst ports that cocotb writes and
reads a whole burst of bytes at a time.

Python costs a wake-up per access, several simulated cycles' worth, so the bench must not
touch the design once per byte. The two burst ports move up to `BURST_BYTES` bytes per wake:

- towards the engine, the bench writes up to BURST_BYTES bytes (first byte in bits 0..7) into
  `host_w_burst` with their count in `host_w_count` and raises `host_w_load` for one cycle; the
  design hands them to the engine one per cycle, as fast as the engine takes them, and
  `host_w_busy` stays high until the last one is taken (then the bench may load the next);
- towards the host, the engine's bytes enter a FIFO deeper than the longest frame (so the
  engine never waits for the bench), and a collector moves them from the FIFO into
  `host_r_burst`, one per cycle, the newest at its top: the `host_r_count` bytes it holds are
  its top ones, the oldest lowest (`collected_bytes` reads them); `host_r_count` says how many
  it holds and `host_r_level` how many more wait in the FIFO. Raising `host_r_take` for one cycle
  empties the collector (a byte arriving in that same cycle becomes its first).

Variants:
  "stream": EngineTop, bytes straight into the link bridge (fast);
  "uart":   EngineUartTop with a host-side UART pair, so every byte crosses the engine's
            UART pins as bits (8N1, `divisor` cycles per bit).
Either way the BAUD register reads the build's Build.baud, as the model backend's does: this
board has no PLL clock to divide, and the sim backend opens no serial port to compare it with
(the board tops of ember_sim.board_sim run at their build's baud).
"""

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ember import spec
from ember.protocol import MAX_REQUEST_BYTES, MAX_RESPONSE_BYTES
from ember_hw.top import EngineTop, EngineUartTop
from ember_hw.uart import UARTRx, UARTTx

#: Deeper than a fully escaped longest frame (every byte doubled) plus delimiters.
FIFO_DEPTH = 1 << (2 * max(MAX_REQUEST_BYTES, MAX_RESPONSE_BYTES) + 4).bit_length()
#: Bytes per bench access of a burst port: a longest frame moves in about 17 wakes. Wider
#: ports cost every cycle: Verilator evaluates the burst registers' next-state logic (a
#: shift of the whole register) at every clock edge, busy or not; at 256 bytes that was
#: about a third of the board's cycle (docs/architecture.md).
BURST_BYTES = 64


class SimBoard(wiring.Component):
    """Ports (all synchronous to `clk`; the module docstring describes the burst protocol;
    ember_sim.board wraps the design so that `clk` runs inside it):
      host_w_burst In(8 * BURST_BYTES), host_w_count In(range(BURST_BYTES + 1)),
      host_w_load In(1): a burst of bytes towards the engine; host_w_busy Out(1): its bytes are
      still being taken;
      host_r_burst Out(8 * BURST_BYTES), host_r_count Out(range(BURST_BYTES + 1)): bytes the
      engine sent, collected; host_r_take In(1): empty the collector; host_r_level Out: bytes
      waiting in the FIFO behind the collector;
      busy Out(1): the engine runs a command;
      idle Out(1): no command, no frame in the bridge and no byte waiting towards the engine
      (bytes may still be crossing the UART wires: the bench allows for that).
    """

    def __init__(self, build=spec.DEFAULT_BUILD, variant="stream", divisor=4):
        if variant not in ("stream", "uart"):
            raise ValueError(f"variant '{variant}' is not 'stream' or 'uart'")
        self.build, self.variant, self.divisor = build, variant, divisor
        super().__init__({
            "host_w_burst": In(8 * BURST_BYTES), "host_w_count": In(range(BURST_BYTES + 1)),
            "host_w_load": In(1), "host_w_busy": Out(1),
            "host_r_burst": Out(8 * BURST_BYTES), "host_r_count": Out(range(BURST_BYTES + 1)),
            "host_r_take": In(1), "host_r_level": Out(range(FIFO_DEPTH + 1)),
            "busy": Out(1), "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.to_host = to_host = SyncFIFOBuffered(width=8, depth=FIFO_DEPTH)
        if self.variant == "stream":
            m.submodules.engine = engine = EngineTop(self.build)
            src, sink = engine.rx, engine.tx
        else:
            m.submodules.engine = engine = EngineUartTop(self.build, self.divisor)
            m.submodules.host_tx = host_tx = UARTTx(self.divisor)
            m.submodules.host_rx = host_rx = UARTRx(self.divisor)
            m.d.comb += [engine.rx.eq(host_tx.tx), host_rx.rx.eq(engine.tx)]
            src, sink = host_tx.i, host_rx.o

        # towards the engine: a shift register, its lowest byte offered to the engine
        pending = Signal(8 * BURST_BYTES)
        left = Signal(range(BURST_BYTES + 1))
        m.d.comb += [src.payload.eq(pending[:8]), src.valid.eq(left != 0),
                     self.host_w_busy.eq(left != 0)]
        with m.If(self.host_w_load):
            m.d.sync += [pending.eq(self.host_w_burst), left.eq(self.host_w_count)]
        with m.Elif(src.valid & src.ready):
            m.d.sync += [pending.eq(pending >> 8), left.eq(left - 1)]

        # towards the host: FIFO, then a collector the bench reads in one access
        collected = Signal(8 * BURST_BYTES)
        count = Signal(range(BURST_BYTES + 1))
        m.d.comb += [to_host.w_data.eq(sink.payload), to_host.w_en.eq(sink.valid),
                     sink.ready.eq(to_host.w_rdy),
                     self.host_r_burst.eq(collected), self.host_r_count.eq(count),
                     self.host_r_level.eq(to_host.r_level)]
        # each byte enters at the top and the older ones move down, so the `count` newest are
        # the top `count` bytes, in order; after a take the ones below them are stale
        m.d.comb += to_host.r_en.eq(self.host_r_take | (count != BURST_BYTES))
        with m.If(to_host.r_rdy & to_host.r_en):
            m.d.sync += [collected.eq(Cat(collected[8:], to_host.r_data)),
                         count.eq(Mux(self.host_r_take, 1, count + 1))]
        with m.Elif(self.host_r_take):
            m.d.sync += count.eq(0)

        m.d.comb += [self.busy.eq(engine.busy),
                     self.idle.eq(~engine.busy & ~engine.link_busy & (left == 0))]
        return m


def collected_bytes(burst_value, count):
    """The `count` bytes a `host_r_burst` value (an int) holds, oldest first."""
    return (burst_value >> (8 * (BURST_BYTES - count))).to_bytes(BURST_BYTES, "little")[:count]
