"""The loop nest of engine v2's sequencer: LEVELS down-counters and one address generator per
memory, presenting one step of a phase's nest per cycle (issue 13, item 2; docs/architecture.md,
section 2a).

Golden twin: ``ember.program.Nest.walk`` -- the same steps (each generator's address, the
levels' first and last flags) in the same order, and ``Nest.first_fault`` for where a walk that
leaves a memory stops. ``Nest.pack`` gives the configuration ports' values.

`LoopNest(generators, levels=program.LEVELS, bound_bits=program.BOUND_BITS,
block_ram=False)`; generators: dict name -> address width (the memory's); block_ram: keep the
step memories in block RAM (for the iCE40, which has no distributed RAM; elsewhere synthesis
chooses, on the ECP5 distributed RAM). Level i of a vector is at bits [i*w, (i+1)*w).

Ports (sync domain):
  bound:       In(levels * bound_bits) -- each level's bound n_i, level 0 outermost; holds
               still from `start` until `done`.
  cfg_en, cfg_gen, cfg_slot, cfg_data: In -- write one word of generator `cfg_gen`'s (its
               index in `generators`) step memory: slot i < levels holds level i's signed
               delta (program.delta_bits(addr_bits) bits, Nest.deltas), slot `levels`
               (BASE_SLOT) its base, the address at step 0 (addr_bits bits: the bits above are
               ignored). Write while idle only, and a base at least two cycles before the
               `start` that uses it (the memory's read of it is registered).
  limit_<g>:   In(addr_bits + 1) -- g's memory depth: a presented address is below it (and
               below 2**addr_bits). Holds still from `start` until `done`.
  addr_<g>:    Out(addr_bits) -- g's address of the presented step.
  start:       In(1) -- begin a walk; ignored while busy, and in the first cycle after a
               reset (a ResetInserter's: the step memories' read register, which no reset
               clears, may then hold a delta instead of the base).
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

Timing: `start` in cycle c -> step 0 valid in c + 2 (in c the next stage, below, takes step
0 and its range check, which the presented stage needs registered; in c + 1 the presented
stage takes it); then a step per cycle while `advance` is high: valid & advance in cycle t ->
the next step is presented in t + 1, no bubbles. The final step taken in t -> done in t + 1,
valid low. A faulting step s: the cycle it would be presented has done and fault high and
valid low, so no consumer ever sees an out-of-range address as valid.

Structure ("design for timing": every output is a register): two stages. The presented stage
(addr_*, first, last, valid) and the step after it, the *next* stage: its address
(`next_addr_<g>`) and whether that is inside its memory (`in_range_<g>`), its first and last
flags, the levels' down-counters (level i counts n_i - 1 .. 0; its last flag is that
counter's == 0, kept as a register) and `next_level`, the level that advances from it to the
step after (the innermost whose last flag is low; registered). When the presented stage takes
the next step (or fills, after start), the next stage forms the one after: per generator one
adder, next_addr + the delta of next_level, formed 2 bits wider than the address so a step
below 0 or past 2**addr_bits is seen, and one comparator on that sum into in_range; the
counters decrement or reload (one decrementer each). So the range check is ready, in a
register, when its step is taken, and the longest path is the step memory's read, the adder
and the comparator. No multipliers.

The deltas and bases are not registers: each generator keeps them in a step memory of
levels + 1 words (with block_ram, Yosys's `ram_style` "block"), read every cycle at the
slot the next stage needs in the cycle after. While the nest runs on, that is the level that
advances from the next step (`new_level` as the next stage moves, else `next_level`), so the
word read is the delta next_addr needs, with no multiplexer over the levels; otherwise it is
BASE_SLOT, so the cycle that accepts a start reads the base, and step 0 is the base plus 0
through the same adder. A program's phase keeps its configuration in the memory it is
already in, where registers would cost a logic cell per bit on the UP5K (docs/boards.md).
The next stage's registers are reset-less: start loads each before it is read.

"""

from amaranth import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ember import program

#: A next address as it is formed is this much wider than the address: the sum of an address
#: in range (addr_bits) and a signed delta (addr_bits + 1) needs addr_bits + 2 signed bits.
NEXT_ADDR_EXTRA_BITS = 2


class LoopNest(wiring.Component):
    """A loop nest of `levels` down-counters and one address generator per entry of
    `generators` (name -> address width); see the module docstring for ports and timing."""

    def __init__(self, generators, levels=program.LEVELS, bound_bits=program.BOUND_BITS,
                 block_ram=False):
        self.generators = dict(generators)
        self.block_ram = block_ram
        self.levels, self.bound_bits = levels, bound_bits
        if not self.generators:
            raise ValueError("a loop nest needs at least one generator")
        #: the step memories' slot of the base (slots 0 .. levels - 1: the levels' deltas)
        self.BASE_SLOT = levels
        members = {"bound": In(levels * bound_bits),
                   "cfg_en": In(1),
                   "cfg_gen": In(range(len(self.generators))),
                   "cfg_slot": In(range(levels + 1)),
                   "cfg_data": In(max(program.delta_bits(b) for b in self.generators.values()))}
        for g, bits in self.generators.items():
            if not g.isidentifier():
                raise ValueError(f"generator name {g!r} is not an identifier")
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

    def limit(self, name):
        """Generator `name`'s memory depth (In)."""
        return getattr(self, f"limit_{name}")

    def level_bound(self, level):
        """Level `level`'s slice of the bound port."""
        return self.bound.word_select(level, self.bound_bits)

    def elaborate(self, platform):
        m = Module()
        D, gens = self.levels, list(self.generators)
        bound = [self.level_bound(i) for i in range(D)]

        # the next stage: the step after the presented one
        count = [Signal(self.bound_bits, name=f"count{i}", reset_less=True) for i in range(D)]
        next_first = Signal(D, reset_less=True)
        next_last = Signal(D, reset_less=True)
        next_addr = {g: Signal(a, name=f"next_addr_{g}", reset_less=True)
                     for g, a in self.generators.items()}
        # whether next_addr is inside its memory: checked as it is formed
        in_range = {g: Signal(name=f"in_range_{g}", reset_less=True) for g in gens}
        # the level that advances from the next step to the one after
        next_level = Signal(range(D), reset_less=True)
        zero_bound = Signal(reset_less=True)

        load = Signal()     # an accepted start: the next stage takes step 0
        take = Signal()     # the consumer takes the presented step
        final = Signal()    # the presented step is the walk's last
        move = Signal()     # the presented stage takes the next step (or faults on it)
        # the step memories' read register holds the bases: the slot read last cycle was
        # BASE_SLOT (not so in the cycle after a reset, which clears this flag)
        base_ready = Signal()
        m.d.comb += [
            load.eq(self.start & ~self.busy & base_ready),
            take.eq(self.valid & self.advance),
            final.eq(self.last.all()),
            move.eq(self.busy & (~self.valid | (take & ~final))),
        ]

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

        # the level that advances from the new next step to the one after: the innermost
        # whose index is not at its last
        new_level = Signal(range(D))
        for i in range(D):
            with m.If(~new_last[i]):
                m.d.comb += new_level.eq(i)

        # the step memories, read at the slot the next stage needs next cycle: next_level's
        # delta while the walk goes on, the base otherwise (the cycle that accepts a start)
        runs_on = Signal()
        m.d.comb += runs_on.eq(load | (self.busy & ~(move & bad) & ~(take & final)))
        slot = Signal(range(D + 1))
        m.d.comb += slot.eq(Mux(runs_on, Mux(load | move, new_level, next_level),
                                self.BASE_SLOT))
        m.d.sync += base_ready.eq(~runs_on)
        word = {}
        for index, (g, a) in enumerate(self.generators.items()):
            bits = program.delta_bits(a)
            m.submodules[f"steps_{g}"] = mem = Memory(
                shape=unsigned(bits), depth=D + 1, init=[],
                attrs={"ram_style": "block"} if self.block_ram else None)
            wr, rd = mem.write_port(), mem.read_port(transparent_for=())
            base = self.cfg_slot == self.BASE_SLOT
            m.d.comb += [wr.addr.eq(self.cfg_slot), wr.en.eq(self.cfg_en & (self.cfg_gen == index)),
                         wr.data.eq(Mux(base, self.cfg_data[:a], self.cfg_data[:bits])),
                         rd.addr.eq(slot)]
            word[g] = rd.data.as_signed()
        with m.If(load | move):
            m.d.sync += [next_first.eq(new_first), next_last.eq(new_last),
                         next_level.eq(new_level)]
            for g, a in self.generators.items():
                # one adder and one comparator: an address in range plus a signed delta is
                # seen below 0 or past 2**a in its two extra bits. Start's base enters
                # through the adder (0 + the base word), so no multiplexer sits between the
                # adder and the comparator
                new_addr = Signal(signed(a + NEXT_ADDR_EXTRA_BITS), name=f"new_addr_{g}")
                m.d.comb += new_addr.eq(Mux(load, 0, next_addr[g]) + word[g])
                m.d.sync += [next_addr[g].eq(new_addr[:a]),
                             in_range[g].eq((new_addr[a:] == 0)
                                            & (new_addr[:a] < self.limit(g)))]

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
                m.d.sync += [self.addr(g).eq(next_addr[g]) for g in gens]
        with m.Elif(take & final):
            m.d.sync += [self.valid.eq(0), self.busy.eq(0), self.done.eq(1)]
        return m
