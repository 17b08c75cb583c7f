"""The simulated board: an engine top with host-side byte FIFOs that cocotb fills and drains.

The FIFOs let the simulator-side server move whole frames without a Python wake-up on every
edge: it writes a request's bytes one per cycle into `host_w_*` (the FIFO is deeper than the
longest frame, and the host keeps at most one frame in flight), then lets the simulation run
freely with a `Timer`, and drains `host_r_*` when `host_r_level` says bytes are waiting.

Variants:
  "stream": EngineTop, bytes straight into the link bridge (fast);
  "uart":   EngineUartTop with a host-side UART pair, so every byte crosses the engine's
            UART pins as bits (8N1, `divisor` cycles per bit).
"""

from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ember import spec
from ember.protocol import MAX_REQUEST_BYTES, MAX_RESPONSE_BYTES
from ember_hw.top import EngineTop, EngineUartTop
from ember_hw.uart import UARTRx, UARTTx

#: Deeper than a fully escaped longest frame (every byte doubled) plus delimiters.
FIFO_DEPTH = 1 << (2 * max(MAX_REQUEST_BYTES, MAX_RESPONSE_BYTES) + 4).bit_length()


class SimBoard(wiring.Component):
    """Ports (all synchronous to `clk`):
      host_w_data In(8), host_w_en In(1): push a byte towards the engine;
      host_r_data Out(8), host_r_rdy Out(1), host_r_en In(1): pop a byte the engine sent;
      host_r_level Out: bytes waiting; busy Out(1): the engine runs a command;
      idle Out(1): no command, no frame in the bridge and no byte waiting towards the engine
      (bytes may still be crossing the UART wires: the bench allows for that).
    """

    def __init__(self, build=spec.DEFAULT_BUILD, variant="stream", divisor=4):
        if variant not in ("stream", "uart"):
            raise ValueError(f"variant '{variant}' is not 'stream' or 'uart'")
        self.build, self.variant, self.divisor = build, variant, divisor
        super().__init__({
            "host_w_data": In(8), "host_w_en": In(1),
            "host_r_data": Out(8), "host_r_rdy": Out(1), "host_r_en": In(1),
            "host_r_level": Out(range(FIFO_DEPTH + 1)),
            "busy": Out(1), "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.to_engine = to_engine = SyncFIFOBuffered(width=8, depth=FIFO_DEPTH)
        m.submodules.to_host = to_host = SyncFIFOBuffered(width=8, depth=FIFO_DEPTH)
        m.d.comb += [to_engine.w_data.eq(self.host_w_data), to_engine.w_en.eq(self.host_w_en),
                     self.host_r_data.eq(to_host.r_data), self.host_r_rdy.eq(to_host.r_rdy),
                     to_host.r_en.eq(self.host_r_en), self.host_r_level.eq(to_host.r_level)]
        if self.variant == "stream":
            m.submodules.engine = engine = EngineTop(self.build)
            src, sink = engine.rx, engine.tx
        else:
            m.submodules.engine = engine = EngineUartTop(self.build, self.divisor)
            m.submodules.host_tx = host_tx = UARTTx(self.divisor)
            m.submodules.host_rx = host_rx = UARTRx(self.divisor)
            m.d.comb += [engine.rx.eq(host_tx.tx), host_rx.rx.eq(engine.tx)]
            src, sink = host_tx.i, host_rx.o
        m.d.comb += [src.payload.eq(to_engine.r_data), src.valid.eq(to_engine.r_rdy),
                     to_engine.r_en.eq(src.ready),
                     to_host.w_data.eq(sink.payload), to_host.w_en.eq(sink.valid),
                     sink.ready.eq(to_host.w_rdy), self.busy.eq(engine.busy),
                     self.idle.eq(~engine.busy & ~engine.link_busy & ~to_engine.r_rdy)]
        return m
