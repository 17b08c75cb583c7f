"""Engine tops: the engine core behind the link bridge, with a byte-stream host port (for
simulation) or a UART (for boards and the bits-on-the-wire test).

`EngineTop` ports (byte stream):
  rx: In(stream.Signature(8))   bytes from the host (SLIP frames, docs/protocol.md)
  tx: Out(stream.Signature(8))  bytes to the host
  busy: Out(1)                  a command is running (for a LED)
  link_busy: Out(1)             the bridge is receiving, executing or answering a frame

`EngineUartTop` ports: rx In(1) (idle high), tx Out(1), busy Out(1); `divisor` is clock
cycles per bit (clk_hz // baud).
"""

from amaranth import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ember import spec

from .engine import EngineCore
from .link import LinkBridge
from .sample_core import SampleCore
from .uart import UARTRx, UARTTx


class EngineTop(wiring.Component):
    rx: In(stream.Signature(8))
    tx: Out(stream.Signature(8))
    busy: Out(1)
    link_busy: Out(1)

    def __init__(self, build=spec.DEFAULT_BUILD):
        self.build = build
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.bridge = bridge = LinkBridge()
        # the engine generation by the build's dataflow: v1's EngineCore, or engine v2's
        m.submodules.core = core = (SampleCore(self.build) if self.build.dataflow == "samples"
                                    else EngineCore(self.build))
        wiring.connect(m, bridge.bus, core.bus)
        wiring.connect(m, wiring.flipped(self.rx), bridge.rx)
        wiring.connect(m, bridge.tx, wiring.flipped(self.tx))
        m.d.comb += [core.link_rx.eq(bridge.rx_bytes), core.link_tx.eq(bridge.tx_bytes),
                     self.busy.eq(core.busy), self.link_busy.eq(bridge.busy)]
        return m


class EngineUartTop(wiring.Component):
    rx: In(1, init=1)
    tx: Out(1, init=1)
    busy: Out(1)
    link_busy: Out(1)

    def __init__(self, build=spec.DEFAULT_BUILD, divisor=4):
        self.build, self.divisor = build, divisor
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.uart_rx = urx = UARTRx(self.divisor)
        m.submodules.uart_tx = utx = UARTTx(self.divisor)
        m.submodules.top = top = EngineTop(self.build)
        wiring.connect(m, urx.o, top.rx)
        wiring.connect(m, top.tx, utx.i)
        m.d.comb += [urx.rx.eq(self.rx), self.tx.eq(utx.tx), self.busy.eq(top.busy),
                     self.link_busy.eq(top.link_busy)]
        return m
