"""Event counters in one block RAM, fed by narrow pre-counters.

Every event of docs/numerics.md ("Event accounting") is a ``spec.COUNTER_BITS``-wide counter.
Thirty 48-bit registers with their adders and a 30-way read multiplexer cost about 3,000 logic
cells on an iCE40 -- more than half the UP5K -- so the counters live in a memory instead:

- each counter has a **pre-counter**, a register just wide enough for what can arrive between
  two flushes (``bound`` per cycle, for ``len(bounds)`` cycles);
- the increments of a cycle are **registered** before they reach the pre-counters, so no
  counter adder sits at the end of the engine's datapath paths;
- a **flusher** visits the counters round robin, one per cycle, in two pipelined steps:
  (A) read the counter's memory word and take its pre-counter (which restarts from this cycle's
  increment), (B) write word + taken value back. Consecutive steps touch different words, so
  there is no read/write hazard; a counter is flushed every ``len(bounds)`` cycles.

``clear`` zeroes every counter: the pre-counters restart at zero and each word is marked
stale, so its next flush writes the taken value alone instead of adding it to the old word.

A read (``read_req`` with ``read_index``) is answered with the value written back by the first
flush of that counter that starts at least two cycles after the request: by then every
increment made before the request has reached the pre-counters, so the answer is exact. It
takes at most ``len(bounds) + 3`` cycles.

Ports:

- ``inc``: In(StructLayout) -- one field per counter name, as wide as its ``bounds`` entry
  needs; the amount to add this cycle.
- ``clear``: In(1) -- zero every counter (this cycle's increments are dropped).
- ``read_req``: In(1), ``read_index``: In(range(len(bounds))) -- hold until ``read_valid``.
- ``read_valid``: Out(1) -- one cycle; ``read_data`` holds the counter's value.
- ``read_data``: Out(width).
"""

from amaranth.hdl import Array, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ember import spec


def _width(n):
    return max(1, int(n).bit_length())


class CounterFile(wiring.Component):
    """``bounds``: ordered {counter name: largest increment in one cycle}; the order is the
    counter index of ``read_index``. ``width``: bits of each counter."""

    def __init__(self, bounds, width=spec.COUNTER_BITS):
        self.names = tuple(bounds)
        self.bounds = dict(bounds)
        self.width = width
        if len(self.names) < 2:
            raise ValueError("a counter file needs at least 2 counters")
        self.pre_bits = {name: _width(bound * (len(self.names) + 1))
                         for name, bound in self.bounds.items()}
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
        m.submodules.words = words = Memory(shape=self.width, depth=C, init=[])
        rd, wr = words.read_port(), words.write_port()

        inc_r = Signal.like(self.inc)
        m.d.sync += inc_r.eq(Mux(self.clear, 0, self.inc.as_value()))
        pre = [Signal(self.pre_bits[name], name=f"pre_{name}") for name in self.names]
        stale = Signal(C, init=(1 << C) - 1)

        # step A: read word f, take its pre-counter
        f = Signal(range(C))
        m.d.sync += f.eq(Mux(f == C - 1, 0, f + 1))
        m.d.comb += rd.addr.eq(f)
        taken = Signal(max(self.pre_bits.values()))
        taken_stale = Signal()
        taken_index = Signal(range(C))
        m.d.sync += [taken.eq(Array(pre)[f]), taken_stale.eq(stale.bit_select(f, 1)),
                     taken_index.eq(f)]
        for i, name in enumerate(self.names):
            amount = getattr(inc_r, name)
            with m.If(self.clear):
                m.d.sync += pre[i].eq(0)
            with m.Elif(f == i):
                m.d.sync += pre[i].eq(amount)
            with m.Else():
                m.d.sync += pre[i].eq(pre[i] + amount)
        with m.If(self.clear):
            m.d.sync += stale.eq((1 << C) - 1)
        with m.Else():
            m.d.sync += stale.bit_select(f, 1).eq(0)

        # step B: write word + taken back (a clear in between makes the result stale again)
        total = Signal(self.width)
        m.d.comb += total.eq(Mux(taken_stale, 0, rd.data) + taken)
        m.d.comb += [wr.addr.eq(taken_index), wr.data.eq(total), wr.en.eq(~self.clear)]

        # reads: `armed` rises in cycle t0 + 3 of a request made in t0, so the flush whose
        # step B it catches took its pre-counter in t0 + 2 or later, when every increment
        # made before t0 had arrived there (increment in t, inc_r in t + 1, pre in t + 2;
        # one cycle of margin)
        wait = Signal(2)
        armed = Signal()
        with m.If(self.read_req & ~armed & ~self.read_valid):
            with m.If(wait == 2):
                m.d.sync += [armed.eq(1), wait.eq(0)]
            with m.Else():
                m.d.sync += wait.eq(wait + 1)
        with m.If(armed & (taken_index == self.read_index)):
            m.d.comb += [self.read_valid.eq(1), self.read_data.eq(total)]
            m.d.sync += armed.eq(0)
        return m
