"""Engine v2's programs: the loop nest of one phase and its address generators (issue 13,
item 2; docs/architecture.md, section 2a). The golden twin of ``ember_hw.loopnest.LoopNest``.

A *nest* is up to LEVELS loops, level 0 outermost, each with a bound ``n_i >= 1``, and a few
*generators*, each an address ``base + sum_i index_i * stride_i``. The hardware forms no
product: a generator is one pointer that adds ``delta_i`` when level ``i`` advances and the
levels inside it wrap (``Nest.deltas``), and each level is a down-counter with a *last* flag.
``Nest.walk`` steps the same way (by adding deltas, innermost level fastest), so its steps are
what the gateware presents, one per cycle; ``Nest.check`` refuses, on the host, a nest that
would leave a memory, and ``Nest.first_fault`` says where the gateware, which does not trust
the program, stops one that does.

Widths are defined here once: BOUND_BITS for every level's bound (the gateware's counters);
a generator's address width is its memory's (the gateware's caller gives it per generator),
and its deltas are one bit wider (signed: DELTA_EXTRA_BITS).
"""

from dataclasses import dataclass
from math import prod

from .spec import ConfigError

#: D: the loop levels of a nest, level 0 outermost, by default (LoopNest and Nest take
#: `levels`; engine v2's core runs nests of ember.dataflow.LEVELS). A nest with fewer loops is
#: padded with bound-1 levels at the outer end (they never advance).
LEVELS = 4
#: A bound is a count of iterations. The largest loop of any build is a walk over every
#: weight of the ``sim`` build (weight_words x lanes = 4096 x 8 = 32,768 iterations, the
#: update phase over (j, k) flattened), above the next (batch x blocks of a layer: 64 x 128):
#: 16 bits hold bounds up to 65,535, so a loop of 32,768 needs no splitting.
BOUND_BITS = 16
MAX_BOUND = (1 << BOUND_BITS) - 1
#: A delta is a signed step of at most the memory's size in either direction (the difference
#: of two addresses in 0 .. 2**addr_bits - 1): one bit more than the address.
DELTA_EXTRA_BITS = 1


def delta_bits(addr_bits):
    """Width of one level's (signed) delta for a generator of `addr_bits`-bit addresses."""
    return addr_bits + DELTA_EXTRA_BITS


@dataclass(frozen=True)
class Step:
    """One step of a walk: the loop indices (level 0 first), each generator's address, and
    per level whether its index is 0 (`first`) or n_i - 1 (`last`)."""
    indices: tuple
    addresses: dict
    first: tuple
    last: tuple


@dataclass(frozen=True)
class Fault:
    """Where the gateware stops a nest (Nest.first_fault): the step that would have been
    presented (0-based, in walk order) and the generator that leaves its memory there, the
    first in the generators' order; `generator` is None for a bound below 1, which stops
    the walk before step 0."""
    step: int
    generator: object


@dataclass(frozen=True)
class Packed:
    """A nest as the gateware takes it (LoopNest with the default BOUND_BITS): `bound`, its
    bound port, with level i at bits [i*BOUND_BITS, (i+1)*BOUND_BITS); per generator its
    base and its deltas, level i at bits [i*w, (i+1)*w) with w = delta_bits(addr_bits), two's
    complement: the words its step memories take through the cfg_* port (level i's delta
    in slot i, the base in BASE_SLOT)."""
    bound: int
    bases: dict
    deltas: dict


@dataclass(frozen=True)
class Nest:
    """A loop nest (module docstring).

    bounds:  tuple of the levels' bounds, level 0 outermost (LEVELS of them for the gateware;
             Nest.of pads).
    bases:   dict generator name -> its address at step 0.
    strides: dict generator name -> tuple (one per level) of the address step of that level's
             index.
    """
    bounds: tuple
    bases: dict
    strides: dict

    def __post_init__(self):
        object.__setattr__(self, "bounds", tuple(int(n) for n in self.bounds))
        if set(self.bases) != set(self.strides):
            raise ConfigError(f"generators with a base {sorted(self.bases)} and with strides "
                              f"{sorted(self.strides)} differ")
        strides = {}
        for g in self.bases:
            s = tuple(int(v) for v in self.strides[g])
            if len(s) != len(self.bounds):
                raise ConfigError(f"generator '{g}' has {len(s)} strides; the nest has "
                                  f"{len(self.bounds)} levels")
            strides[g] = s
        object.__setattr__(self, "strides", strides)
        object.__setattr__(self, "bases", {g: int(self.bases[g]) for g in self.bases})

    @classmethod
    def of(cls, loops, gens, levels=LEVELS):
        """A nest from named loops, outermost first, padded with bound-1 levels at the outer
        end to `levels`: ``Nest.of(loops=[("j", N), ("k", K)], gens={"w": (base, {"j": K,
        "k": 1}), "x": (0, {"k": 1})})``. A loop a generator does not name has stride 0 for
        it. More loops than `levels`, or a stride for a loop the nest does not have, raise
        ConfigError."""
        loops = list(loops)
        names = [name for name, _ in loops]
        if len(loops) > levels:
            raise ConfigError(f"a nest of {len(loops)} loops ({', '.join(names)}); the "
                              f"sequencer has {levels} levels")
        if len(set(names)) != len(names):
            raise ConfigError(f"loop names {names} repeat")
        pad = levels - len(loops)
        bounds = (1,) * pad + tuple(n for _, n in loops)
        bases, strides = {}, {}
        for g, (base, by_loop) in gens.items():
            unknown = set(by_loop) - set(names)
            if unknown:
                raise ConfigError(f"generator '{g}' has strides for {sorted(unknown)}; the "
                                  f"nest's loops are {names}")
            bases[g] = base
            strides[g] = (0,) * pad + tuple(by_loop.get(name, 0) for name in names)
        return cls(bounds, bases, strides)

    @property
    def levels(self):
        return len(self.bounds)

    def steps(self):
        """The number of steps of a walk: the product of the bounds."""
        return prod(self.bounds) if all(n >= 1 for n in self.bounds) else 0

    def deltas(self):
        """dict name -> tuple of each level's delta: what the pointer adds when level i
        advances and every level inside it wraps, ``stride_i - sum over j > i of
        (n_j - 1) * stride_j``."""
        out = {}
        for g, s in self.strides.items():
            out[g] = tuple(s[i] - sum((self.bounds[j] - 1) * s[j]
                                      for j in range(i + 1, self.levels))
                           for i in range(self.levels))
        return out

    def walk(self):
        """The steps in loop order, innermost level fastest; the addresses formed as the
        gateware forms them, by adding the deltas (no products). No steps if a bound is
        below 1."""
        if self.steps() == 0:
            return
        D, deltas = self.levels, self.deltas()
        index = [0] * D
        addr = dict(self.bases)
        while True:
            yield Step(tuple(index), dict(addr), tuple(i == 0 for i in index),
                       tuple(i == n - 1 for i, n in zip(index, self.bounds)))
            advancing = [i for i in range(D) if index[i] < self.bounds[i] - 1]
            if not advancing:
                return
            level = advancing[-1]
            index[level] += 1
            for j in range(level + 1, D):
                index[j] = 0
            for g in addr:
                addr[g] += deltas[g][level]

    def span(self, name):
        """(lowest, highest) address generator `name` reaches over the walk, in closed form:
        each level's index contributes from 0 to (n_i - 1) * stride_i, whichever sign."""
        self._check_bounds(None)
        base, s = self.bases[name], self.strides[name]
        reach = [(n - 1) * st for n, st in zip(self.bounds, s)]
        return (base + sum(min(0, r) for r in reach), base + sum(max(0, r) for r in reach))

    def _check_bounds(self, max_bound):
        """ConfigError for the first bound below 1 (or above max_bound, unless None)."""
        for i, n in enumerate(self.bounds):
            if n < 1:
                raise ConfigError(f"level {i}'s bound {n} is below 1 (a bound counts "
                                  "iterations)")
            if max_bound is not None and n > max_bound:
                raise ConfigError(f"level {i}'s bound {n} is above {max_bound}, the largest "
                                  f"{BOUND_BITS}-bit count")

    def check(self, limits, levels=LEVELS):
        """Raise ConfigError unless the gateware (a LoopNest of `levels` levels) can run this
        nest as it is: at most `levels` levels, every bound in 1..MAX_BOUND, and every
        generator (limits: dict name -> its memory's depth) inside 0 .. limit - 1 at every
        step. The message names the level or generator, the value and the limit."""
        if self.levels > levels:
            raise ConfigError(f"a nest of {self.levels} levels; the sequencer has {levels}")
        self._check_bounds(MAX_BOUND)
        for g in self.bases:
            if g not in limits:
                raise ConfigError(f"generator '{g}' has no memory depth (limits name "
                                  f"{sorted(limits)})")
            lo, hi = self.span(g)
            if lo < 0:
                raise ConfigError(f"generator '{g}' reaches address {lo}; its memory holds "
                                  f"0..{limits[g] - 1} (limit {limits[g]})")
            if hi >= limits[g]:
                raise ConfigError(f"generator '{g}' reaches address {hi}; its memory holds "
                                  f"0..{limits[g] - 1} (limit {limits[g]})")

    def first_fault(self, limits):
        """Where the gateware stops this nest (a Fault), or None if every step stays inside
        0 .. limit - 1 of every generator (limits: dict name -> depth)."""
        if self.steps() == 0:
            return Fault(0, None)
        for t, step in enumerate(self.walk()):
            for g, a in step.addresses.items():
                if not 0 <= a < limits[g]:
                    return Fault(t, g)
        return None

    def pack(self, addr_bits, levels=LEVELS):
        """The nest as a LoopNest of `levels` levels takes it (a Packed: its bound port and
        its step memories' words); addr_bits: dict name -> the generator's address width. A nest of fewer
        levels is padded at the outer end with bound-1 levels; a level with bound 1 never
        advances, so its delta is packed as 0. Raises ConfigError for more levels than
        `levels`, a bound that does not fit BOUND_BITS, a base that does not fit its address
        or a delta (of a level that advances) that does not fit delta_bits. A bound of 0 is
        packed: the gateware refuses it (fault_bound)."""
        if self.levels > levels:
            raise ConfigError(f"a nest of {self.levels} levels; the sequencer has {levels}")
        pad = levels - self.levels
        bound = 0
        for i, n in enumerate(self.bounds):
            if not 0 <= n <= MAX_BOUND:
                raise ConfigError(f"level {i}'s bound {n} does not fit {BOUND_BITS} bits")
            bound |= n << ((pad + i) * BOUND_BITS)
        for i in range(pad):
            bound |= 1 << (i * BOUND_BITS)
        bases, deltas = {}, {}
        for g, d in self.deltas().items():
            a = addr_bits[g]
            if not 0 <= self.bases[g] < 1 << a:
                raise ConfigError(f"generator '{g}': base {self.bases[g]} does not fit its "
                                  f"{a}-bit address")
            w = delta_bits(a)
            word = 0
            for i, di in enumerate(d):
                if self.bounds[i] == 1:
                    di = 0
                if not -(1 << (w - 1)) <= di < 1 << (w - 1):
                    raise ConfigError(f"generator '{g}': level {i}'s delta {di} does not fit "
                                      f"{w} signed bits")
                word |= (di & ((1 << w) - 1)) << ((pad + i) * w)
            bases[g], deltas[g] = self.bases[g], word
        return Packed(bound, bases, deltas)
