"""Engine v2 on the model backend (spec.BUILDS["sim"], dataflow "samples"): the host compiles
and writes the program, lays the weights and the batch out as v2's memories hold them, and the
virtual engine runs the program with the golden model. Same weights, predictions and correct
counts as v1 on every step setting; v2's own event counts (the reads); a program the host
would not have compiled is refused before anything changes."""

import numpy as np
import pytest

from ember import dataflow, golden, regmap, spec
from ember.device import ModelDevice
from ember.spec import ConfigError, StepSettings

V2 = spec.BUILDS["sim"]
V1 = spec.BUILDS["v1"]
LAYERS = [20, 12, 6]


def steps(rng, count):
    for _ in range(count):
        batch = int(rng.integers(1, 30))
        x = rng.integers(0, 256, (batch, LAYERS[0]))
        x[rng.random(x.shape) < 0.3] = 0
        y = rng.integers(0, LAYERS[-1], batch)
        st = StepSettings(
            update_mask=(tuple(bool(v) for v in rng.integers(0, 2, 2))
                         if rng.random() < 0.5 else None),
            zero_skip=bool(rng.integers(0, 2)), psg=bool(rng.integers(0, 2)),
            psg_relative=bool(rng.integers(0, 2)), psg_tau=int(rng.integers(0, 4)),
            keep_q8=int(rng.choice([256, 192, 128])), ssprop_random=bool(rng.integers(0, 2)),
            lfsr_seed=int(rng.integers(1, 1 << 16)), lr_shift=int(rng.integers(6, 12)))
        yield x, y, st


@pytest.mark.parametrize("seed", range(3))
def test_v2_trains_as_v1_and_counts_its_own_reads(seed):
    rng = np.random.default_rng(seed)
    weights = golden.init_weights(LAYERS, seed)
    devices = {"v1": ModelDevice(V1), "v2": ModelDevice(V2)}
    g = golden.GoldenModel(V2)
    g.configure(LAYERS)
    g.load_weights(weights)
    for dev in devices.values():
        dev.configure(LAYERS)
        dev.load_weights(weights)
        dev.clear_counters()
    for x, y, st in steps(rng, 6):
        correct = {name: dev.train_batch(x, y, st) for name, dev in devices.items()}
        assert correct["v1"] == correct["v2"] == g.train_batch(x, y, st)
    x = rng.integers(0, 256, (13, LAYERS[0]))
    assert (devices["v1"].infer(x) == devices["v2"].infer(x)).all()
    g.infer(x)
    for a, b in zip(devices["v1"].read_weights(), devices["v2"].read_weights()):
        assert (a == b).all()
    counts = devices["v2"].read_counters()
    assert {k: counts[k] for k in spec.EXACT_COUNTERS if not k.startswith("link_")} == \
        {k: g.counters[k] for k in spec.EXACT_COUNTERS if not k.startswith("link_")}
    assert counts["weight_reads"] < devices["v1"].read_counters()["weight_reads"]


def test_v2_identifies_its_dataflow_and_writes_the_program_once_per_batch_size():
    dev = ModelDevice(V2)
    assert dev.identify()["dataflow"] == "samples" and dev.build.dataflow == "samples"
    dev.configure(LAYERS)
    x, y = np.ones((8, LAYERS[0]), dtype=np.int64), np.zeros(8, dtype=np.int64)
    sent = []
    write = dev.link.write_words
    dev.link.write_words = lambda addr, words: (sent.append(addr), write(addr, words))
    for _ in range(3):
        dev.train_batch(x, y)
    base, words = spec.ADDRESS_MAP["program"]
    writes = lambda: sum(base <= a < base + words for a in sent)   # noqa: E731
    assert writes() == 1
    dev.infer(x)
    dev.train_batch(x[:5], y[:5])
    assert writes() == 3


def test_a_program_the_host_did_not_compile_is_refused_and_changes_nothing():
    dev = ModelDevice(V2)
    dev.configure(LAYERS)
    dev.load_weights(golden.init_weights(LAYERS, 1))
    batch = V2.lanes + 8
    x = np.full((batch, LAYERS[0]), 9, dtype=np.int64)
    y = np.arange(batch) % LAYERS[-1]
    dev.train_batch(x, y)
    before = dev.read_weights()
    # the program memory now holds the program for batch 4 (one sample block: it runs
    # batches up to P), the host still thinks batch P + 8
    words = dataflow.encode(dataflow.train_program(LAYERS, V2, 4, [spec.HIDDEN_SHIFT,
                                                                   spec.OUTPUT_SHIFT]), V2)
    for base, burst in regmap.program_writes(words):
        dev.link.write_words(base, burst)
    with pytest.raises(ConfigError, match="program: engine v2: the program memory holds a "
                                          "program the engine will not run"):
        dev.train_batch(x, y)
    for a, b in zip(before, dev.read_weights()):
        assert (a == b).all()


def test_a_v2_run_killed_mid_epoch_resumes_to_the_same_result(tmp_path, monkeypatch, capsys):
    """Checkpoints and resume on v2 (the program is written again by the fresh device, as it
    is at every epoch's first batch after the evaluation's infer program)."""
    from ember import cli, trainer
    from test_checkpoint import RUN, KilledDevice, batches_sent, run_cli, without_wall
    run = (*RUN, "--build", "sim")
    straight = run_cli(tmp_path, *run, name="straight.json")
    ckpt = tmp_path / "run.ckpt"
    kill_at = batches_sent(straight, 2) + 5
    monkeypatch.setattr(cli, "open_device",
                        lambda *a, **k: KilledDevice(ModelDevice(V2), kill_at))
    assert cli.main(["train", "--quiet", *run, "--checkpoint", str(ckpt)]) == 130
    assert trainer.load_checkpoint(ckpt)["epoch"] == 2
    monkeypatch.undo()
    resumed = run_cli(tmp_path, *run, "--checkpoint", str(ckpt), "--resume", str(ckpt),
                      name="resumed.json")
    assert without_wall(resumed) == without_wall(straight)
    assert resumed["build"]["build"] == "sim" and resumed["build"]["dataflow"] == "samples"
