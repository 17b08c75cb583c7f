"""The loop nest of engine v2's sequencer: LEVELS down-counters and one address generator per
memory, presenting one step of a phase's nest per cycle (issue 13, item 2; docs/architecture.md,
section 2a).

Golden twin: ``ember.program.Nest.walk`` -- the same steps (each generator's address, the
levels' first and last flags) in the same order, and ``Nest.first_fault`` for where a walk that
leaves a memory stops. ``Nest.pack`` gives the configuration ports' values.

`LoopNest(generators, levels=program.LEVELS, bound_bits=program.BOUND_BITS)`; generators:
dict name -> address width (the memory's). Level i of a vector is at bits [i*w, (i+1)*w).

Ports (sync domain; every configuration port -- bound, base_*, delta_*, limit_* -- must hold
still from `start` until `done`):
  bound:       In(levels * bound_bits) -- each level's bound n_i, level 0 outermost.
  base_<g>:    In(addr_bits) -- generator g's address at step 0.
  delta_<g>:   In(levels * (addr_bits + 1)) -- each level's signed delta (Nest.deltas).
  limit_<g>:   In(addr_bits + 1) -- g's memory depth: a presented address is below it (and
               below 2**addr_bits).
  addr_<g>:    Out(addr_bits) -- g's address of the presented step.
  start:       In(1) -- begin a walk; ignored while busy.
  advance:     In(1) -- the consumer takes the presented step this cycle (meaningful while
               valid); low: everything holds (a stall).
  valid:       Out(1) -- a step is presented on addr_*, first, last.
  first, last: Out(levels) -- level i's index is 0 / n_i - 1 at the presented step.
  busy:        Out(1) -- a walk runs: from the cycle after an accepted start to the cycle its
               final step is taken (or its fault), inclusive; low in the done cycle, when a
               new start is accepted.
  done:        Out(1) -- one cycle, after the final step was taken or at a fault.
  fault:       Out(1) -- sticky from the fault until the next accepted start: the walk
               stopped at a step that would have left a memory (fault_gen says which
               generator, the first in the dict's order), or before step 0 because a bound
               is 0 (fault_bound high, fault_gen 0).
  fault_gen:   Out(range(len(generators))).
  fault_bound: Out(1).

Timing: `start` in cycle c -> step 0 valid in c + 2 (c + 1 loads the range check's register
stage, below); then a step per cycle while `advance` is high: valid & advance in cycle t ->
the next step is presented in t + 1, no bubbles. The final step taken in t -> done in t + 1,
valid low. A faulting step s: the cycle it would be presented has done and fault high and
valid low, so no consumer ever sees an out-of-range address as valid.

Structure ("design for timing": every output is a register): two stages. The presented stage
(addr_*, first, last, valid) and the step after it, the *next* stage: its address
(`next_addr_<g>`, 2 bits wider than the address so a step below 0 or past the memory is seen),
flags and down-counters (level i counts n_i - 1 .. 0; its last flag is that counter's == 0,
kept as a register), and the delta that leads from it to the step after (`next_delta_<g>`,
selected by the next stage's last flags and registered). When the presented stage takes the
next step, the next stage forms the one after: one adder per generator (next_addr +
next_delta), the counters decrement or reload, and the range check of the next step is one
comparator per generator on the registered next_addr. So the adder and the comparator each
start and end at registers; the longest path is the delta select (the D-way multiplexer
behind the levels' last flags). No multipliers.
"""

from amaranth import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ember import program

#: The next stage's address is this much wider than the address: the sum of an address in
#: range (addr_bits) and a signed delta (addr_bits + 1) needs addr_bits + 2 signed bits.
NEXT_ADDR_EXTRA_BITS = 2


class LoopNest(wiring.Component):
    """A loop nest of `levels` down-counters and one address generator per entry of
    `generators` (name -> address width); see the module docstring for ports and timing."""

    def __init__(self, generators, levels=program.LEVELS, bound_bits=program.BOUND_BITS):
        self.generators = dict(generators)
        self.levels, self.bound_bits = levels, bound_bits
        if not self.generators:
            raise ValueError("a loop nest needs at least one generator")
        members = {"bound": In(levels * bound_bits)}
        for g, bits in self.generators.items():
            if not g.isidentifier():
                raise ValueError(f"generator name {g!r} is not an identifier")
            members[f"base_{g}"] = In(bits)
            members[f"delta_{g}"] = In(levels * program.delta_bits(bits))
            members[f"limit_{g}"] = In(bits + 1)
            members[f"addr_{g}"] = Out(bits)
        members.update({
            "start": In(1),
            "advance": In(1),
            "valid": Out(1),
            "first": Out(levels),
            "last": Out(levels),
            "busy": Out(1),
            "done": Out(1),
            "fault": Out(1),
            "fault_gen": Out(range(len(self.generators))),
            "fault_bound": Out(1),
        })
        super().__init__(members)

    def addr(self, name):
        """Generator `name`'s presented address (Out)."""
        return getattr(self, f"addr_{name}")

    def base(self, name):
        """Generator `name`'s base (In)."""
        return getattr(self, f"base_{name}")

    def limit(self, name):
        """Generator `name`'s memory depth (In)."""
        return getattr(self, f"limit_{name}")

    def delta(self, name, level=None):
        """Generator `name`'s delta port, or its slice for `level` (signed)."""
        port = getattr(self, f"delta_{name}")
        if level is None:
            return port
        return port.word_select(level, program.delta_bits(self.generators[name])).as_signed()

    def level_bound(self, level):
        """Level `level`'s slice of the bound port."""
        return self.bound.word_select(level, self.bound_bits)

    def elaborate(self, platform):
        m = Module()
        D, gens = self.levels, list(self.generators)
        bound = [self.level_bound(i) for i in range(D)]

        # the next stage: the step after the presented one
        count = [Signal(self.bound_bits, name=f"count{i}") for i in range(D)]
        next_first = Signal(D)
        next_last = Signal(D)
        next_addr = {g: Signal(signed(a + NEXT_ADDR_EXTRA_BITS), name=f"next_addr_{g}")
                     for g, a in self.generators.items()}
        next_delta = {g: Signal(signed(program.delta_bits(a)), name=f"next_delta_{g}")
                      for g, a in self.generators.items()}
        zero_bound = Signal()

        load = Signal()     # an accepted start: the next stage takes step 0
        take = Signal()     # the consumer takes the presented step
        final = Signal()    # the presented step is the walk's last
        move = Signal()     # the presented stage takes the next step (or faults on it)
        m.d.comb += [
            load.eq(self.start & ~self.busy),
            take.eq(self.valid & self.advance),
            final.eq(self.last.all()),
            move.eq(self.busy & (~self.valid | (take & ~final))),
        ]

        # the next step's range check: one comparator per generator on a register
        in_range = {}
        for g, a in self.generators.items():
            in_range[g] = Signal(name=f"in_range_{g}")
            m.d.comb += in_range[g].eq((next_addr[g][a:] == 0)
                                       & (next_addr[g][:a] < self.limit(g)))
        bad = Signal()
        m.d.comb += bad.eq(zero_bound | ~Cat(*in_range.values()).all())
        culprit = Signal.like(self.fault_gen)
        for index in reversed(range(len(gens))):
            with m.If(~in_range[gens[index]]):
                m.d.comb += culprit.eq(index)

        # the step after the next one: which levels wrap and which advances
        new_first = Signal(D)
        new_last = Signal(D)
        for i in range(D):
            inner_last = Const(1) if i == D - 1 else next_last[i + 1:].all()
            wrap = load | (next_last[i] & inner_last)
            advances = ~load & ~next_last[i] & inner_last
            reload = Mux(wrap, bound[i], count[i])
            with m.If(load | move):
                m.d.sync += count[i].eq(reload - (wrap | advances))
            m.d.comb += [
                new_first[i].eq(wrap | (~advances & next_first[i])),
                new_last[i].eq(Mux(wrap, bound[i] == 1,
                                   Mux(advances, count[i] == 1, next_last[i]))),
            ]

        with m.If(load | move):
            m.d.sync += [next_first.eq(new_first), next_last.eq(new_last)]
            for g in gens:
                # the delta from the new next step to the one after: the innermost level
                # whose index is not at its last advances
                selected = self.delta(g, 0)
                for i in range(1, D):
                    selected = Mux(~new_last[i], self.delta(g, i), selected)
                m.d.sync += [
                    next_delta[g].eq(selected),
                    next_addr[g].eq(Mux(load, self.base(g), next_addr[g] + next_delta[g])),
                ]

        m.d.sync += self.done.eq(0)
        with m.If(load):
            m.d.sync += [
                self.busy.eq(1),
                self.fault.eq(0),
                self.fault_bound.eq(0),
                self.fault_gen.eq(0),
                zero_bound.eq(Cat(*(n == 0 for n in bound)).any()),
            ]
        with m.Elif(move):
            with m.If(bad):
                m.d.sync += [
                    self.valid.eq(0),
                    self.busy.eq(0),
                    self.done.eq(1),
                    self.fault.eq(1),
                    self.fault_bound.eq(zero_bound),
                    self.fault_gen.eq(Mux(zero_bound, 0, culprit)),
                ]
            with m.Else():
                m.d.sync += [self.valid.eq(1), self.first.eq(next_first),
                             self.last.eq(next_last)]
                m.d.sync += [self.addr(g).eq(next_addr[g][:a])
                             for g, a in self.generators.items()]
        with m.Elif(take & final):
            m.d.sync += [self.valid.eq(0), self.busy.eq(0), self.done.eq(1)]
        return m
