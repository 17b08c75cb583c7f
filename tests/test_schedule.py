"""An epoch's schedule (ember.schedule): the keyed sample order, the per-batch words the device
walks, and the draw from the run's streams that streaming and resident training share."""

import numpy as np
import pytest

from ember import schedule
from ember.policies import (STREAM_LFSR, STREAM_SHUFFLE, STREAM_SMD, LayerMaskPolicy,
                            epoch_settings, make_config, rng)
from ember.schedule import (ORDER_MAX_SAMPLES, EpochSchedule, draw_epoch, epoch_order,
                            order_half_bits, order_steps)
from ember.spec import ConfigError


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 15, 16, 17, 255, 256, 257, 1438, 4097])
def test_epoch_order_is_a_permutation_of_every_sample(n):
    keys = np.random.default_rng(n).integers(0, 1 << 32, 20)
    for key in list(keys) + [0, (1 << 32) - 1]:
        order = epoch_order(int(key), n)
        assert order.dtype == np.int64
        assert np.array_equal(np.sort(order), np.arange(n))


def test_epoch_orders_differ_by_key_and_look_shuffled():
    n = 1438
    keys = np.random.default_rng(7).integers(0, 1 << 32, 50)
    orders = [epoch_order(int(k), n) for k in keys]
    assert len({o.tobytes() for o in orders}) == 50
    # no order keeps the samples near where they were, nor follows another one
    for a, b in zip(orders, orders[1:]):
        assert abs(np.corrcoef(a, np.arange(n))[0, 1]) < 0.1
        assert abs(np.corrcoef(a, b)[0, 1]) < 0.1
    # where sample 0 lands is spread over the epoch
    first = [int(np.flatnonzero(o == 0)[0]) for o in orders]
    assert min(first) < n // 4 and max(first) > 3 * n // 4


def test_order_sizes_and_limits():
    assert order_half_bits(1) == 1 and order_half_bits(4) == 1 and order_half_bits(5) == 2
    assert order_half_bits(1438) == 6 and order_steps(1438) == 4096
    for n in range(1, 5000):
        assert n <= order_steps(n) < 4 * n or n == order_steps(n) // 4 == 1
    with pytest.raises(ConfigError, match="1..65536 samples; got 0"):
        epoch_order(1, 0)
    with pytest.raises(ConfigError, match=f"got {ORDER_MAX_SAMPLES + 1}"):
        order_half_bits(ORDER_MAX_SAMPLES + 1)
    with pytest.raises(ConfigError, match="order key 4294967296 is outside"):
        epoch_order(1 << 32, 10)


def _streams(cfg):
    return (rng(cfg.seed, STREAM_SHUFFLE), rng(cfg.seed, STREAM_SMD),
            LayerMaskPolicy(cfg, len(cfg.layers) - 1), rng(cfg.seed, STREAM_LFSR))


def test_draw_epoch_draws_what_batch_by_batch_training_would():
    """The streams advance exactly as a batch-by-batch draw (a mask and a seed only for a
    kept batch), so a schedule drawn whole trains as the streaming loop did."""
    cfg = make_config("all", seed=3, layers=(64, 32, 10), batch_size=16)
    n = 200
    shuffle, smd, slu, lfsr = _streams(cfg)
    sched = draw_epoch(cfg, epoch_settings(cfg, 0), n, shuffle, smd, slu, lfsr)
    shuffle2, smd2, slu2, lfsr2 = _streams(cfg)
    assert sched.key == int(shuffle2.integers(0, 1 << 32))
    expect = []
    for _ in range(0, n, cfg.batch_size):
        if smd2.random() < cfg.smd:
            expect.append((True, None, 0))
        else:
            expect.append((False, slu2.next_mask(), int(lfsr2.integers(1, 1 << 16))))
    assert list(zip(sched.drops, sched.masks, sched.seeds)) == expect
    assert 0 < sum(sched.drops) < len(expect)
    # and the streams stand where the batch-by-batch draw left them
    assert smd.random() == smd2.random() and slu.next_mask() == slu2.next_mask()
    # the batches: the order cut in batch_size pieces, the last one short
    batches = list(sched.batches())
    assert [len(i) for i, _, _ in batches] == sched.batch_sizes() == [16] * 12 + [8]
    assert np.array_equal(np.concatenate([i for i, _, _ in batches]),
                          epoch_order(sched.key, n))
    for (idx, drop, settings), (d, mask, seed) in zip(batches, expect):
        assert drop == d
        if not drop:
            assert settings.update_mask == mask and settings.lfsr_seed == seed
            assert settings.keep_q8 == sched.settings.keep_q8


def test_schedule_words_round_trip():
    cfg = make_config("all", seed=5, layers=(64, 32, 16, 10), batch_size=8)
    sched = draw_epoch(cfg, epoch_settings(cfg, 2), 100, *_streams(cfg))
    words = sched.words()
    assert len(words) == 13 and all(0 <= w < 1 << 32 for w in words)
    for w, drop, mask, seed in zip(words, sched.drops, sched.masks, sched.seeds):
        assert (w >> schedule.SCHEDULE_DROP_BIT) == drop
        if not drop:
            assert w & 0xFFFF == seed and seed != 0
            assert (w >> schedule.SCHEDULE_MASK_LSB) & 0b111 == sum(
                1 << l for l, on in enumerate(mask) if on)
    back = EpochSchedule.from_words(words, sched.key, 100, 8, sched.settings, 3)
    assert back == sched
