"""The golden model's arithmetic primitives against hand-computed values."""

import numpy as np
import pytest

from ember import golden, spec


@pytest.mark.parametrize("x, shift, expected", [
    (5, 1, 3),      # 2.5 -> 3 (tie away from zero)
    (-5, 1, -3),    # -2.5 -> -3
    (3, 1, 2),      # 1.5 -> 2
    (-3, 1, -2),
    (1, 1, 1),      # 0.5 -> 1
    (-1, 1, -1),
    (-2, 1, -1),
    (6, 2, 2),      # 1.5 -> 2
    (5, 2, 1),      # 1.25 -> 1
    (-5, 2, -1),
    (-6, 2, -2),
    (-7, 2, -2),    # -1.75 -> -2
    (7, 0, 7),
    (-7, 0, -7),
    ((1 << 40) - 1, 40, 1),
    (-(1 << 39), 40, -1),          # -0.5 -> -1
    (-(1 << 39) + 1, 40, 0),       # just above -0.5 -> 0
])
def test_round_shift_ties_away_from_zero(x, shift, expected):
    assert int(golden.round_shift(np.int64(x), shift)) == expected


def test_saturate_edges():
    x = np.array([-40000, -32768, -32767, 0, 32767, 32768, 99999])
    assert golden.saturate(x, 16).tolist() == [-32768, -32768, -32767, 0, 32767, 32767, 32767]
    assert golden.saturate(x, 16, signed="symmetric").tolist() == \
        [-32767, -32767, -32767, 0, 32767, 32767, 32767]
    assert golden.saturate(np.array([-1, 0, 255, 256]), 8, signed=False).tolist() == \
        [0, 0, 255, 255]


def test_requantize_relu_and_logits():
    acc = np.array([-(1 << 20), -1, (1 << 13), (1 << 14) * 300, (3 << 13)])
    # hidden: >> 14 with rounding, ReLU, saturate to 255
    assert golden.requantize(acc, 14, relu=True).tolist() == [0, 0, 1, 255, 2]
    assert golden.requantize(np.array([1 << 40, -(1 << 40)]), 12, relu=False).tolist() == \
        [32767, -32768]


def test_bit_length_is_a_leading_one_detector():
    assert [golden.bit_length(v) for v in (0, 1, 2, 3, 32767, 32768, 1 << 31)] == \
        [0, 1, 2, 2, 15, 16, 32]


def test_exp2_table():
    assert spec.EXP2_TABLE[0] == 32768
    assert spec.EXP2_TABLE[8] == 23170          # 2**15 / sqrt(2)
    assert len(spec.EXP2_TABLE) == 16
    assert all(a > b for a, b in zip(spec.EXP2_TABLE, spec.EXP2_TABLE[1:]))


def test_softmax_grad_hand_values():
    # four equal logits: p = 1/4 each = 8192; the label's gradient is 8192 - 32768
    g = golden.softmax_grad(np.array([[0, 0, 0, 0]]), [0])
    assert g.tolist() == [[-24576, 8192, 8192, 8192]]
    # logits (1.0, 0) in Q7.8: d = (0, 256), t = 369 (int 1, frac index 7),
    # e = (32768, 24198 >> 1 = 12099), S = 44867, r = 47863,
    # p = (23932, 8836); label 1 -> (23932, 8836 - 32768)
    g = golden.softmax_grad(np.array([[256, 0]]), [1])
    assert g.tolist() == [[23932, -23932]]


def test_softmax_grad_far_logits_underflow_and_saturate():
    # a logit 100.0 below the max: its exponent is past the table -> e = 0 exactly
    g = golden.softmax_grad(np.array([[0, -25600, 0]]), [2])
    assert g[0, 1] == 0
    # a sure, correct prediction: p = 32768, gradient 0 for the label
    g = golden.softmax_grad(np.array([[32767, -32768]]), [0])
    assert g.tolist() == [[0, 0]]
    # a sure, wrong prediction: p(label) = 0 -> -32768, saturated (symmetric) to -32767
    g = golden.softmax_grad(np.array([[32767, -32768]]), [1])
    assert g.tolist() == [[32767, -32767]]


def test_softmax_grad_close_to_float():
    rng = np.random.default_rng(1)
    logits = rng.integers(-2000, 2000, size=(200, 10))
    labels = rng.integers(0, 10, size=200)
    g = golden.softmax_grad(logits, labels) / 32768
    z = logits / 256.0
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(200), labels] -= 1
    assert np.abs(g - p).max() < 0.03


def test_lfsr_sequence_by_hand():
    # seed 1: the one bit shifts out and the taps are XORed in: 0xB400
    states, last = golden.lfsr_sequence(1, 4)
    assert states.tolist() == [0xB400, 0x5A00, 0x2D00, 0x1680]
    assert last == 0x1680
    # maximal length: the period is 65535
    states, _ = golden.lfsr_sequence(1, 65535)
    assert len(set(states.tolist())) == 65535 and states[-1] == 1


def test_keep_count():
    assert golden.keep_count(10, spec.KEEP_ONE) == 10
    assert golden.keep_count(10, 51) == 1          # 510 >> 8 = 1
    assert golden.keep_count(10, 1) == 1           # never fewer than one
    assert golden.keep_count(32, 128) == 16
    assert golden.keep_count(7, 255) == 6


def test_select_channels_ties_go_to_lower_index():
    scores = np.array([5, 9, 5, 9, 1, 5])
    assert golden.select_channels(scores, 1).tolist() == [0, 1, 0, 0, 0, 0]
    assert golden.select_channels(scores, 3).tolist() == [1, 1, 0, 1, 0, 0]
    assert golden.select_channels(scores, 4).tolist() == [1, 1, 1, 1, 0, 0]
    assert golden.select_channels(np.zeros(4, dtype=int), 2).tolist() == [1, 1, 0, 0]


def test_psg_predict_slices_and_truncates_toward_zero():
    dy = np.array([[300, -300, 255, -255, 32767, -32767]])
    a = np.array([[255]])
    # sign * (|dy| >> 8): 1, -1, 0, 0 (no floor bias), 127, -127;  A >> 4 = 15
    assert golden.psg_predict(dy, a)[:, 0].tolist() == [15, -15, 0, 0, 1905, -1905]


def test_updates_saturate():
    w = np.array([32760, -32760, 100])
    assert golden.sign_update(w, np.array([-1, 1, 0]), 4).tolist() == [32767, -32768, 100]
    assert golden.sgd_update(w, np.array([-(1 << 20), 1 << 20, 3]), 1).tolist() == \
        [32767, -32768, 98]


def test_weights_sha256_canonical_order():
    w = [np.array([[1, -2]], dtype=np.int16)]
    import hashlib
    assert golden.weights_sha256(w) == hashlib.sha256(b"\x01\x00\xfe\xff").hexdigest()


def test_below_is_less_than_at_every_width_and_limit():
    """ember_hw.arith.below: value < limit for constant limits (0, powers of two, others, past
    the value's range) and for narrower, equal and wider signal limits."""
    from amaranth.hdl import Module, Signal
    from amaranth.sim import Simulator
    from ember_hw.arith import below

    value = Signal(9)
    limits = {"narrow": Signal(4), "equal": Signal(9), "wide": Signal(12)}
    constants = [0, 1, 2, 3, 8, 13, 64, 100, 511, 512, 600]
    m = Module()
    got = {}
    for name, lim in limits.items():
        got[name] = Signal(name=f"below_{name}")
        m.d.comb += got[name].eq(below(value, lim))
    for c in constants:
        got[c] = Signal(name=f"below_{c}")
        m.d.comb += got[c].eq(below(value, c))
    rng = np.random.default_rng(9)

    async def bench(ctx):
        for v in list(range(0, 512, 7)) + [0, 1, 7, 8, 15, 16, 255, 511]:
            ctx.set(value, v)
            for c in constants:
                assert ctx.get(got[c]) == (v < c), (v, c)
            for name, lim in limits.items():
                for x in {0, 1, (1 << len(lim)) - 1, int(rng.integers(1 << len(lim))), v}:
                    if x < 1 << len(lim):
                        ctx.set(lim, x)
                        assert ctx.get(got[name]) == (v < x), (v, name, x)

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()


@pytest.mark.parametrize("width", [1, 5, 17, 32])
def test_bit_length_tree_matches_golden(width):
    """ember_hw.arith.bit_length (a tree) against golden.bit_length: 0, every single bit,
    all ones and random values."""
    from amaranth.hdl import Module, Signal
    from amaranth.sim import Simulator
    from ember_hw.arith import bit_length

    value, got = Signal(width), Signal(range(width + 1))
    m = Module()
    m.d.comb += got.eq(bit_length(value))
    rng = np.random.default_rng(width)
    values = [0, (1 << width) - 1] + [1 << b for b in range(width)]
    values += [int(v) for v in rng.integers(0, 1 << width, 50)]

    async def bench(ctx):
        for v in values:
            ctx.set(value, v)
            assert ctx.get(got) == golden.bit_length(v), v

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
