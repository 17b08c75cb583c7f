"""Event counters in one block RAM, fed by narrow pre-counters.

Every event of docs/numerics.md ("Event accounting") is a ``spec.COUNTER_BITS``-wide counter.
Thirty 48-bit registers with their adders and a 30-way read multiplexer cost about 3,000 logic
cells on an iCE40 -- more than half the UP5K -- so the counters live in a memory instead:

- each counter has a **pre-counter**, a register just wide enough for what can arrive between
  two flushes of that counter (``bound`` per cycle for ``len(bounds)`` cycles). The increments
  go straight into it: the pre-counter is the register between the engine's increment logic
  and the wide adder, so the increments need no register of their own (only the pre-counter's
  narrow adder follows the increment logic within a cycle);
- a **flusher** visits the counters round robin, one per cycle (a counter every
  ``len(bounds)`` cycles), in pipelined steps: (A) read the counter's memory word and *take*
  its pre-counter, which restarts from this cycle's increment; (B) add word and taken value
  into a register; (C) write that sum back, on the falling clock edge. Word ``f`` is read in
  cycle ``t`` and written in the middle of ``t + 2``; it is next read in ``t + len(bounds)``.

The flusher's turn is a one-hot **ring** register rotating by one position per cycle. Its bit
``i`` is counter ``i``'s take strobe, and it selects the taken value as an AND-OR of the
pre-counters, which is a third cheaper than a multiplexer driven by a binary index.

The write port has the falling edge so that no read and write share a clock edge: synthesis
then needs no logic for a read and a write of one word in the same cycle (which never happens
here, but Amaranth cannot say so; with both ports on the rising edge yosys spends 48 LUTs or
96 flip-flops on it). The write's inputs are registers, with half a cycle to reach the RAM.

``clear`` zeroes every counter: the pre-counters restart at zero, and the next round of
flushes reads an extra word that is never written (always zero) in place of each counter's
word, so each word is rewritten from its pre-counter alone. (The flushes under way during the
clear cycle still write, and answer reads with, the values from before the clear; the round
rewrites those words too.) Reset does the same.

A read (``read_req`` with ``read_index``) is answered (``read_valid``) from step C of the
first flush of that counter whose take is in the request cycle or later: the pre-counter then
holds every increment made before the request, so the answer is exact. It comes 2 to
``len(bounds) + 1`` cycles after the request cycle.

Where the area goes (iCE40, the iCEBreaker build's 30 counters; ``synth_ice40``): the
pre-counters (238 bits) with their adders and take logic about 60%, the AND-OR selection of a
taken value about 20%, the 48-bit adder about 15%. Pre-counters whose increment is at most 3
bits wide count with plain LUT logic instead of an adder: on an iCE40 a carry chain that short
costs a carry cell per bit and no fewer logic cells.

A counter whose bound is 0 never counts (an event of a unit the build does not have): it
has no pre-counter, and its word, rewritten from a taken value of 0, reads 0.

Ports:

- ``inc``: In(StructLayout) -- one field per counter name, as wide as its ``bounds`` entry
  needs; the amount to add this cycle.
- ``clear``: In(1) -- zero every counter (this cycle's increments are dropped).
- ``read_req``: In(1), ``read_index``: In(range(len(bounds))) -- hold until ``read_valid``.
- ``read_valid``: Out(1) -- one cycle; ``read_data`` holds the counter's value then (and
  meaningless values at other times).
- ``read_data``: Out(width) -- from a register.
"""

from amaranth.hdl import Cat, ClockDomain, ClockSignal, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ember import spec

#: The name of the counters' memory (ember_boards.common.read_collision_script names it).
COUNTER_MEMORY = "words"


def _width(n):
    return max(1, int(n).bit_length())


#: Increments up to this many bits wide are added with plain logic rather than an adder.
_RIPPLE_INC_BITS = 3


def _ripple_add(a, b):
    """``a + b`` truncated to ``len(a)`` bits, written as a ripple of full adders so that
    synthesis maps it to LUTs only (an ``+`` becomes a carry chain)."""
    bits, carry = [], Const(0, 1)
    for j in range(len(a)):
        x, y = a[j], (b[j] if j < len(b) else Const(0, 1))
        bits.append(x ^ y ^ carry)
        carry = (x & y) | (carry & (x ^ y))
    return Cat(*bits)


class CounterFile(wiring.Component):
    """``bounds``: ordered {counter name: largest increment in one cycle, 0 for a counter
    that never counts}; the order is the counter index of ``read_index``. ``width``: bits of
    each counter."""

    def __init__(self, bounds, width=spec.COUNTER_BITS):
        self.names = tuple(bounds)
        self.bounds = dict(bounds)
        self.width = width
        if len(self.names) < 2:
            raise ValueError("a counter file needs at least 2 counters")
        # a pre-counter restarts from one cycle's increment at its take and gets
        # len(bounds) - 1 more before the next one; wider than the counter is pointless
        self.pre_bits = {name: min(width, _width(bound * len(self.names)))
                         for name, bound in self.bounds.items() if bound}
        layout = data.StructLayout({name: _width(bound) for name, bound in self.bounds.items()})
        super().__init__({
            "inc": In(layout),
            "clear": In(1),
            "read_req": In(1),
            "read_index": In(range(len(self.names))),
            "read_valid": Out(1),
            "read_data": Out(width),
        })

    def elaborate(self, platform):
        m = Module()
        C = len(self.names)
        ZERO = C                        # the word that is never written
        m.submodules[COUNTER_MEMORY] = words = Memory(shape=self.width, depth=C + 1, init=[])
        rd = words.read_port()
        # the write port takes the falling clock edge (see the module docstring)
        m.domains.write = write = ClockDomain(clk_edge="neg", local=True, reset_less=True)
        m.d.comb += write.clk.eq(ClockSignal())
        wr = words.write_port(domain="write")

        # the flusher's turn: counter f (binary, the memory address) and ring == 1 << f
        f = Signal(range(C))
        ring = Signal(C, init=1)
        m.d.sync += [f.eq(Mux(f == C - 1, 0, f + 1)), ring.eq(ring.rotate_left(1))]
        # the round of flushes that starts after reset or a clear reads the zero word
        fresh = Signal(range(C + 1), init=C)
        with m.If(self.clear):
            m.d.sync += fresh.eq(C)
        with m.Elif(fresh != 0):
            m.d.sync += fresh.eq(fresh - 1)

        # step A: read word f, take pre-counter f (it restarts from this cycle's increment)
        m.d.comb += rd.addr.eq(Mux(fresh != 0, ZERO, f))
        taken = Signal(max(self.pre_bits.values(), default=1))
        taken_index = Signal(range(C))
        selected = 0
        for i, name in enumerate(self.names):
            if name not in self.pre_bits:
                continue                # never counts: its taken value is 0
            pre = Signal(self.pre_bits[name], name=f"pre_{name}")
            amount = getattr(self.inc, name)
            if len(amount) <= _RIPPLE_INC_BITS:
                counted = _ripple_add(pre, amount)
            else:
                counted = pre + amount
            with m.If(self.clear):
                m.d.sync += pre.eq(0)
            with m.Elif(ring[i]):
                m.d.sync += pre.eq(amount)
            with m.Else():
                m.d.sync += pre.eq(counted)
            selected = selected | Mux(ring[i], pre, 0)
        m.d.sync += [taken.eq(selected), taken_index.eq(f)]

        # step B: add word and taken value into a register; step C: write it back (in the
        # middle of the cycle, on the falling edge) and answer a read with it
        total = Signal(self.width)
        total_index = Signal(range(C))
        m.d.sync += [total.eq(rd.data + taken), total_index.eq(taken_index)]
        m.d.comb += [wr.addr.eq(total_index), wr.data.eq(total), wr.en.eq(1)]

        # reads: `waited` counts the cycles the request has been up (to 2), so the sum in
        # `total` comes from a take at or after the request cycle, which saw every increment
        # made before the request
        waited = Signal(range(3))
        with m.If(self.read_req & ~self.read_valid):
            m.d.sync += waited.eq(Mux(waited == 2, 2, waited + 1))
        with m.Else():
            m.d.sync += waited.eq(0)
        m.d.comb += [self.read_valid.eq(self.read_req & (waited == 2) &
                                        (total_index == self.read_index)),
                     self.read_data.eq(total)]
        return m
