"""Loss unit gateware (hw/ember_hw/loss.py) against its golden twins golden.softmax_grad and
golden.argmax_first, bit for bit, in the Amaranth simulator."""

import gc
import warnings

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module, UnusedElaboratable, signed
from amaranth.lib.memory import Memory
from amaranth.sim import Simulator

from ember import golden, spec
from ember_hw.loss import SoftmaxGradUnit

LOGIT_MIN = -(1 << (spec.LOGIT_BITS - 1))
LOGIT_MAX = (1 << (spec.LOGIT_BITS - 1)) - 1
GRAD_LIMIT = (1 << (spec.GRAD_BITS - 1)) - 1


def simulate(dut, testbench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()


def run_samples(samples, max_classes=1024, seed=0, back_to_back=True, start_noise=True):
    """Run (logits, label) samples through one unit; the testbench is the synchronous memory
    (rd_data is the logit addressed in the previous cycle, random garbage after a cycle
    without rd_en). With `back_to_back`, each start is raised in the previous sample's done
    cycle; otherwise after a few idle cycles. With `start_noise`, start is also pulsed while
    busy with other classes/label (it must be ignored).

    Returns one dict per sample: grads (by index, in write order), predicted, correct, reads,
    writes, cycles (start cycle to done cycle)."""
    dut = SoftmaxGradUnit(max_classes)
    results = []

    async def tb(ctx):
        rng = np.random.default_rng(seed)
        pending = list(samples)
        current = None
        cycle = 0
        idle = 0
        while pending or current is not None:
            rd_en, rd_addr = ctx.get(dut.rd_en), ctx.get(dut.rd_addr)
            wr_en = ctx.get(dut.wr_en)
            if current is None:
                assert not rd_en and not wr_en, f"memory access while idle (cycle {cycle})"
            else:
                logits, label, rec = current
                if rd_en:
                    assert rd_addr < len(logits), f"read of index {rd_addr}, N={len(logits)}"
                    rec["reads"] += 1
                if wr_en:
                    rec["writes"] += 1
                    rec["grads"].append((ctx.get(dut.wr_addr), ctx.get(dut.wr_data)))
                if ctx.get(dut.done):
                    assert not rd_en and not wr_en
                    rec["cycles"] = cycle - rec["start"]
                    rec["predicted"] = ctx.get(dut.predicted)
                    rec["correct"] = ctx.get(dut.correct)
                    results.append(rec)
                    current = None
                    idle = 0 if back_to_back else int(rng.integers(1, 4))
                else:
                    assert ctx.get(dut.busy), f"busy low before done (cycle {cycle})"

            if current is None and pending and idle == 0:
                assert not ctx.get(dut.busy)
                logits, label = pending.pop(0)
                ctx.set(dut.classes, len(logits))
                ctx.set(dut.label, label)
                ctx.set(dut.start, 1)
                current = (logits, label, {"start": cycle, "reads": 0, "writes": 0,
                                           "grads": []})
            elif current is not None and start_noise and rng.random() < 0.05:
                ctx.set(dut.classes, int(rng.integers(2, max_classes + 1)))
                ctx.set(dut.label, int(rng.integers(0, max_classes)))
                ctx.set(dut.start, 1)
            else:
                idle = max(idle - 1, 0)
                ctx.set(dut.start, 0)

            await ctx.tick()
            cycle += 1
            if rd_en:
                ctx.set(dut.rd_data, int(current[0][rd_addr]))
            else:
                ctx.set(dut.rd_data, int(rng.integers(LOGIT_MIN, LOGIT_MAX + 1)))
            if current is not None:
                assert cycle - current[2]["start"] < 4 * len(current[0]) + 100, "no done"

    simulate(dut, tb)
    return results


def check(samples, **kwargs):
    """Run `samples` and compare every gradient, prediction and count with the golden model.
    Returns the cycles of each sample."""
    results = run_samples(samples, **kwargs)
    assert len(results) == len(samples)
    for (logits, label), rec in zip(samples, results):
        n = len(logits)
        z = np.array([logits], dtype=np.int64)
        want = golden.softmax_grad(z, [label])[0]
        predicted = int(golden.argmax_first(z)[0])
        case = f"N={n} label={label} logits={list(logits)[:8]}..."
        assert rec["reads"] == 3 * n, case
        assert rec["writes"] == n, case
        assert [a for a, _ in rec["grads"]] == list(range(n)), case
        got = np.array([g for _, g in rec["grads"]])
        assert np.array_equal(got, want), f"{case}\n got {got}\nwant {want}"
        assert rec["predicted"] == predicted, case
        assert rec["correct"] == (predicted == label), case
        assert rec["cycles"] == SoftmaxGradUnit.cycles(n) == 3 * n + 23, case
    return [rec["cycles"] for rec in results]


def random_logits(rng, n):
    """Logits of three kinds: typical (|z| < 8.0), full int16 range, and small integers (many
    ties)."""
    kind = rng.integers(3)
    if kind == 0:
        return rng.integers(-8 << spec.LOGIT_FRAC_BITS, 8 << spec.LOGIT_FRAC_BITS, size=n)
    if kind == 1:
        return rng.integers(LOGIT_MIN, LOGIT_MAX + 1, size=n)
    return rng.integers(-3, 4, size=n) << spec.LOGIT_FRAC_BITS


def test_worked_example():
    """docs/numerics.md section 4: logits (1.0, 0.0), label 1 -> (23932, -23932)."""
    samples = [((256, 0), 1), ((256, 0), 0)]
    check(samples)
    assert list(golden.softmax_grad([[256, 0]], [1])[0]) == [23932, -23932]


def test_random_logits_many_sizes():
    rng = np.random.default_rng(1)
    samples = []
    for _ in range(70):
        n = int(rng.integers(2, 65))
        samples.append((random_logits(rng, n), int(rng.integers(n))))
    cycles = check(samples, max_classes=64)
    assert sum(cycles) == sum(3 * len(z) + 23 for z, _ in samples)


def test_random_logits_with_idle_gaps_and_default_width():
    rng = np.random.default_rng(2)
    samples = []
    for _ in range(12):
        n = int(rng.integers(2, 65))
        samples.append((random_logits(rng, n), int(rng.integers(n))))
    check(samples, back_to_back=False, seed=3)


def test_all_equal_logits():
    samples = [(np.full(n, v), label) for n, v, label in
               [(2, 0, 0), (5, LOGIT_MIN, 4), (7, LOGIT_MAX, 3), (64, 1234, 10), (3, -1, 1)]]
    check(samples, max_classes=64)


def test_full_sum_width():
    """N = max_classes equal logits: S = max_classes * 2**15, the widest exponent sum."""
    check([(np.zeros(64, dtype=np.int64), 63)], max_classes=64)
    check([(np.full(2, 77), 1)], max_classes=2)


def test_extreme_logits_saturate():
    """+32767 against -32768: the others' exponents underflow to 0, S = 2**15, r = 2**16 and
    the maximum's p = 32768, which saturates on both sides of a wrong label."""
    samples = [
        ((LOGIT_MAX, LOGIT_MIN), 1),
        ((LOGIT_MIN, LOGIT_MAX), 1),
        ((LOGIT_MIN, LOGIT_MIN, LOGIT_MAX, LOGIT_MIN, 0), 0),
        ((LOGIT_MAX, LOGIT_MIN, LOGIT_MAX, LOGIT_MIN), 3),
        ((LOGIT_MIN,) * 9 + (LOGIT_MAX,), 9),
    ]
    want = golden.softmax_grad(np.array([samples[0][0]]), [1])[0]
    assert list(want) == [GRAD_LIMIT, -GRAD_LIMIT]  # the case really saturates
    check(samples)


def test_argmax_ties_go_to_lowest_index():
    rng = np.random.default_rng(4)
    samples = []
    for _ in range(20):
        n = int(rng.integers(2, 40))
        z = rng.integers(-1000, 1000, size=n)
        top = rng.choice(n, size=int(rng.integers(2, n + 1)), replace=False)
        z[top] = z.max() + int(rng.integers(0, 3))
        label = int(top.min()) if rng.random() < 0.5 else int(top.max())
        samples.append((z, label))
    samples.append(((5, 5), 0))
    samples.append(((5, 5), 1))
    check(samples, max_classes=64)
    assert any(golden.argmax_first(np.array([z]))[0] == lbl for z, lbl in samples)
    assert not all(golden.argmax_first(np.array([z]))[0] == lbl for z, lbl in samples)


def test_two_classes():
    rng = np.random.default_rng(5)
    samples = [(rng.integers(LOGIT_MIN, LOGIT_MAX + 1, size=2), int(rng.integers(2)))
               for _ in range(20)]
    check(samples, max_classes=2)


def test_large_classes():
    rng = np.random.default_rng(6)
    samples = [(random_logits(rng, n), int(rng.integers(n))) for n in (300, 257, 129)]
    cycles = check(samples, max_classes=300)
    print("cycles per sample:", {len(z): c for (z, _), c in zip(samples, cycles)})


class _WithMemories(Elaboratable):
    """The unit between two lib.memory.Memory instances, as the engine will connect it."""

    def __init__(self, logits):
        self.unit = SoftmaxGradUnit(max_classes=len(logits))
        self.logits = Memory(shape=signed(spec.LOGIT_BITS), depth=len(logits),
                             init=[int(v) for v in logits])
        self.grads = Memory(shape=signed(spec.GRAD_BITS), depth=len(logits), init=[])

    def elaborate(self, platform):
        m = Module()
        m.submodules.unit = unit = self.unit
        m.submodules.logits = self.logits
        m.submodules.grads = self.grads
        rd = self.logits.read_port()
        wr = self.grads.write_port()
        m.d.comb += [
            rd.addr.eq(unit.rd_addr), rd.en.eq(unit.rd_en), unit.rd_data.eq(rd.data),
            wr.addr.eq(unit.wr_addr), wr.data.eq(unit.wr_data), wr.en.eq(unit.wr_en),
        ]
        return m


@pytest.mark.parametrize("n", [3, 40])
def test_with_lib_memory(n):
    rng = np.random.default_rng(n)
    logits = random_logits(rng, n)
    label = int(rng.integers(n))
    top = _WithMemories(logits)
    unit = top.unit

    async def tb(ctx):
        ctx.set(unit.classes, n)
        ctx.set(unit.label, label)
        ctx.set(unit.start, 1)
        await ctx.tick()
        ctx.set(unit.start, 0)
        cycles = 1
        while not ctx.get(unit.done):
            await ctx.tick()
            cycles += 1
        assert cycles == SoftmaxGradUnit.cycles(n)
        got = [ctx.get(top.grads.data[i]) for i in range(n)]
        z = np.array([logits])
        assert got == list(golden.softmax_grad(z, [label])[0])
        assert ctx.get(unit.predicted) == golden.argmax_first(z)[0]

    simulate(top, tb)


def test_rejects_bad_max_classes():
    with warnings.catch_warnings():
        # The refused instances are never elaborated; collect them while silenced.
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(ValueError, match="max_classes 1 is outside 2..4096"):
            SoftmaxGradUnit(1)
        with pytest.raises(ValueError, match=f"outside 2..{spec.MAX_WIDTH}"):
            SoftmaxGradUnit(spec.MAX_WIDTH + 1)
        gc.collect()
