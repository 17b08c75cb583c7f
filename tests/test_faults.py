"""Faults and bad input: a noisy link, damaged and repeated frames, refused settings, a
missing simulator. Each must end in the same result as a clean run or in a clear error that
changed nothing."""

import collections
import os
import subprocess

import numpy as np
import pytest

from ember import cli, golden, policies, protocol, regmap, spec
from ember.device import EngineDevice, ModelDevice, open_sim
from ember.protocol import Link
from ember.spec import ConfigError, StepSettings
from ember.trainer import Trainer
from ember.virtual import VirtualEngine, VirtualPort

LINK_COUNTERS = ("link_rx_bytes", "link_tx_bytes")


class NoisyPort:
    """A VirtualPort behind a bad wire. With a seeded RNG, each byte is dropped or has one bit
    flipped, with a probability per direction (responses are short, so theirs are higher);
    a request is sent twice (a duplicated frame) with probability `duplicate`. `faults`
    counts what was done."""

    def __init__(self, port, seed, flip=(3e-4, 6e-4), drop=(1e-4, 3e-4), duplicate=0.02):
        self.port, self.rng = port, np.random.default_rng(seed)
        self.flip = dict(zip(("request", "response"), flip))
        self.drop = dict(zip(("request", "response"), drop))
        self.duplicate = duplicate
        self.faults = collections.Counter()
        self.baudrate, self.timeout = port.baudrate, 0

    def _damage(self, data, direction):
        if not data:
            return data
        a = np.frombuffer(data, dtype=np.uint8).copy()
        flips = self.rng.random(len(a)) < self.flip[direction]
        a[flips] ^= (1 << self.rng.integers(0, 8, len(a))).astype(np.uint8)[flips]
        keep = self.rng.random(len(a)) >= self.drop[direction]
        self.faults[f"flip_{direction}"] += int(flips.sum())
        self.faults[f"drop_{direction}"] += int((~keep).sum())
        return a[keep].tobytes()

    def write(self, data):
        wire = self._damage(bytes(data), "request")
        if self.rng.random() < self.duplicate:
            self.faults["duplicate"] += 1
            self.port.write(wire)
        self.port.write(wire)
        return len(data)

    def read(self, n=1):
        return self._damage(self.port.read(n), "response")

    @property
    def in_waiting(self):
        return self.port.in_waiting

    def reset_input_buffer(self):
        self.port.reset_input_buffer()

    def close(self):
        pass


def without_link(counters):
    return {k: v for k, v in counters.items() if k not in LINK_COUNTERS}


def test_training_over_a_noisy_link_ends_like_a_clean_run(digits):
    cfg = policies.make_config("all", ssprop_variant="random", epochs=2, seed=2)
    # streamed, so that many frames cross the noisy link
    clean = Trainer(ModelDevice(), digits, cfg, progress=False, resident="off").run()
    port = NoisyPort(VirtualPort(VirtualEngine(spec.DEFAULT_BUILD)), seed=11)
    # the virtual engine answers at once: a frame not answered by now never will be
    link = Link(port, retries=20, timeout=0.02)
    dev = EngineDevice(link, "model")
    dev.command_timeout = 0.02
    noisy = Trainer(dev, digits, cfg, progress=False, resident="off").run()
    for kind in ("flip_request", "flip_response", "drop_request", "drop_response",
                 "duplicate"):
        assert port.faults[kind] >= 2, port.faults
    assert link.retransmissions >= 10
    assert noisy["weights_sha256"] == clean["weights_sha256"]
    assert without_link(noisy["counters"]) == without_link(clean["counters"])
    assert without_link(noisy["eval_counters"]) == without_link(clean["eval_counters"])
    assert [h["test_accuracy"] for h in noisy["history"]] == \
        [h["test_accuracy"] for h in clean["history"]]
    # retransmitted frames are counted where they crossed
    assert noisy["counters"]["link_rx_bytes"] > clean["counters"]["link_rx_bytes"]


def device_state(dev):
    """Weights, every readable register and layer descriptor, and the counters but the link
    bytes, read over the link."""
    read = lambda addr: dev.link.read_words(addr, 1)[0]
    regs = {name: read(regmap.reg(name)) for name, (_, mode) in spec.REGISTERS.items()
            if mode != "wo"}
    layers = [[read(regmap.layer_field(l, f)) for f in spec.LAYER_FIELDS]
              for l in range(len(dev.layers) - 1)]
    return {"weights": [w.tolist() for w in dev.read_weights()], "regs": regs,
            "layers": layers, "counters": without_link(dev.read_counters())}


def trained_device(digits):
    """A model device after one training batch, so registers and memories hold a batch."""
    dev = ModelDevice()
    layers = [64, 32, 10]
    dev.configure(layers)
    dev.load_weights(golden.init_weights(layers, 1))
    dev.train_batch(digits.x_train[:16], digits.y_train[:16])
    return dev


def exchange(dev, wire):
    """Put raw bytes on the device's wire; the decoded responses."""
    port = dev.link.port
    port.reset_input_buffer()
    port.write(wire)
    decoder = protocol.SlipDecoder()
    return [protocol.decode_response(p) for p in decoder.feed(port.read(port.in_waiting))]


def request_payload(seq, addr, words):
    return protocol.seal(bytes([spec.LINK_COMMANDS["write"], seq])
                         + addr.to_bytes(protocol.ADDR_BYTES, "little")
                         + len(words).to_bytes(protocol.COUNT_BYTES, "little")
                         + b"".join(w.to_bytes(protocol.WORD_BYTES, "little") for w in words))


def test_damaged_requests_are_refused_and_change_nothing(digits):
    dev = trained_device(digits)
    before = device_state(dev)
    weights = regmap.region("weights")
    train = request_payload(0x31, regmap.reg("control"), [spec.CONTROL_TRAIN])
    overwrite = request_payload(0x32, weights, [0x7FFF7FFF] * 8)
    flipped = bytearray(overwrite)
    flipped[protocol.REQUEST_HEADER_BYTES + 1] ^= 0x10
    flipped_train = bytearray(train)
    flipped_train[protocol.REQUEST_HEADER_BYTES] ^= 0x02      # TRAIN became TRAIN|INFER
    header_says_9 = bytearray(request_payload(0x33, weights, [0x7FFF7FFF] * 9))
    cases = [
        (flipped, "bad_crc", 0x32),
        (flipped_train, "bad_crc", 0x31),
        (overwrite[:-1], "bad_length", 0x32),                  # one byte lost
        (header_says_9[:-6] + header_says_9[-2:], "bad_length", 0x33),   # a word lost
        (train[:3], "bad_length", 0x31),                       # cut inside the header
    ]
    for payload, status, seq in cases:
        responses = exchange(dev, protocol.slip_encode(payload))
        assert [(r.status, r.seq, r.addr) for r in responses] == [(status, seq, 0)], status
        assert device_state(dev) == before, status


def test_a_duplicated_request_frame_executes_once(digits):
    """Two copies of a TRAIN command frame on the wire (a host that resent it): the second is
    answered `duplicate` and not executed."""
    once, twice = trained_device(digits), trained_device(digits)
    before = device_state(once)
    train = protocol.slip_encode(request_payload(0x44, regmap.reg("control"),
                                                 [spec.CONTROL_TRAIN]))
    assert [r.status for r in exchange(once, train)] == ["ok"]
    assert [(r.status, r.seq) for r in exchange(twice, train + train)] == \
        [("ok", 0x44), ("duplicate", 0x44)]
    after = device_state(once)
    assert after["counters"]["batches"] == before["counters"]["batches"] + 1
    assert after["weights"] != before["weights"]
    assert device_state(twice) == after


def run_cli(*args):
    return cli.main(["train", "--quiet", "--epochs", "1", *args])


def test_unknown_port_is_named(tmp_path, capsys):
    out = tmp_path / "out.json"
    assert run_cli("--backend", "board", "--port", "/dev/does-not-exist", "--json", str(out)) == 2
    err = capsys.readouterr().err
    assert "cannot open port '/dev/does-not-exist'" in err, err
    assert not out.exists()


def test_board_backend_needs_a_port(capsys):
    assert run_cli("--backend", "board") == 2
    assert "the board backend needs a port: --port" in capsys.readouterr().err


def test_network_too_big_for_the_build(tmp_path, capsys):
    ckpt = tmp_path / "run.ckpt"
    assert run_cli("--layers", "64-512-10", "--checkpoint", str(ckpt)) == 2
    err = capsys.readouterr().err
    # engine v2 at 32 lanes: (64 x 512 + 512 x 10) weights, 32 to a word = 1184 words of 1024
    assert "network [64, 512, 10] needs 1184 weight words; build 'sim' holds 1024" in err, err
    assert not ckpt.exists()


def test_data_set_with_nan(tmp_path, capsys):
    path = tmp_path / "nan.npz"
    x = np.random.default_rng(0).random((50, 64))
    x[7, 3] = np.nan
    np.savez(path, X=x, y=np.arange(50) % 10)
    assert run_cli("--dataset", str(path)) == 2
    err = capsys.readouterr().err
    assert f"{path}: X has NaN or infinite values (first in sample 7)" in err, err


@pytest.mark.parametrize("change, message", [
    (lambda w: [w[0], w[1][:, :31]], r"layer 1 weights have shape \(10, 31\); expected \(10, 32\)"),
    (lambda w: [w[0]], "got 1 weight matrices; the network has 2"),
    (lambda w: [w[0], w[1].astype(np.int64) + 40000], "int16 holds"),
])
def test_rejected_weights_leave_the_old_ones(change, message):
    dev = ModelDevice()
    layers = [64, 32, 10]
    dev.configure(layers)
    dev.load_weights(golden.init_weights(layers, 3))
    before = dev.read_weights()
    with pytest.raises(ConfigError, match=message):
        dev.load_weights(change(golden.init_weights(layers, 4)))
    after = dev.read_weights()
    assert golden.weights_sha256(after) == golden.weights_sha256(before)
    assert any(w.any() for w in after)


def test_unknown_simulator_is_named():
    with pytest.raises(ConfigError, match="simulator 'nonesuch' is not 'verilator' or 'icarus'"):
        open_sim(simulator="nonesuch")


def test_missing_iverilog_is_reported_and_nothing_left_running(tmp_path, monkeypatch):
    started = []

    class RecordingPopen(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(subprocess, "Popen", RecordingPopen)
    monkeypatch.setenv("PATH", str(tmp_path))               # an empty directory
    with pytest.raises(ConfigError) as error:
        open_sim(simulator="icarus", start_timeout=60)
    assert "the simulated board (icarus) exited with code" in str(error.value)
    assert "iverilog not on PATH" in str(error.value)
    assert len(started) == 1 and started[0].poll() is not None
    with pytest.raises(ProcessLookupError):                  # its process group is empty
        os.killpg(started[0].pid, 0)


def test_cli_reports_a_dead_link_without_a_traceback(monkeypatch, capsys):
    """A device that stops answering mid-run: exit code 3 and a one-line link error."""
    from ember import cli, device
    from ember.protocol import LinkError

    def dead(*args, **kwargs):
        raise LinkError("read of 1 words at 0x000011 failed: no valid response to seq 7 after "
                        "6 attempts (last: no response within 0.6 s)", "no_response", 7)

    monkeypatch.setattr(device.EngineDevice, "train_batch", dead)
    assert cli.main(["train", "--quiet", "--epochs", "1", "--resident", "off"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("ember: link error: read of 1 words at 0x000011 failed")
    assert "Traceback" not in err


def test_settings_that_need_a_missing_unit_are_refused_before_any_write():
    """A build without the PSG and ssProp units (Build.features): the device reads its
    FEATURES register, refuses such steps with the unit's name and changes nothing; a
    training run that would need one is refused before it starts."""
    import dataclasses

    from ember import data
    from ember.policies import TrainConfig
    from ember.trainer import Trainer
    lean = dataclasses.replace(spec.BUILDS["tiny"], name="lean", features=("zero_skip", "slu"))
    dev = ModelDevice(lean)
    info = dev.identify()
    assert info["features"] == ["zero_skip", "slu"] and info["build"] == "custom-4"
    layers = [12, 8, 4]
    dev.configure(layers)
    w = golden.init_weights(layers, 1)
    dev.load_weights(w)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 256, size=(4, 12)), rng.integers(0, 4, size=4)
    before = dev.read_counters()
    for settings, unit in ((StepSettings(psg=True), "psg"),
                           (StepSettings(keep_q8=128), "ssprop"),
                           (StepSettings(keep_q8=128, ssprop_random=True), "ssprop and "
                                                                           "ssprop_random")):
        with pytest.raises(ConfigError, match=f"need the {unit} units?; build 'custom-4' has "
                                              "only: zero_skip, slu"):
            dev.train_batch(x, y, settings)
    after = dev.read_counters()
    assert after["batches"] == before["batches"] == 0
    assert all(np.array_equal(a, b) for a, b in zip(dev.read_weights(), w))
    dev.train_batch(x, y, StepSettings(zero_skip=True, update_mask=(False, True)))
    assert dev.read_counters()["batches"] == 1
    ds = data.load_digits()
    with pytest.raises(ConfigError, match="psg unit; build 'custom-4'"):
        Trainer(ModelDevice(lean), ds, TrainConfig(layers=(64, 16, 10), batch_size=8,
                                                    psg=True).check(), progress=False)
