"""The arithmetic of a fleet without Ray: data splits, combining rules, rounds of one device."""

import numpy as np
import pytest

from ember import federated, golden, policies, spec
from ember.device import ModelDevice
from ember.federated import LocalRun, average_weights, sign_vote, split_shards
from ember.spec import ConfigError
from ember.trainer import Trainer


def test_iid_shards_partition_the_training_set(digits):
    y = digits.y_train
    shards = split_shards(y, 4, "iid", seed=3)
    together = np.concatenate(shards)
    assert sorted(together.tolist()) == list(range(len(y)))     # every sample exactly once
    assert all(np.all(np.diff(s) > 0) for s in shards)           # in the data set's order
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    assert [s.tolist() for s in split_shards(y, 4, "iid", seed=3)] == \
        [s.tolist() for s in shards]
    assert [s.tolist() for s in split_shards(y, 4, "iid", seed=4)] != \
        [s.tolist() for s in shards]
    assert split_shards(y, 1, "dirichlet", alpha=0.1)[0].tolist() == list(range(len(y)))


def _skew(y, shards, classes):
    """Mean over devices of the largest class's share of the device's samples."""
    counts = federated.label_counts(y, shards, classes)
    return float((counts.max(axis=1) / counts.sum(axis=1)).mean())


def test_dirichlet_shards_are_label_skewed(digits):
    y = digits.y_train
    iid = split_shards(y, 4, "iid", seed=0)
    skewed = split_shards(y, 4, "dirichlet", alpha=0.1, seed=0)
    mild = split_shards(y, 4, "dirichlet", alpha=100.0, seed=0)
    assert sorted(np.concatenate(skewed).tolist()) == list(range(len(y)))
    assert _skew(y, skewed, 10) > 0.4 > 0.15 > _skew(y, iid, 10)
    assert abs(_skew(y, mild, 10) - _skew(y, iid, 10)) < 0.05


@pytest.mark.parametrize("args, message", [
    ((0, "iid"), "at least 1 device"),
    ((5000, "iid"), "5000 devices for 1438 training samples"),
    ((2, "shuffled"), "split 'shuffled' is not one of iid, dirichlet"),
    ((2, "dirichlet", 0.0), "Dirichlet alpha 0.0 must be a positive number"),
    ((200, "dirichlet", 0.01), "without a sample"),
])
def test_split_errors_name_the_value(digits, args, message):
    with pytest.raises(ConfigError, match=message):
        split_shards(digits.y_train, *args)


def w(*rows):
    return [np.array(rows, dtype=np.int16)]


def test_average_rounds_to_nearest_ties_away_from_zero():
    # (3 + 4) / 2 = 3.5 -> 4; (-3 - 4) / 2 = -3.5 -> -4; (1 + 2 + 2) / 3 = 1.67 -> 2
    assert average_weights([w([3, -3]), w([4, -4])], [1, 1])[0].tolist() == [[4, -4]]
    assert average_weights([w([1]), w([2]), w([2])], [1, 1, 1])[0].tolist() == [[2]]
    assert average_weights([w([-1]), w([-2]), w([-2])], [1, 1, 1])[0].tolist() == [[-2]]
    # weighted by shard sizes: (3 * 10 + 1 * 0) / 4 = 7.5 -> 8
    assert average_weights([w([10]), w([0])], [3, 1])[0].tolist() == [[8]]
    extreme = average_weights([w([32767, -32768]), w([32767, -32768])], [5, 7])[0]
    assert extreme.dtype == np.int16 and extreme.tolist() == [[32767, -32768]]
    with pytest.raises(ConfigError, match=r"sample counts \[1, 0\]"):
        average_weights([w([1]), w([2])], [1, 0])


def test_sign_vote_moves_by_the_majority():
    prev = w([100, 100, 100, 100, 32760])
    devices = [w([110, 90, 100, 104, 32767]),      # +10, -10, 0, +4, +7
               w([103, 95, 100, 101, 32767]),      # +3,  -5,  0, +1, +7
               w([90, 105, 100, 100, 32767])]      # -10, +5,  0,  0, +7
    # weight 0: 2 up (10, 3) 1 down -> +round(6.5) = +7; weight 1: 2 down (10, 5) -> -8;
    # weight 2: nobody moved; weight 3: 2 up (4, 1), one unchanged -> +round(2.5) = +3;
    # weight 4: +7 saturates at 32767
    assert sign_vote(prev, devices)[0].tolist() == [[107, 92, 100, 103, 32767]]
    # a tie keeps the weight
    assert sign_vote(w([0]), [w([5]), w([-5])])[0].tolist() == [[0]]
    # one device: its weights, whichever rule
    one = [golden.init_weights([8, 4, 3], 1)]
    prev = golden.init_weights([8, 4, 3], 2)
    for kind in federated.COMBINES:
        out = federated.combine(kind, prev, one, [17])
        assert golden.weights_sha256(out) == golden.weights_sha256(one[0])


def local_run(ds, device_index, rounds, **settings):
    cfg = policies.make_config("all", ssprop_variant="random", **settings)
    trainer = Trainer(ModelDevice(), ds, cfg, progress=False)
    return LocalRun(trainer, device_index, rounds), trainer


def test_rounds_cut_the_batch_stream(digits):
    run, _ = local_run(digits, 0, 7, epochs=3)
    bounds = [run.round_batches(r) for r in range(7)]
    assert bounds[0][0] == 0 and bounds[-1][1] == run.total_batches == 3 * 45
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert {b - a for a, b in bounds} <= {19, 20}
    with pytest.raises(ConfigError, match="round 7 is outside 0..6"):
        run.round_batches(7)
    with pytest.raises(ConfigError, match="1000 rounds for device 0"):
        local_run(digits, 0, 1000, epochs=3)


def test_skipped_round_leaves_the_stream_where_training_would(digits):
    trained, trainer = local_run(digits, 2, 4, epochs=2)
    skipped, _ = local_run(digits, 2, 4, epochs=2)
    dev = trainer.device
    dev.configure(trainer.layers)
    dev.load_weights(golden.init_weights(trainer.layers, 0))
    trained.train_round(dev, 0)
    trained.train_round(dev, 1)
    skipped.skip_round(0)
    skipped.skip_round(1)
    a, b = trained.state(), skipped.state()
    assert a == b and a["position"] == trained.round_batches(2)[0]
    # device 2's streams are its own: device 0 of the same run draws others
    zero, _ = local_run(digits, 0, 4, epochs=2)
    zero.skip_round(0)
    zero.skip_round(1)
    assert zero.state()["smd"] != a["smd"] and zero.state()["order"] != a["order"]
    with pytest.raises(ConfigError, match="stands at batch"):
        skipped.skip_round(3)


def test_the_spec_is_the_only_source_of_the_int16_range():
    assert golden.saturate(np.array([40000]), spec.WEIGHT_BITS).tolist() == [32767]
