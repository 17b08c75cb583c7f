"""A lane-banked memory: P words of ``lane_bits`` side by side, one memory per lane.

The engine's weight memory (portable path) and gradient memory hold one entry per lane in
each word, and every lane reads its own entry. As one wide ``Memory`` (P x 16 bits), synthesis
cuts the word into block RAMs of the primitive's width (18 bits on the ECP5), so a block RAM
holds parts of two lanes and each lane's entry comes from two block RAMs. The placer then has
no place where a lane's logic is near all of its memory: on the ULX3S build (32 lanes) each
lane's cells spread over 70 columns of the ECP5-85F and routing did not converge (docs/
boards.md). Here each lane has a memory of its own, ``lane_bits`` wide, so each lane's entry
is in block RAMs that hold nothing else.

The ports behave exactly as one ``Memory`` of ``lanes * lane_bits`` bits with one read port
(synchronous, not transparent: a read in the cycle of a write to the same word returns the old
word) and one write port of ``lane_bits`` granularity: every lane's memory gets the same
address and read enable; lane i takes bits ``lane_bits * i ..`` of the data and write enable i.

Ports (``sync`` domain):

- ``rd``: ``Out(ReadPort.Signature(addr_width, unsigned(lanes * lane_bits)))``: ``rd.addr``,
  ``rd.en`` (init 1) In, ``rd.data`` Out, one cycle after the read.
- ``wr``: ``Out(WritePort.Signature(addr_width, unsigned(lanes * lane_bits),
  granularity=lane_bits))``: ``wr.addr``, ``wr.data`` In; ``wr.en`` In(lanes).

``write_stages`` (default 0): registers between the write port and the lanes' memories, so
a write takes effect that many cycles after the cycle that presents it. Why: the write data
goes to every lane's block RAM, across the die on a 32-lane ECP5 build, and from a
multiplexer of the memory's writers that net was the critical path (docs/boards.md, session
14); from a register it has the cycle to itself. A user must not read a word in the cycles
between presenting its write and the write taking effect.
"""

from amaranth import Module, Signal, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory, ReadPort, WritePort
from amaranth.lib.wiring import Out
from amaranth.utils import ceil_log2


def lane_ports(lanes, depth, lane_bits):
    """The members ``rd`` and ``wr`` of a component with the ports of one memory of
    ``lanes * lane_bits``-bit words, ``depth`` deep, written ``lane_bits`` at a time."""
    shape = unsigned(lanes * lane_bits)
    addr_width = ceil_log2(depth)
    return {
        "rd": Out(ReadPort.Signature(addr_width=addr_width, shape=shape)),
        "wr": Out(WritePort.Signature(addr_width=addr_width, shape=shape,
                                      granularity=lane_bits)),
    }


class LaneMemory(wiring.Component):
    """``lanes`` memories of ``depth`` x ``lane_bits`` behind the ports of one wide memory."""

    def __init__(self, lanes, depth, lane_bits=16, write_stages=0):
        if lanes < 1 or depth < 1 or lane_bits < 1:
            raise ValueError(f"a lane memory needs lanes, depth and lane_bits >= 1, not "
                             f"{lanes}, {depth}, {lane_bits}")
        self.lanes, self.depth, self.lane_bits = lanes, depth, lane_bits
        self.write_stages = write_stages
        super().__init__(lane_ports(lanes, depth, lane_bits))

    def elaborate(self, platform):
        m = Module()
        addr, data, en = self.wr.addr, self.wr.data, self.wr.en
        for n in range(1, self.write_stages + 1):
            later = [Signal.like(v, name=f"wr{n}_{f}")
                     for v, f in ((addr, "addr"), (data, "data"), (en, "en"))]
            m.d.sync += [r.eq(v) for r, v in zip(later, (addr, data, en))]
            addr, data, en = later
        for i in range(self.lanes):
            mem = Memory(shape=unsigned(self.lane_bits), depth=self.depth, init=[])
            m.submodules[f"lane{i}"] = mem
            r = mem.read_port(transparent_for=())
            w = mem.write_port()
            m.d.comb += [r.addr.eq(self.rd.addr), r.en.eq(self.rd.en),
                         self.rd.data.word_select(i, self.lane_bits).eq(r.data),
                         w.addr.eq(addr), w.data.eq(data.word_select(i, self.lane_bits)),
                         w.en.eq(en[i])]
        return m
