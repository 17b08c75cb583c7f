"""The loop nest (ember_hw.loopnest.LoopNest) alone in the Amaranth simulator, against its
golden twin ember.program.Nest: seeded random nests (bounds 1..6 per level, 2 or 3
generators with strides of either sign) under random stalls present exactly Nest.walk()'s
steps (addresses, first, last), one done each; step 0 comes two cycles after start and a
step per cycle follows while advance is high; a walk that leaves a memory faults at
Nest.first_fault's step with no out-of-range address ever valid; a zero bound faults; start
while busy is ignored; and the component converts to Verilog."""

import numpy as np
import pytest
from amaranth import Module, Signal
from amaranth.back import verilog
from amaranth.hdl import ResetInserter

from ember import program
from ember.program import LEVELS, Nest
from ember_hw.loopnest import LoopNest

from engine_harness import run_testbench

THREE = {"w": 9, "x": 8, "y": 10}     # generator -> address bits
TWO = {"a": 7, "b": 11}
#: cycles a walk may take beyond its steps (latency, done) before the test calls it hung
SLACK = 8


def flags(value, levels=LEVELS):
    return tuple(bool(value >> i & 1) for i in range(levels))


def random_strides(rng, gens):
    return {g: tuple(int(s) for s in rng.integers(-5, 6, size=LEVELS)) for g in gens}


def random_nest(rng, gens):
    """A nest inside its memories: each generator's base puts its span at a random place of
    a memory of random depth (limits: dict name -> depth)."""
    bounds = tuple(int(n) for n in rng.integers(1, 7, size=LEVELS))
    strides = random_strides(rng, gens)
    probe = Nest(bounds, {g: 0 for g in gens}, strides)
    bases, limits = {}, {}
    for g, bits in gens.items():
        lo, hi = probe.span(g)
        limits[g] = int(rng.integers(hi - lo + 1, (1 << bits) + 1))
        bases[g] = int(rng.integers(-lo, limits[g] - hi))
    return Nest(bounds, bases, strides), limits


def faulty_nest(rng, gens):
    """A nest one generator of which leaves its memory, above its depth or below 0, at some
    step of the walk (often not step 0)."""
    while True:
        nest, limits = random_nest(rng, gens)
        g = list(gens)[int(rng.integers(len(gens)))]
        lo, hi = nest.span(g)
        base = nest.bases[g]
        if rng.random() < 0.5 and base < hi:
            limits[g] = int(rng.integers(base + 1, hi + 1))        # the walk reaches hi
        elif base > lo:
            bases = dict(nest.bases)
            bases[g] -= int(rng.integers(lo + 1, base + 1))   # the walk reaches < 0
            nest = Nest(nest.bounds, bases, nest.strides)
        else:
            continue
        fault = nest.first_fault(limits)
        assert fault is not None and fault.generator is not None
        return nest, limits


def set_ports(ctx, dut, nest, limits):
    """The configuration that is ports: the bounds and the limits."""
    ctx.set(dut.bound, nest.pack(dut.generators, dut.levels).bound)
    for g in dut.generators:
        ctx.set(dut.limit(g), limits[g])


async def configure(ctx, dut, nest, limits):
    """Write the nest's bases and deltas into the step memories (a word a cycle, the bases
    first: the last word written is a delta, one cycle before start, as the engine's phase
    load does) and set the ports."""
    packed = nest.pack(dut.generators, dut.levels)
    set_ports(ctx, dut, nest, limits)
    words = []
    for index, (g, bits) in enumerate(dut.generators.items()):
        words.append((index, dut.BASE_SLOT, packed.bases[g]))
    for index, (g, bits) in enumerate(dut.generators.items()):
        w = program.delta_bits(bits)
        words += [(index, i, packed.deltas[g] >> (i * w) & ((1 << w) - 1))
                  for i in range(dut.levels)]
    for index, slot, value in words:
        ctx.set(dut.cfg_en, 1)
        ctx.set(dut.cfg_gen, index)
        ctx.set(dut.cfg_slot, slot)
        ctx.set(dut.cfg_data, value)
        await ctx.tick()
    ctx.set(dut.cfg_en, 0)


async def walk(ctx, dut, nest, limits, rng=None, stall=0.0, restart_at=None,
               configured=False):
    """Start a walk of `nest` and take its steps, each cycle with probability 1 - stall
    (advance low otherwise); a second start pulse at cycle `restart_at` (the walk must
    ignore it); `configured`: the step memories already hold the nest (start at once). Returns
    the steps taken (addresses, first, last), the cycle (from the start
    cycle, 0) of each, the cycles with done high, and the fault ports at done. Asserts on the
    way: no address out of its memory is ever valid, busy holds until done."""
    if configured:
        set_ports(ctx, dut, nest, limits)
    else:
        await configure(ctx, dut, nest, limits)
    ctx.set(dut.start, 1)
    await ctx.tick()
    ctx.set(dut.start, 0)
    taken, at, done_at, result = [], [], [], None
    # twice the cycles the steps take on average: a hang, not a slow walk, trips the assert
    for cycle in range(1, int(2 * (nest.steps() + SLACK) / (1 - stall)) + SLACK):
        ctx.set(dut.start, int(cycle == restart_at))
        advance = int(rng is None or rng.random() >= stall)
        ctx.set(dut.advance, advance)
        if ctx.get(dut.done):
            done_at.append(cycle)
            assert not ctx.get(dut.busy) and not ctx.get(dut.valid)
            result = dict(fault=ctx.get(dut.fault), fault_gen=ctx.get(dut.fault_gen),
                          fault_bound=ctx.get(dut.fault_bound))
        elif result is None:
            assert ctx.get(dut.busy), f"busy low in cycle {cycle} before done"
        if ctx.get(dut.valid):
            assert result is None, "a step valid after done"
            addrs = {g: ctx.get(dut.addr(g)) for g in dut.generators}
            for g, a in addrs.items():
                assert a < limits[g], f"{g} presented {a}, limit {limits[g]}"
            if advance:
                taken.append((addrs, flags(ctx.get(dut.first), dut.levels),
                              flags(ctx.get(dut.last), dut.levels)))
                at.append(cycle)
        await ctx.tick()
        if result is not None and cycle >= done_at[0] + 3:
            break
    assert result is not None, f"no done within {cycle} cycles ({nest.steps()} steps)"
    return taken, at, done_at, result


def expected(nest, upto=None):
    steps = list(nest.walk())[:upto]
    return [(s.addresses, s.first, s.last) for s in steps]


@pytest.mark.parametrize("gens,seed", [(THREE, 0), (THREE, 1), (TWO, 2)])
def test_random_nests_walk_like_the_twin(gens, seed):
    """12 random nests per case (36 in all) under random stalls: the steps taken are
    Nest.walk()'s, exactly, with one done strobe right after the final step, no fault."""
    rng = np.random.default_rng(seed)
    dut = LoopNest(gens)
    cases = [random_nest(rng, gens) for _ in range(12)]
    seen = []

    async def bench(ctx):
        for nest, limits in cases:
            stall = float(rng.choice([0.0, 0.3, 0.7]))
            seen.append(await walk(ctx, dut, nest, limits, rng, stall))

    run_testbench(dut, bench)
    for (nest, limits), (taken, at, done_at, result) in zip(cases, seen):
        assert taken == expected(nest)
        assert len(done_at) == 1 and done_at[0] == at[-1] + 1
        assert result == dict(fault=0, fault_gen=0, fault_bound=0)


def test_latency_and_full_rate():
    """With advance always high: step 0 in cycle 2 after start (cycle 0), then one step a
    cycle with no bubble, done in the cycle after the last; a bound of 700 exercises the
    counters' upper bits."""
    dut = LoopNest(THREE)
    nests = [Nest.of(loops=[("j", 3), ("k", 700)],
                     gens={"w": (0, {"j": 1, "k": 0}), "x": (255, {}),
                           "y": (0, {"k": 1})}),
             Nest((1, 1, 1, 1), {"w": 4, "x": 5, "y": 6}, {g: (7,) * 4 for g in THREE}),
             Nest((2, 3, 2, 3), {"w": 0, "x": 0, "y": 0},
                  {"w": (18, 6, 3, 1), "x": (0, 0, 0, 0), "y": (1, 2, 6, 12)})]
    limits = {g: 1 << b for g, b in THREE.items()}
    seen = []

    async def bench(ctx):
        for nest in nests:
            seen.append(await walk(ctx, dut, nest, limits))

    run_testbench(dut, bench)
    for nest, (taken, at, done_at, _) in zip(nests, seen):
        assert taken == expected(nest)
        assert at == list(range(2, 2 + nest.steps()))
        assert done_at == [2 + nest.steps()]


def test_outputs_come_from_registers():
    """Toggling advance (or the configuration) within a cycle changes no output: there is no
    combinational path from an input to an output."""
    dut = LoopNest(TWO)
    rng = np.random.default_rng(5)
    nest, limits = random_nest(rng, TWO)
    outputs = ["valid", "first", "last", "busy", "done", "fault", "fault_gen",
               "fault_bound"] + [f"addr_{g}" for g in TWO]
    changed, valid = [], []

    async def bench(ctx):
        await configure(ctx, dut, nest, limits)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        for _ in range(nest.steps() * 2 + SLACK):
            ctx.set(dut.advance, 0)
            before = [ctx.get(getattr(dut, o)) for o in outputs]
            ctx.set(dut.advance, 1)
            ctx.set(dut.limit("a"), 0)
            ctx.set(dut.cfg_data, 0)
            after = [ctx.get(getattr(dut, o)) for o in outputs]
            changed.append(before != after)
            valid.append(before[0])
            set_ports(ctx, dut, nest, limits)
            ctx.set(dut.advance, int(rng.random() < 0.6))
            await ctx.tick()

    run_testbench(dut, bench)
    assert len(changed) > nest.steps() and not any(changed)
    assert sum(valid) >= nest.steps() > 1     # the walk ran while the inputs toggled


@pytest.mark.parametrize("gens,seed", [(THREE, 10), (TWO, 11)])
def test_leaving_a_memory_faults_at_the_first_such_step(gens, seed):
    """Nests that leave a memory (above its depth or below 0) under random stalls: the steps
    before Nest.first_fault's are presented as in the walk, the faulting one never is; done
    and fault come in the cycle it would have been presented, fault_gen names the
    generator; no valid address is ever out of range (asserted in walk())."""
    rng = np.random.default_rng(seed)
    dut = LoopNest(gens)
    cases = [faulty_nest(rng, gens) for _ in range(8)]
    # a base already past its memory's depth: step 0 faults
    base_out = Nest((1, 1, 2, 2), {g: 3 for g in gens}, {g: (0, 0, 1, 1) for g in gens})
    last = list(gens)[-1]
    cases.append((base_out, {g: (3 if g == last else 8) for g in gens}))
    # every generator leaves at the same step (4): fault_gen names the first
    together = Nest((1, 1, 2, 3), {g: 1 for g in gens}, {g: (0, 0, 2, 1) for g in gens})
    cases.append((together, {g: 4 for g in gens}))
    seen = []

    async def bench(ctx):
        for nest, limits in cases:
            seen.append(await walk(ctx, dut, nest, limits, rng, stall=0.4))

    run_testbench(dut, bench)
    faults_at = []
    for (nest, limits), (taken, at, done_at, result) in zip(cases, seen):
        fault = nest.first_fault(limits)
        assert fault is not None and fault.generator is not None
        assert taken == expected(nest, fault.step)
        assert len(done_at) == 1
        if at:
            assert done_at[0] == at[-1] + 1
        assert result == dict(fault=1, fault_gen=list(gens).index(fault.generator),
                              fault_bound=0)
        faults_at.append(fault.step)
    assert faults_at[-2:] == [0, 4] and max(faults_at) > 0


def test_address_past_its_width_faults_whatever_the_limit():
    """A limit above 2**addr_bits (a caller's mistake) does not let an address wrap: the walk
    faults where it reaches 2**addr_bits, as first_fault says for the depth 2**addr_bits."""
    dut = LoopNest(TWO)
    top = 1 << TWO["a"]
    nest = Nest((1, 1, 3, 4), {"a": top - 9, "b": 0}, {"a": (0, 0, 4, 1), "b": (0, 0, 0, 1)})
    limits = {"a": (1 << (TWO["a"] + 1)) - 1, "b": 4}
    fault = nest.first_fault({"a": top, "b": 4})
    assert fault == program.Fault(9, "a") and nest.first_fault(limits) is None
    seen = []

    async def bench(ctx):
        seen.append(await walk(ctx, dut, nest, limits))

    run_testbench(dut, bench)
    taken, at, done_at, result = seen[0]
    assert taken == expected(nest, fault.step)
    assert result == dict(fault=1, fault_gen=0, fault_bound=0)


def test_zero_bound_faults_and_fault_clears_on_start():
    """A bound of 0 (any level) faults before step 0: done and fault in cycle 2, fault_bound
    high, fault_gen 0; fault stays until the next start, and that walk runs normally."""
    dut = LoopNest(TWO)
    limits = {g: 1 << b for g, b in TWO.items()}
    good = Nest((1, 1, 2, 3), {"a": 1, "b": 2}, {"a": (0, 0, 3, 1), "b": (0, 0, 1, 0)})
    zeros = [Nest(tuple(0 if i == level else 2 for i in range(LEVELS)), {"a": 0, "b": 0},
                  {"a": (1, 1, 1, 1), "b": (0, 0, 0, 0)}) for level in range(LEVELS)]
    seen, sticky = [], []

    async def bench(ctx):
        for nest in zeros:
            seen.append(await walk(ctx, dut, nest, limits))
            for _ in range(3):
                sticky.append(ctx.get(dut.fault))
                await ctx.tick()
        seen.append(await walk(ctx, dut, good, limits))

    run_testbench(dut, bench)
    for taken, at, done_at, result in seen[:-1]:
        assert taken == [] and done_at == [2]
        assert result == dict(fault=1, fault_gen=0, fault_bound=1)
    assert all(sticky) and len(sticky) == 3 * LEVELS
    taken, at, done_at, result = seen[-1]
    assert taken == expected(good) and result == dict(fault=0, fault_gen=0, fault_bound=0)


def test_start_while_busy_is_ignored():
    """A start pulse during a walk (while stalled or running) changes nothing: the same steps,
    one done."""
    rng = np.random.default_rng(21)
    dut = LoopNest(THREE)
    cases = [random_nest(rng, THREE) for _ in range(4)]
    seen = []

    async def bench(ctx):
        for i, (nest, limits) in enumerate(cases):
            restart = 1 + min(nest.steps(), 2 + 3 * i)
            seen.append(await walk(ctx, dut, nest, limits, rng, 0.5, restart_at=restart))

    run_testbench(dut, bench)
    for (nest, _), (taken, at, done_at, result) in zip(cases, seen):
        assert taken == expected(nest) and len(done_at) == 1 and result["fault"] == 0


def test_five_levels_walk_a_3x3_convolution():
    """LoopNest(levels=5) (the multiplexer tree over an odd number of levels) walks the input
    and weight addresses of a 3x3 convolution without padding (docs/architecture.md 2a:
    levels oy, ox, ky, kx, ic; C_in = 2, 6 x 5 input, stride 1) and a 3-level nest padded
    to 5 by pack."""
    C, H, W = 2, 6, 5
    Ho, Wo = H - 2, W - 2
    conv = Nest.of(loops=[("oy", Ho), ("ox", Wo), ("ky", 3), ("kx", 3), ("ic", C)],
                   gens={"x": (0, {"oy": W * C, "ox": C, "ky": W * C, "kx": C, "ic": 1}),
                         "w": (0, {"ky": 3 * C, "kx": C, "ic": 1})}, levels=5)
    small = Nest((2, 3, 2), {"x": 1, "w": 2}, {"x": (6, 2, 1), "w": (0, 1, 3)})
    gens = {"x": 6, "w": 5}
    dut = LoopNest(gens, levels=5)
    limits = {"x": H * W * C, "w": 9 * C}
    rng = np.random.default_rng(3)
    seen = []

    async def bench(ctx):
        for nest in (conv, small):
            seen.append(await walk(ctx, dut, nest, limits, rng, stall=0.3))

    run_testbench(dut, bench)
    for nest, (taken, at, done_at, result) in zip((conv, small), seen):
        pad = 5 - nest.levels
        want = [(a, (True,) * pad + f, (True,) * pad + l) for a, f, l in expected(nest)]
        assert taken == want and result["fault"] == 0
    assert len(seen[0][0]) == Ho * Wo * 9 * C
    assert max(a["x"] for a, _, _ in seen[0][0]) == H * W * C - 1


def test_converts_to_verilog():
    """A typical configuration (3 generators of 12 to 15 bits) converts to Verilog with its
    named ports (the step-memory port as wide as the widest generator's delta)."""
    gens = {"weights": 15, "acts": 14, "grads": 12}
    dut = LoopNest(gens)
    text = verilog.convert(dut, name="loopnest")
    assert "module loopnest" in text
    for g, bits in gens.items():
        assert f"output [{bits - 1}:0] addr_{g}" in text
        assert f"input [{bits}:0] limit_{g}" in text
    assert f"input [{program.delta_bits(15) - 1}:0] cfg_data" in text
    assert f"input [{LEVELS * program.BOUND_BITS - 1}:0] bound" in text
    assert "output [1:0] fault_gen" in text


@pytest.mark.parametrize("block_ram", [False, True])
def test_step_memories_ask_for_block_ram_only_when_told(block_ram):
    """block_ram (the iCE40 builds: no distributed RAM there) marks each generator's step
    memory ram_style "block" for Yosys; without it synthesis chooses (distributed RAM on an
    ECP5)."""
    text = verilog.convert(LoopNest(TWO, block_ram=block_ram), name="loopnest")
    assert text.count('ram_style = "block"') == (len(TWO) if block_ram else 0)


def test_a_start_right_after_a_reset_waits_for_the_base():
    """The engine aborts a walk with a ResetInserter, which clears the nest's registers but
    not its step memories' read register (it held a delta in the abort cycle): a start in
    the cycle after the reset is ignored, and one in the cycle after that walks from the
    base (step 0 two cycles later, as always)."""
    nest = Nest((1, 1, 1, 4, 3), {"a": 10, "b": 20},
                {"a": (0, 0, 0, 1, 1), "b": (0, 0, 0, 2, 2)})
    limits = {g: 1 << b for g, b in TWO.items()}
    dut = LoopNest(TWO, levels=5)
    abort = Signal()
    top = Module()
    top.submodules.nest = ResetInserter(abort)(dut)
    seen = {}

    async def bench(ctx):
        await configure(ctx, dut, nest, limits)
        ctx.set(dut.advance, 1)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        await ctx.tick().repeat(5)                  # the walk runs: a delta is being read
        assert ctx.get(dut.busy) and ctx.get(dut.valid)
        ctx.set(abort, 1)
        await ctx.tick()
        ctx.set(abort, 0)
        ctx.set(dut.start, 1)                       # the cycle after the reset: ignored
        await ctx.tick()
        seen["busy"] = ctx.get(dut.busy)
        seen["walk"] = await walk(ctx, dut, nest, limits, configured=True)

    run_testbench(top, bench)
    assert seen["busy"] == 0
    taken, at, done_at, result = seen["walk"]
    assert taken == expected(nest) and at[0] == 2 and result["fault"] == 0
