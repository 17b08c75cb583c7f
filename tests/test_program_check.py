"""The program check (hw/ember_hw/program_check.py) against its golden twin
dataflow.verify_verdict, in the Amaranth simulator: compiled infer and train programs pass;
damaged ones, chosen to fail each of VERIFY_CHECKS and at random, get verify's verdict (the
same phase and check); a check takes the cycles its docstring says."""

import numpy as np
import pytest
from amaranth import Module
from amaranth.lib.memory import Memory
from amaranth.sim import Simulator

from ember import dataflow, program
from ember_hw.program_check import EXACT_BITS, READ_STAGES, ProgramCheck

from test_sample_engine import LANE_BUILDS
from test_verify import (TIGHT, TIGHT_BUILDS, changed, compiled_programs, first,
                         hostile_programs, refusals, tight_program)


def memory_image(words, build):
    """`build`'s program memory after `words` are written from word 0 (the rest holds zeros:
    an end header)."""
    words = list(words)[:build.program_words]
    return words + [0] * (build.program_words - len(words))


def run_checks(build, programs):
    """Each program's memory image checked by a ProgramCheck on `build` reading it through a
    synchronous read port: [(ok, check, phase, cycles from the start cycle to done)]. A
    program is its words, or (words, base): the check starts at word `base`."""
    dut = ProgramCheck(build)
    m = Module()
    m.submodules.check = dut
    m.submodules.memory = memory = Memory(shape=32, depth=build.program_words, init=[])
    port = memory.read_port()
    m.d.comb += [port.addr.eq(dut.rd_addr), dut.rd_data.eq(port.data)]
    out = []

    async def bench(ctx):
        for words in programs:
            words, base = words if isinstance(words, tuple) else (words, 0)
            for i, word in enumerate(memory_image(words, build)):
                ctx.set(memory.data[i], word)
            ctx.set(dut.base, base)
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            cycles = 1
            assert ctx.get(dut.busy)
            while not ctx.get(dut.done):
                await ctx.tick()
                cycles += 1
            out.append((ctx.get(dut.ok), ctx.get(dut.check), ctx.get(dut.phase), cycles))
            await ctx.tick()
            assert not ctx.get(dut.busy) and not ctx.get(dut.done)

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return out


def golden(words, build):
    """verify_verdict of the memory image: None or (phase, check name); words as in
    run_checks."""
    words, base = words if isinstance(words, tuple) else (words, 0)
    verdict = dataflow.verify_verdict(memory_image(words, build), build, base)
    return None if verdict is None else verdict[:2]


def unit_verdict(result):
    ok, check, phase, _ = result
    if ok:
        assert check == 0, result
        return None
    assert check >= 1, result
    return phase, dataflow.VERIFY_CHECKS[check - 1]


def assert_same_verdicts(build, cases):
    """cases: [(what, words)]; every unit verdict is verify_verdict's. Returns the golden
    verdicts."""
    results = run_checks(build, [words for _, words in cases])
    want = [golden(words, build) for _, words in cases]
    for (what, _), result, verdict in zip(cases, results, want):
        assert unit_verdict(result) == verdict, (what, result, verdict)
    return want, results


@pytest.mark.parametrize("lanes", [2, 4])
def test_compiled_programs_pass(lanes):
    build = LANE_BUILDS[lanes]
    rng = np.random.default_rng(70 + lanes)
    cases = list(compiled_programs(rng, build, 3))
    assert len(cases) >= 8
    want, _ = assert_same_verdicts(build, cases)
    assert want == [None] * len(cases)


def test_a_program_that_begins_past_word_0_is_checked_from_there():
    """The train and infer programs side by side (INFER_PROGRAM: the infer program's first
    word): each passes from its own first word; a base inside a phase, one whose program
    would pass the memory's end, and the last word get verify's verdicts."""
    build = LANE_BUILDS[4]
    rng = np.random.default_rng(90)
    layers, shifts = [12, 9, 5], [6, 7]
    train = dataflow.encode(dataflow.train_program(layers, build, 7, shifts), build)
    infer = dataflow.encode(dataflow.infer_program(layers, build, 16, shifts), build)
    both = train + infer
    end = build.program_words
    at_end = (train + [0] * (end - len(train) - len(infer) + 5) + infer)[:end]
    cases = [("train", (both, 0)), ("infer beside it", (both, len(train))),
             ("inside a phase", (both, dataflow.PHASE_WORDS + 3)),
             ("the infer program cut by the end", (at_end, end - len(infer) + 5)),
             ("the last word", (both, end - 1)),
             ("random", (both, int(rng.integers(0, end))))]
    want, _ = assert_same_verdicts(build, cases)
    assert want[:2] == [None, None]
    assert want[3][1] == "end" and want[4][1] == "end", want


def ordering_programs():
    """Damage where a range fault and a run-time stride meet in one generator of a weight
    gradient phase, and strides past the exact width of R (the module's lost R)."""
    P = tight_program()
    wg = first(P, "weight_grad", layer=1)
    pas, inner, block = dataflow.PASS_LEVEL, dataflow.INNER, dataflow.GRAD_BLOCK_LEVEL
    # a out of range at the inner level, the pass level still stepping 0: range
    yield "range, pass 0", dataflow.encode(changed(P, wg, stride_a=(inner, 1000)), TIGHT)
    # ... and stepping 1 there: the run-time stride comes first
    both = changed(P, wg, stride_a=(inner, 1000))
    yield "range and pass", dataflow.encode(changed(both, wg, stride_a=(pas, 1)), TIGHT)
    # a pass stride of 0 only by cancelling large inner reaches (deltas as the core reads)
    words = dataflow.encode(P, TIGHT)
    at_a = (wg * dataflow.PHASE_WORDS + dataflow.HEADER_WORDS + dataflow.BOUND_WORDS
            + dataflow.GENERATORS.index("a") * (1 + dataflow.LEVELS))
    ph = P[wg]
    kn, blocks = ph.bounds[inner], ph.bounds[block]
    for what, d_inner in (("large", 5_000_000), ("huge", (1 << 31) - 1), ("low", -(1 << 31))):
        deltas = [0] * dataflow.LEVELS
        deltas[inner] = d_inner
        # stride_3 = delta_3 + (kn - 1) * d_inner, stride_2 = delta_2 + R
        deltas[block] = 0
        r = (kn - 1) * d_inner + (blocks - 1) * ((kn - 1) * d_inner)
        for off in (0, 1):
            bad = list(words)
            for level, d in enumerate(deltas):
                bad[at_a + 1 + level] = d & dataflow.WORD_MASK
            # a 32-bit delta cancels R only while |R| <= 2**31
            bad[at_a + 1 + pas] = (-r + off) & dataflow.WORD_MASK if abs(r) <= 1 << 31 \
                else (1 << 31) - 1
            yield f"{what} inner stride, pass delta off {off}", bad
    # R past its exact width in one product (15 blocks, the most the build's counters hold,
    # of stride 2**31 - 1), the pass delta 0: the pass level steps 14 * (2**31 - 1) > 2**33,
    # a run-time stride
    blocks = dataflow.bound_limit(TIGHT)
    assert (blocks - 1) * ((1 << 31) - 1) >= 1 << EXACT_BITS
    bad = list(words)
    at_b = wg * dataflow.PHASE_WORDS + dataflow.HEADER_WORDS + block // 2
    shift = program.BOUND_BITS * (block % 2)
    bad[at_b] = (bad[at_b] & ~(program.MAX_BOUND << shift)) | (blocks << shift)
    for level in range(dataflow.LEVELS):
        bad[at_a + 1 + level] = (1 << 31) - 1 if level == block else 0
    for g_i in range(len(dataflow.GENERATORS)):     # the others step nothing inside
        at_g = at_a + (g_i - dataflow.GENERATORS.index("a")) * (1 + dataflow.LEVELS)
        for level in range(pas, dataflow.LEVELS):
            bad[at_g + 1 + level] = bad[at_g + 1 + level] if at_g == at_a else 0
    yield "lost R", bad


def width_programs():
    """Damage at the edges of the unit's narrow registers (TIGHT's limits fit 9 bits)."""
    P = tight_program()
    fwd, sel1 = first(P, "forward"), first(P, "select", layer=1)
    # one product past the limit and past 2**9 (14 * 40 = 560) from a stride inside it and
    # a bound the build's counters hold (15)
    yield "one reach past the limit", dataflow.encode(
        changed(changed(P, fwd, bound=(0, 15)), fwd, stride_w=(0, 40)), TIGHT)
    # a channel count past the outputs' register (16 = 4 * 4 = 0b10000 > 5; each bound
    # within the build's bound_limit, 15)
    assert dataflow.bound_limit(TIGHT) == 15
    yield "channels past the width", dataflow.encode(
        changed(changed(P, sel1, bound=(0, 4)), sel1, bound=(1, 4)), TIGHT)
    # a bound past the build's loop-nest counters (16 > bound_limit 15)
    yield "a bound past the counters", dataflow.encode(changed(P, fwd, bound=(0, 16)), TIGHT)


def test_each_check_refuses_as_verify_does():
    """Deliberate damage (test_verify's refusals, each check of VERIFY_CHECKS but the
    host-only 32-bit word), the range and run-time-stride orderings and the edges of the
    unit's widths: the same phase and check as verify_verdict."""
    cases = [(what, words) for what, words, _, _ in refusals() if what != "word"]
    cases += list(ordering_programs()) + list(width_programs())
    want, _ = assert_same_verdicts(TIGHT, cases)
    named = {verdict[1] for verdict in want if verdict is not None}
    assert named == set(dataflow.VERIFY_CHECKS), named
    order = dict(zip([w for w, _ in cases], want))
    assert order["range, pass 0"][1] == "range"
    assert order["range and pass"][1] == "run_time_stride"
    assert order["large inner stride, pass delta off 0"][1] == "range"
    assert order["large inner stride, pass delta off 1"][1] == "run_time_stride"
    assert order["huge inner stride, pass delta off 0"][1] == "run_time_stride"
    assert order["lost R"][1] == "run_time_stride"
    assert order["one reach past the limit"][1] == "range"
    assert order["channels past the width"][1] == "channel"
    assert order["a bound past the counters"][1] == "bound"


@pytest.mark.parametrize("lanes", [2, 4])
def test_random_damage_gets_verifys_verdict(lanes):
    build = TIGHT_BUILDS[lanes]
    rng = np.random.default_rng(500 + lanes)
    cases = [(what, bad) for _, bad, what in hostile_programs(rng, build, 8)]
    want, _ = assert_same_verdicts(build, cases)
    # neither always fatal nor always harmless
    assert None in want and any(v is not None for v in want), want


#: The cycles of a phase without products, and of the end phase (ProgramCheck's docstring):
#: every read that has no other in flight waits READ_STAGES cycles for its registers.
PHASE_CYCLES = 86 + READ_STAGES * (1 + dataflow.LEVELS
                                   + len(dataflow.GENERATORS) * (1 + dataflow.LEVELS))
END_CYCLES = 2 + READ_STAGES


def expected_cycles(words, build):
    """The cycles ProgramCheck's docstring gives for a program it accepts: END_CYCLES + sum
    over the phases of PHASE_CYCLES + 17 * its products."""
    phases = dataflow.decode(words)
    total, select = END_CYCLES, None
    for ph in phases:
        products = 0
        if ph.kind == "select":
            count = 1
            for n in ph.bounds[:dataflow.INNER]:
                if n != 1 and count <= ph.outputs:
                    products += 1
                    count *= n
        nest = dataflow.effective_nest(ph, select)
        for g in dataflow.GENERATORS:
            products += sum(n > 1 and s != 0 for n, s in zip(nest.bounds, nest.strides[g]))
        products += ph.kind in dataflow.KEPT_LEVEL
        total += PHASE_CYCLES + 17 * products
        if ph.kind == "select":
            select = ph
    return total


def test_the_cycles_of_a_train_program():
    """A 3-layer network's train program: the docstring's count, and at most 541 a phase
    (PHASE_CYCLES + 17 x 25 products)."""
    build = LANE_BUILDS[4]
    layers = [24, 16, 12, 8]
    phases = dataflow.train_program(layers, build, 10, [4, 4, 4], psg_relative=True)
    words = dataflow.encode(phases, build)
    ((ok, check, phase, cycles),) = run_checks(build, [words])
    assert ok and check == 0
    want = expected_cycles(words, build)
    assert PHASE_CYCLES == 116 and END_CYCLES == 3      # the docstring's figures
    assert cycles == want and cycles <= END_CYCLES + 541 * len(phases), \
        f"{cycles} cycles for {len(phases)} phases (the docstring's formula: {want})"
    print(f"{cycles} cycles for the {len(phases)} phases of {layers}")


def adversarial_deltas(rng, count):
    """`count` copies of TIGHT's train program with one phase's deltas replaced (any 32-bit
    value, the extremes, small ones, or what makes a level's stride -1, 0 or 1 by cancelling
    the inner levels' reach) and sometimes a bound (0, 1, 2, 16, 65535): R's exact width,
    its loss and the order of the run-time-stride and range checks."""
    words = dataflow.encode(tight_program(), TIGHT)
    phases = (len(words) - dataflow.HEADER_WORDS) // dataflow.PHASE_WORDS
    for _ in range(count):
        bad = list(words)
        at = int(rng.integers(phases)) * dataflow.PHASE_WORDS
        for _ in range(int(rng.integers(1, 5))):
            g = int(rng.integers(len(dataflow.GENERATORS)))
            level = int(rng.integers(dataflow.LEVELS))
            at_d = (at + dataflow.HEADER_WORDS + dataflow.BOUND_WORDS
                    + g * (1 + dataflow.LEVELS) + 1 + level)
            pick = int(rng.integers(4))
            if pick == 0:
                delta = int(rng.integers(-1 << 31, 1 << 31))
            elif pick == 1:
                delta = int(rng.choice([(1 << 31) - 1, -1 << 31, 1 << 30, -1 << 30]))
            elif pick == 2:
                delta = int(rng.integers(-100, 100))
            else:
                fields = dataflow._header(bad, at)
                kind = dataflow.KIND_NAMES[fields.pop("kind")]
                stride = dataflow._phase(bad, at, kind, fields).nest.strides[
                    dataflow.GENERATORS[g]][level]
                delta = dataflow._signed(bad[at_d]) - stride + int(rng.integers(-1, 2))
            bad[at_d] = delta & dataflow.WORD_MASK
        if rng.random() < 0.5:
            level = int(rng.integers(dataflow.LEVELS))
            at_b = at + dataflow.HEADER_WORDS + level // 2
            shift = program.BOUND_BITS * (level % 2)
            bound = int(rng.choice([0, 1, 2, 16, program.MAX_BOUND]))
            bad[at_b] = (bad[at_b] & ~(program.MAX_BOUND << shift)) | (bound << shift)
        yield bad


def test_adversarial_deltas_get_verifys_verdict():
    rng = np.random.default_rng(123)
    cases = [(f"deltas {i}", bad) for i, bad in enumerate(adversarial_deltas(rng, 40))]
    want, _ = assert_same_verdicts(TIGHT, cases)
    named = {v[1] for v in want if v is not None}
    assert {"run_time_stride", "range"} <= named and None in want, want
