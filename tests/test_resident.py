"""Resident data (docs/protocol.md section 11) on the model backend: the splits uploaded once,
an epoch in one command, evaluation on the device; the same weights and event counters as
streaming, far fewer link bytes; and the refusals before anything changes."""

import dataclasses

import numpy as np
import pytest

from ember import data, golden, regmap, spec
from ember.device import ModelDevice, open_device
from ember.policies import make_config
from ember.protocol import LinkError
from ember.schedule import EpochSchedule
from ember.spec import ConfigError, StepSettings
from ember.trainer import Trainer, load_checkpoint, resident_plan
from ember_sim import rtl

#: the sim build: its resident data memory holds the digits (1,797 samples x 64 bytes)
RESIDENT = spec.BUILDS["sim"]
#: a build without the unit
PLAIN = spec.BUILDS["v1"]
LINK = ("link_rx_bytes", "link_tx_bytes")
#: the counters of how the samples reach the engine: the link, and in resident mode the
#: gather's data-memory words (none when streaming); every other counter is the same
DELIVERY = LINK + ("data_reads",)


@pytest.fixture(scope="module")
def digits():
    return data.load_digits()


def _train(ds, resident, preset="all", epochs=3, build=RESIDENT, **kw):
    cfg = make_config(preset, epochs=epochs, seed=2, **kw)
    with ModelDevice(build) as dev:
        t = Trainer(dev, ds, cfg, progress=False, resident=resident)
        return t.run()


def _without_delivery(counters):
    return {k: v for k, v in counters.items() if k not in DELIVERY}


def _without_energy(history):
    """A run's epochs without their energy: a resident epoch also reads the data memory, and
    so does its dense baseline."""
    return [{k: v for k, v in h.items() if k not in ("energy_pj", "dense_energy_pj", "saved_fraction")}
            for h in history]


@pytest.mark.parametrize("preset", ["all", "baseline"])
def test_resident_epochs_train_as_streaming_does(digits, preset):
    resident, streaming = _train(digits, "on", preset), _train(digits, "off", preset)
    assert resident["resident"]["train"] and resident["resident"]["test"]
    assert resident["resident"]["upload_link_bytes"] > 1797 * 64
    assert streaming["resident"] == {"train": False, "test": False, "upload_link_bytes": 0}
    assert resident["weights_sha256"] == streaming["weights_sha256"]
    assert _without_delivery(resident["counters"]) == _without_delivery(streaming["counters"])
    assert (_without_delivery(resident["eval_counters"])
            == _without_delivery(streaming["eval_counters"]))
    assert _without_energy(resident["history"]) == _without_energy(streaming["history"])
    assert resident["counters"]["mac_forward"] > 0
    # the gather reads each kept training sample's 16 words (64 inputs) and each test
    # sample's; streaming reads none, and its energy is the rest of the resident run's
    words = spec.sample_data_bytes(64) // spec.DATA_WORD_BYTES
    assert resident["counters"]["data_reads"] == words * resident["counters"]["samples"]
    assert (resident["eval_counters"]["data_reads"]
            == words * resident["eval_counters"]["infer_samples"])
    assert streaming["counters"]["data_reads"] == streaming["eval_counters"]["data_reads"] == 0
    assert resident["energy_pj"] > streaming["energy_pj"]
    # the dense baseline reads every sample of every batch, dropped or not, as a resident
    # run without SMD would: 16 words a sample, 3 epochs of the 1,438 training samples
    per_word = ((resident["energy_pj"] - streaming["energy_pj"])
                / resident["counters"]["data_reads"])
    assert per_word > 0
    assert resident["dense_energy_pj"] - streaming["dense_energy_pj"] == pytest.approx(
        words * 1438 * 3 * per_word)
    # an epoch's command and its schedule against every batch sent: issue 16's aim, at most
    # 1 % of streaming's link bytes (the test split is evaluated on the device too)
    link = [sum(r["counters"][k] + r["eval_counters"][k] for k in LINK)
            for r in (resident, streaming)]
    assert link[0] <= 0.01 * link[1]


def test_auto_streams_on_a_build_without_the_unit_and_keeps_what_fits(digits):
    layers = [64, 32, 10]
    assert resident_plan("auto", digits, layers, PLAIN) == (False, False)
    assert resident_plan("auto", digits, layers, RESIDENT) == (True, True)
    train_only = dataclasses.replace(RESIDENT, data_bytes=1500 * 64)
    assert resident_plan("auto", digits, layers, train_only) == (True, False)
    assert resident_plan("on", digits, layers, train_only) == (True, False)
    small = dataclasses.replace(RESIDENT, data_samples=1000)
    assert resident_plan("auto", digits, layers, small) == (False, False)
    with pytest.raises(ConfigError, match=r"needs 92,032 bytes and 1,438 labels .* holds "
                                          r"131,072 bytes and 1,000 labels"):
        resident_plan("on", digits, layers, small)
    with pytest.raises(ConfigError, match="build 'v1' has no resident data memory"):
        resident_plan("on", digits, layers, PLAIN)
    # the training split alone resident, the test split streamed: still the same run
    r = _train(digits, "auto", epochs=2, build=train_only)
    s = _train(digits, "off", epochs=2)
    assert r["resident"]["train"] and not r["resident"]["test"]
    assert r["weights_sha256"] == s["weights_sha256"]
    assert _without_energy(r["history"]) == _without_energy(s["history"])


class KilledInEpoch:
    """A device whose train_epoch raises KeyboardInterrupt on its call `kill_at` (0-based)."""

    def __init__(self, device, kill_at):
        self.device, self.kill_at, self.calls = device, kill_at, 0

    def __getattr__(self, name):
        return getattr(self.device, name)

    def train_epoch(self, schedule, next_schedule=None):
        if self.calls == self.kill_at:
            raise KeyboardInterrupt
        self.calls += 1
        return self.device.train_epoch(schedule, next_schedule)


def test_a_resumed_resident_run_ends_as_one_straight_through(digits, tmp_path):
    cfg = make_config("all", epochs=3, seed=4)
    path = str(tmp_path / "run.ckpt")
    with ModelDevice(RESIDENT) as dev:
        straight = Trainer(dev, digits, cfg, progress=False, resident="on").run()
    with ModelDevice(RESIDENT) as dev:
        with pytest.raises(KeyboardInterrupt):
            Trainer(KilledInEpoch(dev, 2), digits, cfg, progress=False, resident="on",
                    checkpoint=path).run()
    ckpt = load_checkpoint(path)
    assert ckpt["epoch"] == 2
    with ModelDevice(RESIDENT) as dev:
        written = _count_schedule_writes(dev)
        resumed = Trainer(dev, digits, cfg, progress=False, resident="on", resume=ckpt).run()
    assert resumed["weights_sha256"] == straight["weights_sha256"]
    # the killed run's epoch 2 sent epoch 3's schedule while it ran (Device.train_epoch's
    # next_schedule); the resumed run's device gets it with the upload (preload_schedule),
    # its bytes not counted, so the runs' counters, link bytes included, are the same
    assert [overlapped for overlapped, _, _ in written] == [False]
    assert resumed["counters"] == straight["counters"]
    assert resumed["eval_counters"] == straight["eval_counters"]
    assert resumed["history"] == straight["history"]


def _count_schedule_writes(dev):
    """Record each schedule write of `dev` as (overlapped, bytes the host sent, bytes it
    received)."""
    written, write = [], dev._write_schedule

    def counting(half, words, overlapped=False):
        link = dev.link
        tx, rx = link.tx_bytes, link.rx_bytes
        write(half, words, overlapped)
        written.append((overlapped, link.tx_bytes - tx, link.rx_bytes - rx))

    dev._write_schedule = counting
    return written


def _device(layers=(64, 32, 10), build=RESIDENT):
    dev = ModelDevice(build)
    dev.configure(list(layers))
    dev.load_weights(golden.init_weights(list(layers), [1, 4]))
    return dev


def _schedule(n, batch=16, layers=2, key=0x1234):
    batches = -(-n // batch)
    return EpochSchedule(key, n, batch, StepSettings(update_mask=(True,) * layers),
                         (False,) * batches, ((True,) * layers,) * batches, (7,) * batches)


def test_bad_resident_input_is_refused_before_anything_changes(digits):
    dev = _device()
    weights = dev.read_weights()
    x, y = digits.x_train, digits.y_train
    with pytest.raises(ConfigError, match=r"the splits need 131,136 bytes and 2,049 labels "
                                          r"\(1,438 training \+ 611 test samples x 64 bytes, the inputs padded "
                                          r"to a word\); "
                                          r"build 'sim' holds 131,072 bytes"):
        dev.load_data(x, y, np.concatenate([digits.x_test] * 2)[:611],
                      np.concatenate([digits.y_test] * 2)[:611])
    with pytest.raises(ConfigError, match=r"training split has shape \(1438, 63\)"):
        dev.load_data(x[:, :63], y)
    with pytest.raises(ConfigError, match="labels span 0..10; the output layer has 10"):
        dev.load_data(x, np.where(y == 9, 10, y))
    with pytest.raises(ConfigError, match=r"inputs must be integers in 0..255"):
        dev.load_data(x.astype(float) + np.nan, y)
    with pytest.raises(ConfigError, match="no resident training split is loaded"):
        dev.train_epoch(_schedule(len(x)))
    with pytest.raises(ConfigError, match="no resident test split is loaded"):
        dev.evaluate_resident()
    dev.load_data(x, y)
    with pytest.raises(ConfigError, match="the schedule covers 100 samples; the resident "
                                          "training split holds 1438"):
        dev.train_epoch(_schedule(100))
    with pytest.raises(ConfigError, match="no resident test split is loaded"):
        dev.evaluate_resident()
    assert [np.array_equal(a, b) for a, b in zip(dev.read_weights(), weights)] == [True, True]
    # a build without the unit
    plain = _device(build=PLAIN)
    with pytest.raises(ConfigError, match="build 'v1' has no resident data memory"):
        plain.load_data(x, y)


def test_the_device_refuses_what_a_hostile_host_sends(digits):
    """Raw frames, past the host's checks: the device checks them again."""
    dev = _device()
    link, weights = dev.link, dev.read_weights()

    def refused_check():
        return list(spec.COMMAND_CHECKS)[link.read_words(regmap.reg("rejected"), 1)[0] - 1]

    # an epoch with no data loaded
    with pytest.raises(LinkError, match="bad_value"):
        link.write_words(regmap.reg("control"), [spec.CONTROL_EPOCH])
    assert refused_check() == "data"
    # more samples than the data memory holds at this input width (2,048 x 65 > 131,072)
    link.write_words(regmap.layer_field(0, "inputs"), [65])
    link.write_words(regmap.reg("train_samples"), [2048])
    with pytest.raises(LinkError, match="bad_value"):
        link.write_words(regmap.reg("control"), [spec.CONTROL_EPOCH])
    assert refused_check() == "data"
    # a register past its range, a label the network cannot output, a word past a region
    with pytest.raises(LinkError, match="bad_value"):
        link.write_words(regmap.reg("train_samples"), [2049])
    with pytest.raises(LinkError, match="bad_value"):
        link.write_words(regmap.region("data_labels"), [3 | 10 << 16])
    with pytest.raises(LinkError, match="out_of_range"):
        link.write_words(regmap.region("data") + (1 << 15), [0])
    with pytest.raises(LinkError, match="bad_value"):
        link.read_words(regmap.region("data"), 1)
    link.write_words(regmap.layer_field(0, "inputs"), [64])
    assert [np.array_equal(a, b) for a, b in zip(dev.read_weights(), weights)] == [True, True]
    # a class count that changes unloads the splits: their labels were checked for 10
    dev.load_data(digits.x_train, digits.y_train, digits.x_test, digits.y_test)
    assert link.read_words(regmap.reg("test_samples"), 1)[0] == len(digits.x_test)
    link.write_words(regmap.layer_field(1, "outputs"), [12])
    assert link.read_words(regmap.reg("train_samples"), 1)[0] == 0
    assert link.read_words(regmap.reg("test_samples"), 1)[0] == 0
    link.write_words(regmap.layer_field(1, "outputs"), [10])
    with pytest.raises(LinkError, match="bad_value"):
        link.write_words(regmap.reg("control"), [spec.CONTROL_EVALUATE])
    assert refused_check() == "data"


def test_a_schedule_word_the_host_would_never_send_still_runs_defined(digits):
    """A kept batch with LFSR seed 0 runs as seed 1, and mask bits above the layer count are
    ignored: the device never trusts the schedule to be one the host drew."""
    dev = _device()
    dev.load_data(digits.x_train[:64], digits.y_train[:64])
    sched = _schedule(64, layers=2)
    dev.train_epoch(sched)
    expect = golden.weights_sha256(dev.read_weights())
    dev2 = _device()
    dev2.load_data(digits.x_train[:64], digits.y_train[:64])
    dev2.train_epoch(sched)                # writes the descriptors, settings and schedule
    dev2.load_weights(golden.init_weights([64, 32, 10], [1, 4]))
    words = [(1 << 20) | 0b11 << spec.SCHEDULE_MASK_LSB | 1] * 4
    dev2.link.write_words(regmap.region("schedule"), words)
    dev2.link.write_words(regmap.reg("control"), [spec.CONTROL_EPOCH])
    with_seed_1 = golden.weights_sha256(dev2.read_weights())
    dev3 = _device()
    dev3.load_data(digits.x_train[:64], digits.y_train[:64])
    dev3.train_epoch(dataclasses.replace(sched, seeds=(1,) * 4))
    assert with_seed_1 == golden.weights_sha256(dev3.read_weights())
    assert with_seed_1 != golden.weights_sha256(_device().read_weights())
    assert expect != golden.weights_sha256(_device().read_weights())


def test_the_build_description_reads_the_data_memory():
    dev = _device()
    info = dev.identify()
    assert info["data_bytes"] == 1 << 17 and info["data_samples"] == 2048
    assert "resident" in info["features"]
    assert spec.read_only_values(PLAIN)["data_bytes"] == 0
    assert [name for name, b in spec.BUILDS.items() if "resident" in b.features] == \
        ["sim", "ulx3s"]
    with pytest.raises(ConfigError, match="resident data needs engine v2"):
        dataclasses.replace(spec.BUILDS["v1"], features=spec.FEATURES, data_bytes=1,
                            data_samples=1)


def test_the_cli_refuses_resident_on_where_it_cannot_run(capsys):
    from ember import cli
    for args in (["--resident", "on", "--epochs", "1", "--build", "v1"],
                 ["--resident", "on", "--boards", "2", "--epochs", "1"]):
        assert cli.main(["train", "--backend", "model", "--quiet", *args]) == 2
    err = capsys.readouterr().err
    assert "--resident on: build 'v1' has no resident data memory" in err
    assert "a fleet (--boards, --ports) streams its batches" in err


@pytest.mark.parametrize("simulator", rtl.simulator_params())
def test_resident_epochs_on_the_simulated_board_equal_the_model(tmp_path, simulator):
    """The resident data unit's gateware (ember_hw.epoch in ember_hw.sample_core) on the
    simulated board: resident epochs with every method, evaluated on the device, end with
    the model backend's weights, history and exact counters (link bytes included), and with
    streaming's but for the link. A data set whose splits and batch leave short batches
    with fewer sample blocks than the programs were compiled for (72 training samples at
    batch 20: a last batch of 12; 18 test samples in a program for max_batch)."""
    from test_system_rtl import _exact, _train_json
    rng = np.random.default_rng(16)
    x = rng.random((90, 20))
    x[x < 0.3] = 0
    path = tmp_path / "data.npz"
    np.savez(path, X=x, y=rng.integers(0, 5, 90))
    args = ("--preset", "all", "--epochs", "2", "--hidden", "12", "--batch-size", "20",
            "--dataset", str(path), "--seed", "4", "--ssprop-keep", "0.5",
            "--ssprop-warmup", "0")
    sim = _train_json(tmp_path, "sim", "--backend", "sim", "--simulator", simulator,
                      "--resident", "on", *args)
    model = _train_json(tmp_path, "model", "--backend", "model", "--resident", "on", *args)
    stream = _train_json(tmp_path, "stream", "--backend", "model", "--resident", "off", *args)
    assert sim["resident"]["train"] and sim["resident"]["test"]
    assert sim["weights_sha256"] == model["weights_sha256"] == stream["weights_sha256"]
    assert sim["history"] == model["history"]
    assert _without_energy(model["history"]) == _without_energy(stream["history"])
    for part in ("counters", "eval_counters"):
        assert _exact(sim[part]) == _exact(model[part])
        assert (_without_delivery(_exact(sim[part]))
                == _without_delivery(_exact(stream[part])))
    assert sim["counters"]["cycles"] > 0
    # 20 inputs: 5 data words a sample, each read once per epoch it is trained in
    assert sim["counters"]["data_reads"] == 5 * sim["counters"]["samples"] > 0


def _answers_into(out):
    """A function that makes a link call and appends its answer to `out`: ("ok", its result)
    or (the LinkError's status, None)."""
    def answer(call):
        try:
            out.append(("ok", call()))
        except LinkError as e:
            out.append((e.status, None))
    return answer


def _hostile_resident_session(dev):
    """Resident-data frames a host should never send, each answered (status and, for reads
    and REJECTED, the words), on a configured device: the answers in order."""
    link, reg, region = dev.link, regmap.reg, regmap.region
    b = dev.build
    out = []
    answer = _answers_into(out)

    def read(name):
        answer(lambda: link.read_words(reg(name), 1))

    dev.configure([20, 8, 5])
    answer(lambda: link.write_words(reg("control"), [spec.CONTROL_EPOCH]))     # no split
    read("rejected")
    answer(lambda: link.write_words(reg("control"), [spec.CONTROL_EVALUATE]))
    read("rejected")
    for name in ("data", "data_labels", "schedule"):                          # write only
        answer(lambda name=name: link.read_words(region(name), 1))
    answer(lambda: link.write_words(region("data") + (b.data_bytes + 3) // 4, [0]))
    answer(lambda: link.write_words(region("schedule") + b.data_samples, [0]))
    answer(lambda: link.write_words(region("data_labels"), [7 | 1 << 16]))    # 7 >= 5 classes
    answer(lambda: link.write_words(region("data_labels"), [4 | 3 << 16]))
    answer(lambda: link.write_words(reg("train_samples"), [b.data_samples + 1]))
    answer(lambda: link.write_words(reg("train_samples"), [10]))
    read("train_samples")
    answer(lambda: link.write_words(regmap.layer_field(0, "inputs"), [20]))   # the same width
    read("train_samples")
    answer(lambda: link.write_words(regmap.layer_field(0, "inputs"), [21]))   # another one
    read("train_samples")
    answer(lambda: link.write_words(reg("infer_program"), [b.program_words]))
    answer(lambda: link.write_words(reg("infer_program"), [b.program_words - 1]))
    read("infer_program")
    return out


@pytest.mark.parametrize("simulator", ["verilator"])
def test_the_simulated_board_refuses_hostile_resident_frames_as_the_model_does(simulator):
    """The resident unit's regions, registers and commands in the gateware (memory window,
    register bank) answer what a hostile host sends as the model does: EPOCH and EVALUATE
    without a split (REJECTED data), reads of the write-only regions, words past them, a
    label the network cannot output, a sample count past DATA_SAMPLES, the splits unloaded
    by a change of input width (and not by a rewrite of the same), INFER_PROGRAM's range."""
    with open_device("sim", build=RESIDENT, simulator=simulator) as sim:
        got = _hostile_resident_session(sim)
    want = _hostile_resident_session(ModelDevice(RESIDENT))
    assert got == want
    data_check = 1 + list(spec.COMMAND_CHECKS).index("data")
    assert want[:4] == [("bad_value", None), ("ok", [data_check])] * 2
    assert [s for s, _ in want[4:10]] == ["bad_value"] * 3 + ["out_of_range"] * 2 + \
        ["bad_value"]


def _schedule_halves_setup(dev):
    """64-32-10 with DATA_SAMPLES - 2 resident training samples on `dev`: (H, n)."""
    b, layers = dev.build, [64, 32, 10]
    H, n = spec.schedule_half_words(b), b.data_samples - 2
    rng = np.random.default_rng(12)
    dev.configure(layers)
    dev.load_weights(golden.init_weights(layers, 3))
    dev.load_data(rng.integers(0, 256, (n, 64)), rng.integers(0, 10, n))
    return H, n


def _frames_while_an_epoch_runs(dev, H):
    """An EPOCH posted (Link.post_write) and frames sent while it runs: a schedule word in
    the half it reads, in the other half and at the region's end, a data word, STATUS, then
    an abort. At batch 2 the epoch's 1,023 batches fit half 0; at batch 1 its 2,046 span
    both halves. The update mask is 0, so the weights stay as they were. The answers."""
    link, reg, region = dev.link, regmap.reg, regmap.region
    out = []
    answer = _answers_into(out)
    for batch in (2, 1):
        dev.prepare_epochs(batch)
        dev._write_runs(regmap.settings_writes(StepSettings(update_mask=(False, False)), 2)
                        + [(reg("epoch_key"), 9), (reg("schedule_half"), 0)])
        posted = link.post_write(reg("control"), spec.CONTROL_EPOCH)
        for offset in (0, H, dev.build.data_samples - 1):
            answer(lambda offset=offset: link.write_words(region("schedule") + offset, [0]))
        answer(lambda: link.write_words(region("data"), [0]))
        answer(lambda: link.read_words(reg("status"), 1))
        answer(lambda: link.write_words(reg("control"), [spec.CONTROL_ABORT]))
        with pytest.raises(LinkError) as stopped:
            link.await_write(posted)
        assert stopped.value.status == "aborted"
    dev._schedules = [None, None]       # (the words written above)
    return out


def _two_epochs(dev, n):
    """Two epochs, the second's schedule sent while the first runs: the correct counts, the
    weights and the link bytes sent while a command ran."""
    dev.prepare_epochs(64)
    first, second = (EpochSchedule(key, n, 64, StepSettings(update_mask=(True, True)),
                                   (False,) * 32, ((True, True),) * 32, tuple(range(s, s + 32)))
                     for key, s in ((3, 1), (4, 100)))
    return ([dev.train_epoch(first, next_schedule=second), dev.train_epoch(second)],
            dev.read_weights(), dev.overlapped_link_bytes)


@pytest.mark.parametrize("simulator", ["verilator"])
def test_the_next_schedule_goes_in_while_an_epoch_runs(simulator):
    """While an EPOCH runs on the simulated board, the schedule half it reads answers writes
    `busy` (both halves when its batches outnumber a half's words) and the other half takes
    them (spec.schedule_halves_in_use); an epoch whose schedule was sent during the one
    before trains as the model backend's (which has no clock: its commands have ended before
    the next frame, so it never answers busy)."""
    with open_device("sim", build=RESIDENT, simulator=simulator) as sim:
        H, n = _schedule_halves_setup(sim)
        answers = _frames_while_an_epoch_runs(sim, H)
        got = _two_epochs(sim, n)
    assert answers == [("busy", None), ("ok", None), ("ok", None), ("busy", None),
                       ("ok", [1]), ("ok", None),
                       ("busy", None), ("busy", None), ("busy", None), ("busy", None),
                       ("ok", [1]), ("ok", None)]
    assert spec.schedule_halves_in_use(RESIDENT, 2, n, 0) == {0}
    assert spec.schedule_halves_in_use(RESIDENT, 1, n, 0) == {0, 1}
    with ModelDevice(RESIDENT) as model:
        _schedule_halves_setup(model)
        want = _two_epochs(model, n)
    assert got[0] == want[0]
    for g, w in zip(got[1], want[1]):
        np.testing.assert_array_equal(g, w)
    assert got[2] == want[2] > 32 * 4
