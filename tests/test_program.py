"""Engine v2's loop nests (ember.program), the golden twin of ember_hw.loopnest: the deltas
against their formula, the walk (formed by adding deltas) against base + sum(index * stride),
the closed-form span against the walk, and the checks that refuse what the gateware cannot run,
each naming the value and the limit."""

import itertools

import numpy as np
import pytest

from ember import program
from ember.program import LEVELS, MAX_BOUND, Nest
from ember.spec import ConfigError


def random_nest(rng, levels=LEVELS, gens=3, max_bound=6, max_stride=9):
    """Bounds 1..max_bound (bound-1 levels included), strides of either sign (0 included)."""
    bounds = tuple(int(n) for n in rng.integers(1, max_bound + 1, size=levels))
    names = [f"g{i}" for i in range(gens)]
    strides = {g: tuple(int(s) for s in rng.integers(-max_stride, max_stride + 1, size=levels))
               for g in names}
    bases = {g: int(rng.integers(0, 500)) for g in names}
    return Nest(bounds, bases, strides)


@pytest.mark.parametrize("seed", range(4))
def test_walk_equals_the_affine_addresses(seed):
    """Every step of the walk (addresses by adding deltas) is base + sum(index_i * stride_i),
    the indices run in loop order with the innermost level fastest, first/last flag index 0 /
    n_i - 1, and there are exactly prod(bounds) steps."""
    rng = np.random.default_rng(seed)
    for _ in range(25):
        nest = random_nest(rng)
        steps = list(nest.walk())
        assert len(steps) == nest.steps() == int(np.prod(nest.bounds))
        want_indices = list(itertools.product(*(range(n) for n in nest.bounds)))
        assert [s.indices for s in steps] == want_indices
        for s in steps:
            for g in nest.bases:
                assert s.addresses[g] == nest.bases[g] + sum(
                    i * st for i, st in zip(s.indices, nest.strides[g]))
            assert s.first == tuple(i == 0 for i in s.indices)
            assert s.last == tuple(i == n - 1 for i, n in zip(s.indices, nest.bounds))


def test_deltas_follow_the_formula():
    """delta_i = stride_i - sum over j > i of (n_j - 1) * stride_j, worked by hand for a 3x3
    convolution's input walk (docs/architecture.md 2a: levels oy, ox, ky, kx; C_in = 1,
    W = 8, stride 1): kx adds 1, ky wraps kx (-2) and adds W, ox wraps both, oy wraps ox."""
    W = 8
    nest = Nest.of(loops=[("oy", 6), ("ox", 6), ("ky", 3), ("kx", 3)],
                   gens={"x": (0, {"oy": W, "ox": 1, "ky": W, "kx": 1})})
    assert nest.deltas()["x"] == (W - 5 * 1 - 2 * W - 2 * 1, 1 - 2 * W - 2, W - 2, 1)
    rng = np.random.default_rng(7)
    for _ in range(20):
        nest = random_nest(rng)
        for g, d in nest.deltas().items():
            s, n = nest.strides[g], nest.bounds
            assert d == tuple(s[i] - sum((n[j] - 1) * s[j] for j in range(i + 1, LEVELS))
                              for i in range(LEVELS))


def test_walk_adds_the_advancing_levels_delta():
    """Between two steps the address moves by exactly the delta of the level that advanced
    (the outermost whose index changed; the levels inside it wrapped to 0): the rule the
    gateware's one adder per generator follows. That level is the innermost not at its last
    index, as the gateware picks it from its last flags."""
    rng = np.random.default_rng(11)
    for _ in range(10):
        nest = random_nest(rng)
        steps = list(nest.walk())
        for a, b in zip(steps, steps[1:]):
            level = min(i for i in range(LEVELS) if a.indices[i] != b.indices[i])
            assert b.indices[level] == a.indices[level] + 1
            assert not a.last[level] and all(a.last[level + 1:])
            for g in nest.bases:
                assert b.addresses[g] - a.addresses[g] == nest.deltas()[g][level]


@pytest.mark.parametrize("seed", range(3))
def test_span_equals_the_walks_extremes(seed):
    """span(name) in closed form is (min, max) of the walk's addresses, negative strides and
    bound-1 levels included."""
    rng = np.random.default_rng(100 + seed)
    for _ in range(30):
        nest = random_nest(rng)
        steps = list(nest.walk())
        for g in nest.bases:
            seen = [s.addresses[g] for s in steps]
            assert nest.span(g) == (min(seen), max(seen))


def test_of_pads_the_outer_levels():
    """Nest.of puts the loops innermost, bound-1 levels outside them, strides by loop name
    (0 where a generator does not name a loop)."""
    nest = Nest.of(loops=[("j", 3), ("k", 5)],
                   gens={"w": (10, {"j": 5, "k": 1}), "y": (2, {"j": 1})})
    assert nest.bounds == (1, 1, 3, 5)
    assert nest.strides == {"w": (0, 0, 5, 1), "y": (0, 0, 1, 0)}
    assert [s.addresses["w"] for s in nest.walk()] == list(range(10, 25))
    assert [s.addresses["y"] for s in nest.walk()] == [2] * 5 + [3] * 5 + [4] * 5


def test_of_refuses_more_loops_than_levels_and_unknown_loops():
    loops = [(c, 2) for c in "abcde"]
    with pytest.raises(ConfigError, match=rf"5 loops .*; the sequencer has {LEVELS} levels"):
        Nest.of(loops=loops, gens={"w": (0, {"a": 1})})
    with pytest.raises(ConfigError, match=r"generator 'w' has strides for \['z'\]"):
        Nest.of(loops=[("j", 2)], gens={"w": (0, {"z": 1})})


def test_check_names_generator_address_and_limit():
    """check() passes a nest inside its memories and names the generator, the address it
    reaches and the limit otherwise: past the top and below 0 (negative stride)."""
    nest = Nest.of(loops=[("j", 4), ("k", 8)],
                   gens={"w": (0, {"j": 8, "k": 1}), "x": (100, {"j": -10})})
    nest.check({"w": 32, "x": 101})
    with pytest.raises(ConfigError, match=r"generator 'w' reaches address 31; its memory "
                                          r"holds 0\.\.30 \(limit 31\)"):
        nest.check({"w": 31, "x": 101})
    low = Nest.of(loops=[("j", 12)], gens={"w": (0, {"j": 1}), "x": (100, {"j": -10})})
    with pytest.raises(ConfigError, match=r"generator 'x' reaches address -10; its memory "
                                          r"holds 0\.\.200 \(limit 201\)"):
        low.check({"w": 12, "x": 201})
    with pytest.raises(ConfigError, match=r"generator 'x' has no memory depth"):
        nest.check({"w": 32})


def test_check_refuses_bounds_and_levels():
    """A bound of 0, a bound past BOUND_BITS and more than LEVELS levels are refused, naming
    the level, the bound and the limit."""
    with pytest.raises(ConfigError, match=r"level 2's bound 0 is below 1"):
        Nest((3, 2, 0, 4), {"w": 0}, {"w": (1, 1, 1, 1)}).check({"w": 1000})
    with pytest.raises(ConfigError, match=rf"level 0's bound {MAX_BOUND + 1} is above "
                                          rf"{MAX_BOUND}"):
        Nest((MAX_BOUND + 1, 1, 1, 1), {"w": 0}, {"w": (1, 0, 0, 0)}).check({"w": 1 << 20})
    Nest((MAX_BOUND, 1, 1, 1), {"w": 0}, {"w": (1, 0, 0, 0)}).check({"w": MAX_BOUND})
    five = Nest((2,) * 5, {"w": 0}, {"w": (0,) * 5})
    with pytest.raises(ConfigError, match=rf"a nest of 5 levels; the sequencer has {LEVELS}"):
        five.check({"w": 10})
    five.check({"w": 10}, levels=5)
    with pytest.raises(ConfigError, match=r"generator 'w' has 4 strides; the nest has 3"):
        Nest((2, 2, 2), {"w": 0}, {"w": (1, 1, 1, 1)})


def test_bound_bits_hold_the_largest_build_loop():
    """BOUND_BITS holds the sim build's largest loop: every weight (weight_words x lanes)."""
    from ember import spec
    build = spec.BUILDS["sim"]
    assert build.weight_words * build.lanes <= MAX_BOUND
    assert build.max_batch * build.blocks(build.max_width) <= MAX_BOUND


def test_first_fault_is_the_first_step_out_of_range():
    """first_fault: the first step, in walk order, where a generator leaves 0 .. limit - 1
    (the first generator in order if two do at once); None inside; step 0 for a zero
    bound."""
    strides = {"a": (0, 0, 4, 1), "b": (0, 0, 0, -2)}      # a: 4 per j, 1 per k; b: -2 per k
    nest = Nest((1, 1, 3, 4), {"a": 2, "b": 6}, strides)  # a 2..13, b 6, 4, 2, 0
    assert nest.first_fault({"a": 14, "b": 7}) is None
    assert nest.first_fault({"a": 13, "b": 7}) == program.Fault(11, "a")
    # b at 5, 3, 1, -1: below 0 at k = 3 of the first j (step 3), before a's fault
    below = Nest(nest.bounds, {"a": 2, "b": 5}, strides)
    assert below.first_fault({"a": 13, "b": 7}) == program.Fault(3, "b")
    both = Nest(nest.bounds, {"a": 11, "b": 7}, strides)
    assert both.first_fault({"a": 11, "b": 7}) == program.Fault(0, "a")
    zero = Nest((2, 0, 1, 1), {"a": 0}, {"a": (1, 1, 0, 0)})
    assert zero.first_fault({"a": 8}) == program.Fault(0, None)
    assert list(zero.walk()) == [] and zero.steps() == 0


def test_pack_lays_out_the_ports():
    """pack: bounds at BOUND_BITS per level, each delta two's complement in delta_bits per
    level (0 for a bound-1 level, which never advances); a delta or base that does not fit
    is refused with the generator, the level and the width."""
    nest = Nest.of(loops=[("j", 3), ("k", 4)], gens={"w": (7, {"j": -4, "k": 1})})
    packed = nest.pack({"w": 5})
    B, w = program.BOUND_BITS, program.delta_bits(5)
    assert packed.bound == 1 | 1 << B | 3 << 2 * B | 4 << 3 * B
    assert packed.bases == {"w": 7}
    d = nest.deltas()["w"]
    # levels 0 and 1 (stride 0) wrap j (2 x -4) and k (3 x 1); j wraps k
    assert d == (0 + 8 - 3, 0 + 8 - 3, -4 - 3, 1)
    assert packed.deltas["w"] == ((d[2] & 63) << 2 * w) | (d[3] << 3 * w)
    # a nest of 2 levels packs as Nest.of's padding to LEVELS does
    assert Nest((3, 4), {"w": 7}, {"w": (-4, 1)}).pack({"w": 5}) == packed
    with pytest.raises(ConfigError, match=r"a nest of 4 levels; the sequencer has 3"):
        nest.pack({"w": 5}, levels=3)
    with pytest.raises(ConfigError, match=r"generator 'w': level 3's delta 40 does not fit "
                                          r"6 signed bits"):
        Nest.of(loops=[("k", 2)], gens={"w": (0, {"k": 40})}).pack({"w": 5})
    with pytest.raises(ConfigError, match=r"generator 'w': base 32 does not fit its 5-bit"):
        Nest.of(loops=[("k", 2)], gens={"w": (32, {"k": 1})}).pack({"w": 5})
