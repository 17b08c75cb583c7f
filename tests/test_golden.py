"""The golden model's training step: closed-form event counts, method semantics, validation."""

import numpy as np
import pytest

from conftest import make_model, random_batch
from ember import golden, spec
from ember.reference import FloatNet
from ember.spec import ConfigError, StepSettings


def nk(layers):
    return [k * n for k, n in zip(layers[:-1], layers[1:])]


@pytest.mark.parametrize("build", ["v1", "sim"])
@pytest.mark.parametrize("layers", [[64, 32, 10], [37, 19, 7], [64, 48, 24, 10], [5, 3]])
@pytest.mark.parametrize("batch", [6, 13])
def test_dense_step_counts_closed_form(layers, batch, build):
    """A dense step's events in closed form. Engine v1 reads every weight once per sample in
    the forward and input-gradient passes; engine v2 (the sim build, lanes over samples with
    the weight broadcast) once per block of P samples (docs/energy.md). Both read each weight
    once more for its update. v2's held dY reads (grad_lane_reads) are the executor's
    (tests/test_dataflow.py), not a closed form."""
    rng = np.random.default_rng(len(layers))
    m = make_model(layers, build=spec.BUILDS[build])
    x, y = random_batch(rng, layers, batch)
    m.train_batch(x, y, StepSettings())
    c, P = m.counters, m.build.lanes
    blocks = [-(-n // P) for n in layers[1:]]
    assert c["mac_forward"] == batch * sum(nk(layers))
    assert c["mac_weight_grad"] == batch * sum(nk(layers))
    assert c["mac_input_grad"] == batch * sum(nk(layers)[1:])
    assert c["mac_weight_grad_low"] == 0
    assert all(c[f"skip_{r}"] == 0 for r in ("slu", "ssprop", "psg", "zero"))
    assert c["act_writes"] == batch * sum(layers[:-1])
    # a weight read per MAC step: per sample (v1) or per block of P samples (v2)
    steps = batch if build == "v1" else -(-batch // P)
    assert c["weight_reads"] == 2 * steps * sum(nk(layers)) - steps * nk(layers)[0] + \
        sum(nk(layers))
    if build == "v1":
        assert c["act_reads"] == 2 * batch * sum(b * k for b, k in zip(blocks, layers)) + \
            batch * sum(layers[1:-1])
        assert c["grad_lane_reads"] == batch * sum(nk(layers)) * 2 - batch * nk(layers)[0]
    else:
        # each lane reads its own sample's activation for every weight it multiplies
        assert c["act_reads"] == 2 * batch * sum(nk(layers)) + batch * sum(layers[1:-1])
    assert c["loss_elements"] == batch * layers[-1]
    assert c["batches"] == 1 and c["samples"] == batch
    assert golden.dense_macs_per_sample(layers) * batch == \
        c["mac_forward"] + c["mac_weight_grad"] + c["mac_input_grad"]


@pytest.mark.parametrize("mask, frozen_wgrad, skipped_igrad", [
    ((False, True, True), [0], [1]),       # bottom frozen: no input gradient into layer 0
    ((True, False, True), [1], []),        # middle frozen: its input gradient still flows
    ((False, True, False), [0, 2], [1]),   # backward stops below layer 1
    ((False, False, True), [0, 1], [1, 2]),
    ((False, False, False), [0, 1, 2], [1, 2]),
])
def test_slu_skips_closed_form_and_freezes(mask, frozen_wgrad, skipped_igrad):
    layers = [20, 16, 12, 6]
    batch = 5
    rng = np.random.default_rng(7)
    m = make_model(layers)
    before = m.read_weights()
    x, y = random_batch(rng, layers, batch)
    m.train_batch(x, y, StepSettings(update_mask=mask))
    c = m.counters
    products = nk(layers)
    expected = batch * (sum(products[l] for l in frozen_wgrad) +
                        sum(products[l] for l in skipped_igrad))
    assert c["skip_slu"] == expected
    assert c["mac_weight_grad"] == batch * sum(products[l] for l in range(3) if mask[l])
    after = m.read_weights()
    for l in range(3):
        assert np.array_equal(before[l], after[l]) == (not mask[l])


def test_zero_skip_forward_counts_match_the_zeros():
    layers = [30, 17, 5]
    batch = 8
    rng = np.random.default_rng(3)
    m = make_model(layers)
    x, y = random_batch(rng, layers, batch, zero_fraction=0.6)
    hidden = golden.requantize(x @ m.weights[0].T.astype(np.int64), m.shifts[0], relu=True)
    m.infer(x)
    zeros = (x == 0).sum() * 17 + (hidden == 0).sum() * 5
    assert m.counters["skip_zero"] == zeros
    assert m.counters["mac_forward"] == batch * (30 * 17 + 17 * 5) - zeros


def test_zero_skip_training_is_exact_and_counts_every_phase():
    layers = [30, 17, 5]
    rng = np.random.default_rng(4)
    x, y = random_batch(rng, layers, 8, zero_fraction=0.6)
    plain, skip = make_model(layers), make_model(layers)
    h = golden.requantize(x @ plain.weights[0].T.astype(np.int64), plain.shifts[0], relu=True)
    plain.train_batch(x, y, StepSettings())
    skip.train_batch(x, y, StepSettings(zero_skip=True))
    for a, b in zip(plain.weights, skip.weights):
        assert np.array_equal(a, b)            # skipping zeros changes no result
    zeros_fwd = (x == 0).sum() * 17 + (h == 0).sum() * 5
    # weight gradient: a zero activation skips all its outputs; input gradient: a zero
    # hidden activation (ReLU mask) skips its whole dX entry
    zeros_wgrad = (x == 0).sum() * 17 + (h == 0).sum() * 5
    zeros_igrad = (h == 0).sum() * 5
    assert skip.counters["skip_zero"] == zeros_fwd + zeros_wgrad + zeros_igrad
    total = lambda c: c["mac_forward"] + c["mac_weight_grad"] + c["mac_input_grad"]
    assert total(plain.counters) - total(skip.counters) == skip.counters["skip_zero"]


@pytest.mark.parametrize("keep_q8, random", [(64, False), (128, False), (1, False), (77, True)])
def test_ssprop_restricts_both_passes_to_kept_channels(keep_q8, random):
    layers = [24, 20, 9]
    batch = 6
    rng = np.random.default_rng(5)
    x, y = random_batch(rng, layers, batch, zero_fraction=0.3)
    m = make_model(layers)
    w0 = m.read_weights()
    grads, dys = golden.dense_gradients(w0, m.shifts, x, y)
    settings = StepSettings(keep_q8=keep_q8, ssprop_random=random, lfsr_seed=0x1234)
    m.train_batch(x, y, settings)
    w1 = m.read_weights()
    k_out, k_hid = golden.keep_count(9, keep_q8), golden.keep_count(20, keep_q8)
    if random:
        scores, state = golden.lfsr_sequence(0x1234, 9)
    else:
        scores = np.abs(dys[1]).sum(axis=0)
    kept_out = golden.select_channels(scores, k_out)
    changed_rows = np.any(w1[1] != w0[1], axis=1)
    assert not np.any(changed_rows & ~kept_out)          # dropped rows never change
    assert m.counters["skip_ssprop"] == batch * (
        (9 - k_out) * 20 * 2 + (20 - k_hid) * 24)
    # the input gradient is summed over the kept output channels only
    assert m.counters["mac_input_grad"] == batch * k_out * 20


def test_ssprop_dense_keep_changes_nothing():
    layers = [16, 12, 4]
    rng = np.random.default_rng(6)
    x, y = random_batch(rng, layers, 4)
    a, b = make_model(layers), make_model(layers)
    a.train_batch(x, y, StepSettings())
    b.train_batch(x, y, StepSettings(keep_q8=spec.KEEP_ONE, ssprop_random=True))
    assert all(np.array_equal(p, q) for p, q in zip(a.weights, b.weights))
    assert b.counters["skip_ssprop"] == 0


def psg_case(tau):
    """A hand-made case (see the derivation in the test): W = 0 so every logit is 0 and
    dY = 8192 for the other classes and -24576 for the label."""
    m = golden.GoldenModel()
    m.configure([3, 4])
    x = np.array([[15, 255, 0], [16, 0, 0]])
    y = np.array([0, 1])
    m.train_batch(x, y, StepSettings(psg=True, psg_tau=tau, psg_step_shift=3))
    return m


def test_psg_uses_the_predicted_sign_where_confident():
    # row 0, input 0: prediction -96*(15>>4) + 32*(16>>4) = +32 (confident at tau 0),
    # while the full gradient -24576*15 + 8192*16 < 0: the update follows the prediction.
    s = 8
    m = psg_case(tau=0)
    assert m.weights[0].tolist() == [[-s, s, 0], [s, -s, 0], [-s, -s, 0], [-s, -s, 0]]
    c = m.counters
    assert c["mac_weight_grad_low"] == 2 * 4 * 3
    assert c["mac_weight_grad"] == 2 * 4        # input 2 (all zero) is uncertain in 4 rows
    assert c["skip_psg"] == 2 * 8


def test_psg_recomputes_uncertain_entries_in_full_precision():
    # at tau 32 the |prediction| = 32 entries are uncertain: row 0 now takes the full
    # gradient's sign (negative -> +step); rows 2 and 3 agree either way
    s = 8
    m = psg_case(tau=32)
    assert m.weights[0].tolist() == [[s, s, 0], [s, -s, 0], [-s, -s, 0], [-s, -s, 0]]
    c = m.counters
    assert c["mac_weight_grad"] == 2 * 7
    assert c["skip_psg"] == 2 * 5


def test_psg_relative_threshold():
    layers = [16, 8, 4]
    rng = np.random.default_rng(8)
    x, y = random_batch(rng, layers, 8, zero_fraction=0.2)
    lo, hi = make_model(layers), make_model(layers)
    lo.train_batch(x, y, StepSettings(psg=True, psg_relative=True, psg_tau=10))
    hi.train_batch(x, y, StepSettings(psg=True, psg_relative=True, psg_tau=0))
    # tau = max >> 0: nothing is confident; tau = max >> 10: most is
    assert hi.counters["skip_psg"] == 0
    assert hi.counters["mac_weight_grad"] == 8 * (16 * 8 + 8 * 4)
    assert lo.counters["skip_psg"] > 0
    assert lo.counters["mac_weight_grad_low"] == 2 * 8 * (16 * 8 + 8 * 4)   # two passes


def test_sgd_update_matches_gradients_and_shift():
    layers = [12, 6, 3]
    rng = np.random.default_rng(9)
    x, y = random_batch(rng, layers, 5)
    m = make_model(layers)
    w0 = m.read_weights()
    grads, _ = golden.dense_gradients(w0, m.shifts, x, y)
    m.train_batch(x, y, StepSettings(update_mask=(False, True), lr_shift=9))
    assert np.array_equal(m.weights[1], golden.sgd_update(w0[1], grads[1], 9))
    assert np.array_equal(m.weights[0], w0[0])


def test_integer_gradients_agree_in_sign_with_float(digits):
    layers = [64, 32, 10]
    m = make_model(layers, seed=3)
    idx = np.arange(32)
    x, y = digits.x_train[idx], digits.y_train[idx]
    grads, _ = golden.dense_gradients(m.weights, m.shifts, x, y)
    net = FloatNet(layers, 0)
    net.weights = [w.astype(np.float32) / 2 ** 14 for w in m.weights]
    fgrads, _ = net.grads(digits.float_view(x), y)
    for g, f in zip(grads, fgrads):
        big = np.abs(f) > 1e-3 * np.abs(f).max()      # where the float sign is meaningful
        agree = (np.sign(g) == np.sign(f))[big].mean()
        assert agree > 0.95, agree


def test_training_is_deterministic_and_changes_weights():
    layers = [37, 19, 7]
    rng = np.random.default_rng(10)
    batches = [random_batch(rng, layers, 9) for _ in range(4)]
    runs = []
    for _ in range(2):
        m = make_model(layers)
        for x, y in batches:
            m.train_batch(x, y, StepSettings(zero_skip=True, keep_q8=100, psg=True,
                                             update_mask=(True, True)))
        runs.append((golden.weights_sha256(m.weights), m.counters))
    assert runs[0] == runs[1]
    assert runs[0][0] != golden.weights_sha256(make_model(layers).weights)


def test_bad_input_is_rejected_before_anything_changes():
    layers = [8, 4, 3]
    m = make_model(layers)
    w = m.read_weights()
    x = np.ones((2, 8), dtype=np.int64)
    with pytest.raises(ConfigError, match=r"shape \(2, 7\); expected \(B, 8\)"):
        m.train_batch(np.ones((2, 7), dtype=int), [0, 1])
    with pytest.raises(ConfigError, match="0..255"):
        m.train_batch(x * 256, [0, 1])
    with pytest.raises(ConfigError, match="0..255"):
        m.train_batch(x * np.nan, [0, 1])
    with pytest.raises(ConfigError, match="labels span 0..3; the output layer has 3"):
        m.train_batch(x, [0, 3])
    with pytest.raises(ConfigError, match="update_mask has 3 entries"):
        m.train_batch(x, [0, 1], StepSettings(update_mask=(True, True, True)))
    with pytest.raises(ConfigError, match="batch of 65 samples is outside 1..64"):
        m.train_batch(np.ones((65, 8), dtype=int), np.zeros(65, dtype=int))
    with pytest.raises(ConfigError, match=r"layer 1 weights have shape \(3, 3\)"):
        m.load_weights([w[0], np.zeros((3, 3), dtype=np.int16)])
    assert all(np.array_equal(a, b) for a, b in zip(w, m.weights))
    assert m.counters["batches"] == 0


def test_network_too_big_names_the_limit():
    with pytest.raises(ConfigError, match="width 1 of .* is 2000; build 'sim' holds at most 1024"):
        spec.check_network([64, 2000, 10])
    # engine v2: (1024 x 128 + 128 x 10) weights, 32 to a word
    with pytest.raises(ConfigError, match=r"needs 4136 weight words; build 'sim' holds 1024 "
                                          r"\(lanes=32\)"):
        spec.check_network([1024, 128, 10])
    # engine v1: 16 blocks x 1024 inputs + 2 blocks x 128 inputs
    with pytest.raises(ConfigError, match=r"needs 16640 weight words; build 'v1' holds 4096 "
                                          r"\(lanes=8\)"):
        spec.check_network([1024, 128, 10], spec.BUILDS["v1"])
    with pytest.raises(ConfigError, match="activation bytes"):
        spec.check_network([64, 64, 64, 10], spec.BUILDS["icebreaker"], batch=16)
