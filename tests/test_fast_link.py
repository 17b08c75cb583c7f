"""The fast link (issue 16, item 2): each board build's baud, read back through the BAUD
register, and the host's use of it. The tops' divisors are checked in test_boards.py, the
simulated tops through their pins at the boards' rates in test_board_tops_rtl.py."""

import json

import pytest

from ember import cli, device, protocol, regmap, spec
from ember.device import ModelDevice, open_board
from ember.spec import ConfigError
from ember.virtual import VirtualEngine, VirtualPort


def test_the_boards_run_at_3_mbaud_and_other_builds_at_the_generic_rate():
    assert spec.board_bauds() == {"icebreaker": 3_000_000, "ulx3s": 3_000_000}
    assert spec.BUILDS["sim"].baud == spec.DEFAULT_BAUD == 115200
    # every build's clock makes its baud within uart_divisor's 2 %
    from ember_hw.uart import baud_error
    for build in spec.BUILDS.values():
        assert abs(baud_error(build.clock_hz, build.baud)) <= 0.02, build.name


@pytest.mark.parametrize("name", sorted(spec.BUILDS))
def test_model_answers_the_baud_register_and_identify(name):
    build = spec.BUILDS[name]
    dev = ModelDevice(build)
    assert dev.link.read_words(regmap.reg("baud"), 1) == [build.baud]
    assert dev.identify()["baud"] == build.baud
    assert device.build_of(dev.identify()).baud == build.baud
    # the virtual port says the build's rate, so the Link sizes its timeout from it
    assert dev.link.timeout == 1.0      # ModelDevice's own; a default Link takes the baud's:
    assert protocol.Link(VirtualPort(VirtualEngine(build))).timeout == \
        protocol.default_timeout(build.baud)


def test_the_link_timeout_follows_the_baud():
    # the longest request and answer, fully escaped, take 14 ms at 3 Mbaud and 0.36 s at
    # 115200, on top of the OS's 0.25 s
    fast, slow = protocol.default_timeout(3_000_000), protocol.default_timeout(115200)
    assert fast == pytest.approx(0.2638, abs=1e-4) and slow == pytest.approx(0.6082, abs=1e-4)
    assert (fast - 0.25) * 3_000_000 == pytest.approx((slow - 0.25) * 115200)


class _Ports:
    """serial.serial_for_url stand-in: every URL is a virtual engine of `build` (or, with
    build None, a port that never answers, as a board opened at the wrong rate does not);
    records the rate each port was opened at."""

    def __init__(self, build):
        self.build, self.opened = build, []

    def __call__(self, url, baudrate, timeout):
        self.opened.append(baudrate)
        port = VirtualPort(VirtualEngine(self.build)) if self.build else _Silent()
        port.baudrate = baudrate
        return port


class _Silent:
    in_waiting = 0

    def write(self, data):
        return len(data)

    def read(self, n=1):
        return b""

    def reset_input_buffer(self):
        pass

    def close(self):
        pass


@pytest.fixture
def ports(monkeypatch):
    import serial

    def use(build):
        fake = _Ports(build)
        monkeypatch.setattr(serial, "serial_for_url", fake)
        return fake
    return use


@pytest.mark.parametrize("board", spec.BOARDS)
def test_a_board_opens_at_its_builds_baud_by_default(ports, board):
    fake = ports(spec.BUILDS[board])
    dev = open_board("socket://board", retries=0, timeout=0.05)
    assert fake.opened == [3_000_000]
    assert dev.identify()["baud"] == 3_000_000 and dev.identify()["build"] == board


def test_a_board_whose_baud_register_differs_from_the_port_is_refused(ports):
    ports(spec.BUILDS["icebreaker"])
    with pytest.raises(ConfigError, match=r"answered at 115200 baud, but its build "
                                          r"'icebreaker' runs its UART at 3000000 baud"):
        open_board("socket://board", baud=115200, retries=0, timeout=0.05)
    # a bitstream of a build at the generic rate, opened at the boards' default
    ports(spec.BUILDS["sim"])
    with pytest.raises(ConfigError, match=r"answered at 3000000 baud, but its build 'sim' "
                                          r"runs its UART at 115200 baud"):
        open_board("socket://board", retries=0, timeout=0.05)


def test_no_answer_names_the_baud_tried_and_the_boards_bauds(ports):
    fake = ports(None)
    with pytest.raises(ConfigError, match=r"no answer from 'socket://board' at 115200 baud; "
                                          r"Ember's board bitstreams run at: icebreaker "
                                          r"3000000, ulx3s 3000000") as caught:
        open_board("socket://board", baud=115200, retries=0, timeout=0.05)
    assert "no valid response" in str(caught.value)
    with pytest.raises(ConfigError, match=r"at 3000000 baud;"):
        open_board("socket://board", retries=0, timeout=0.05)
    assert fake.opened == [115200, 3_000_000]


def test_cli_baud_defaults_to_the_boards_rate():
    args = cli.build_parser().parse_args(["train", "--backend", "board", "--port", "/dev/x"])
    assert cli.device_options(args) == {"port": "/dev/x", "baud": None}
    args = cli.build_parser().parse_args(["train", "--backend", "board", "--port", "/dev/x",
                                          "--baud", "115200"])
    assert cli.device_options(args)["baud"] == 115200


def test_throughput_json_has_the_issues_keys(monkeypatch, capsys):
    from ember import bench
    from ember_boards import throughput
    figures = {"cycles_per_train_sample": 3200.0, "cycles_per_infer_sample": 1000.0,
               "utilization": {"forward": 0.9}, "link_bytes_per_train_sample": 77.0}
    monkeypatch.setattr(bench, "dense_engine_figures", lambda *a, **k: figures)
    # the ULX3S's build holds resident data: one epoch's cycles and link bytes per sample,
    # and those sent while it runs
    monkeypatch.setattr(bench, "dense_resident_figures", lambda *a, **k: {
        "resident_cycles_per_train_sample": 3400.0,
        "resident_link_bytes_per_train_sample": 0.25,
        "resident_overlapped_link_bytes_per_train_sample": 0.15})
    assert throughput.main(["--board", "icebreaker", "--json", "--report", "/nonexistent"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["baud"] == 3_000_000 and r["baud_error"] == 0.0 and r["uart_divisor"] == 8
    assert r["engine_samples_per_s"] == 7500                     # 24e6 / 3200
    assert r["link_samples_per_s"] == 3896.1                     # 300,000 bytes/s / 77
    assert r["streaming_samples_per_s"] == 2564.1                # the two in turn
    assert r["resident_samples_per_s"] is None
    assert throughput.main(["--board", "ulx3s", "--report", "/nonexistent"]) == 0
    text = capsys.readouterr().out
    assert "3000000 baud (divisor 10, error +0.00%)" in text
    # 1 / (max(3400 / 30e6, 0.15 * 10 / 3e6) + 0.1 * 10 / 3e6) against 30e6 / 3200 = 9375
    assert ("resident 8797.7 (93.8% of the engine's; 3400.0 cycles and 0.25 link bytes per "
            "sample, 0.15 of them while the engine works)") in text
