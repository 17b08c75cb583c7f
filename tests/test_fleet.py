"""Fleets on a local Ray: determinism, one device equals plain `ember train`, the golden-model
fleet equals a simulated one, killed and slow actors, and a killed coordinator's resume."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import ray          # the fleet extra is part of make test's install: no skip without it

from ember import cli, data, fleet, policies, spec
from ember.device import ModelDevice
from ember.fleet import Board, Fleet, FleetConfig

pytestmark = pytest.mark.fleet


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    # this module's helpers (faulty devices) travel to the actors by value, not by import
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # PYTEST_CURRENT_TEST emptied for the actors: ember_sim.rtl.run removes the run
    # directories of earlier runs of the same pytest test as stale, and two simulated boards
    # of one fleet start at once within one test (each would delete the other's)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=128 << 20,
             runtime_env={"env_vars": {"PYTEST_CURRENT_TEST": ""}})
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


class Faulty:
    """A model device that misbehaves once, on train_batch call `at` (0-based) of this
    process: 'exit' kills the actor's process, 'sleep' stalls it for a minute, 'close' closes
    its port (the link then talks to a closed pyserial port), 'delay' sleeps `seconds` before
    every batch (a slow device). The marker file makes the fault
    happen in one process only, so the device comes back healthy when it rejoins."""

    def __init__(self, fault, at=0, marker=None, seconds=0.0):
        self.fault, self.at, self.marker, self.seconds = fault, at, marker, seconds

    def __call__(self):
        return _FaultyDevice(ModelDevice(), self)


class _FaultyDevice:
    def __init__(self, device, fault):
        self.device, self.fault, self.calls = device, fault, 0

    def __getattr__(self, name):
        return getattr(self.device, name)

    def train_batch(self, *args):
        f = self.fault
        if f.fault == "delay":
            time.sleep(f.seconds)
        elif self.calls == f.at and not os.path.exists(f.marker):
            open(f.marker, "w").close()
            if f.fault == "exit":
                os._exit(1)
            if f.fault == "close":
                import serial
                port = serial.serial_for_url("loop://")
                port.close()
                self.device.link.port = port
            else:
                time.sleep(60)
        self.calls += 1
        return self.device.train_batch(*args)


def run_fleet(boards, cfg, ds=None, **fleet_settings):
    ds = ds or data.load_digits()
    return Fleet(boards, ds, cfg, FleetConfig(**fleet_settings), progress=False).run()


CFG = dict(epochs=3, seed=5, ssprop_variant="random")     # every policy stream in use


@pytest.fixture(scope="module")
def clean_run():
    """Three model devices, non-IID, four rounds over three epochs, no faults."""
    cfg = policies.make_config("all", **CFG)
    return run_fleet(fleet.boards_from(3), cfg, split="dirichlet", alpha=1.0, rounds=4)


def test_same_weights_whatever_order_the_devices_finish(clean_run, tmp_path):
    cfg = policies.make_config("all", **CFG)
    for slow in (0, 2):       # device 0 finishes last, then device 2 does
        boards = fleet.boards_from(3)
        boards[slow] = Board(factory=Faulty("delay", seconds=0.01))
        again = run_fleet(boards, cfg, split="dirichlet", alpha=1.0, rounds=4)
        assert again["weights_sha256"] == clean_run["weights_sha256"]
        assert [h["weights_sha256"] for h in again["history"]] == \
            [h["weights_sha256"] for h in clean_run["history"]]
        assert [d["counters"] for d in again["devices"]] == \
            [d["counters"] for d in clean_run["devices"]]
    other = run_fleet(fleet.boards_from(3), policies.make_config("all", **{**CFG, "seed": 6}),
                      split="dirichlet", alpha=1.0, rounds=4)
    assert other["weights_sha256"] != clean_run["weights_sha256"]
    # the devices drew their own policy streams: different drops and sample orders
    drops = [tuple(h["batches_dropped"].values()) for h in clean_run["history"]]
    assert any(len(set(d)) > 1 for d in drops)
    assert all(h["devices"] == [0, 1, 2] and not h["missing"] for h in clean_run["history"])
    assert clean_run["energy_pj"] == pytest.approx(sum(d["energy_pj"]
                                                       for d in clean_run["devices"]))
    assert all(b > 0 for b in clean_run["link_bytes_per_round"])


def test_one_device_one_round_per_epoch_is_plain_ember_train(tmp_path):
    args = ["train", "--quiet", "--preset", "all", "--ssprop-variant", "random",
            "--epochs", "3", "--seed", "2"]
    # a fleet streams its shards: plain ember train streaming too (on the sim build it
    # would keep the data on the device, which reads its data memory and moves fewer bytes)
    assert cli.main([*args, "--resident", "off", "--json", str(tmp_path / "plain.json")]) == 0
    assert cli.main([*args, "--boards", "1", "--json", str(tmp_path / "fleet.json")]) == 0
    plain = json.loads((tmp_path / "plain.json").read_text())
    one = json.loads((tmp_path / "fleet.json").read_text())
    assert one["weights_sha256"] == plain["weights_sha256"]
    assert [h["test_accuracy"] for h in one["history"]] == \
        [h["test_accuracy"] for h in plain["history"]]
    assert one["dense_energy_pj"] == pytest.approx(plain["dense_energy_pj"], rel=1e-12)
    exact = set(spec.EXACT_COUNTERS) - {"link_rx_bytes", "link_tx_bytes"} | {"skip_smd"}
    assert {k: one["counters"][k] for k in exact} == {k: plain["counters"][k] for k in exact}


def small_data(samples=128):
    """A slice of the digits: 2 devices x 2 batches of 32 per epoch (few batches for the
    simulated boards)."""
    ds = data.load_digits()
    return data.Dataset("digits[:128]", ds.x_train[:samples], ds.y_train[:samples],
                        ds.x_test[:64], ds.y_test[:64], ds.classes)


@pytest.mark.rtl
def test_golden_model_fleet_and_simulated_fleet_agree_bit_for_bit():
    cfg = policies.make_config("all", epochs=2, seed=1, layers=(64, 16, 10))
    ds = small_data()
    model = run_fleet(fleet.boards_from(2), cfg, ds, rounds=3)
    sim = run_fleet(fleet.boards_from(2, backend="sim"), cfg, ds, rounds=3)
    assert not any(h["missing"] for h in sim["history"])
    assert sim["boards"] == ["sim", "sim"]
    assert [h["weights_sha256"] for h in sim["history"]] == \
        [h["weights_sha256"] for h in model["history"]]
    exact = set(spec.EXACT_COUNTERS) | {"skip_smd"}
    for s, m in zip(sim["devices"], model["devices"]):
        assert {k: s["counters"][k] for k in exact} == {k: m["counters"][k] for k in exact}
        assert s["counters"]["cycles"] > 0 == m["counters"]["cycles"]


def mid_round(run, device, r):
    """The train_batch call number that falls in the middle of round r (0-based) of a
    device in `run`."""
    trained = [h["batches_trained"][str(device)] for h in run["history"]]
    assert trained[r] >= 2
    return sum(trained[:r]) + trained[r] // 2


def test_killed_actor_is_dropped_from_its_round_and_rejoins(clean_run, tmp_path):
    cfg = policies.make_config("all", **CFG)
    boards = fleet.boards_from(3)
    # device 1's process dies in the middle of round 2
    boards[1] = Board(factory=Faulty("exit", at=mid_round(clean_run, 1, 1),
                                     marker=str(tmp_path / "died")))
    r = run_fleet(boards, cfg, split="dirichlet", alpha=1.0, rounds=4)
    h = r["history"]
    assert h[0] == {**clean_run["history"][0], "wall_s": h[0]["wall_s"]}
    assert h[1]["devices"] == [0, 2] and list(h[1]["missing"]) == ["1"]
    assert "actor died" in h[1]["missing"]["1"]
    assert h[1]["weights_sha256"] != clean_run["history"][1]["weights_sha256"]
    # rejoined with the current weights, at the place in its stream it would have had
    assert h[2]["devices"] == [0, 1, 2] and not h[2]["missing"]
    assert h[2]["samples_seen"]["1"] == clean_run["history"][2]["samples_seen"]["1"]
    assert r["devices"][1]["rounds_missed"] == [1]
    assert r["test_accuracy"] > 0.5
    # killed through Ray while its round is under way: the same story for device 0
    kill = lambda rnd, actors: ray.kill(actors[0]) if rnd == 0 else None
    r = Fleet(fleet.boards_from(3), data.load_digits(), cfg,
              FleetConfig(split="dirichlet", alpha=1.0, rounds=4), progress=False,
              on_round=kill).run()
    assert r["history"][0]["devices"] == [1, 2] and "actor died" in \
        r["history"][0]["missing"]["0"]
    assert r["history"][1]["devices"] == [0, 1, 2]
    # its port closed in round 4: the device fails, the actor lives, the round goes on
    boards = fleet.boards_from(3)
    boards[2] = Board(factory=Faulty("close", at=mid_round(clean_run, 2, 3),
                                     marker=str(tmp_path / "closed")))
    r = run_fleet(boards, cfg, split="dirichlet", alpha=1.0, rounds=4)
    assert [list(h["missing"]) for h in r["history"]] == [[], [], [], ["2"]]
    assert r["history"][3]["missing"]["2"].startswith("device failed (PortNotOpenError")
    assert [h["weights_sha256"] for h in r["history"][:3]] == \
        [h["weights_sha256"] for h in clean_run["history"][:3]]


def test_device_that_does_not_answer_in_time_is_dropped(clean_run, tmp_path):
    cfg = policies.make_config("all", **CFG)
    boards = fleet.boards_from(3)
    boards[2] = Board(factory=Faulty("sleep", at=mid_round(clean_run, 2, 2),
                                     marker=str(tmp_path / "stalled")))
    # a round trains for well under a second; device 2 stalls for a minute in round 3
    r = run_fleet(boards, cfg, split="dirichlet", alpha=1.0, rounds=4, round_timeout=15.0)
    missing = [h["missing"] for h in r["history"]]
    assert missing[2] == {"2": "no answer within 15 s"} and not any(missing[:2] + missing[3:])
    assert r["history"][3]["devices"] == [0, 1, 2]


COORDINATOR = """
import os, signal, sys
from ember import cli, fleet
write = fleet.Fleet._write_checkpoint
def write_then_die(self, rounds_done, *args):
    write(self, rounds_done, *args)
    if rounds_done == 2:                  # killed right after round 2's checkpoint
        os.kill(os.getpid(), signal.SIGKILL)
fleet.Fleet._write_checkpoint = write_then_die
sys.exit(cli.main(sys.argv[1:]))
"""


def test_killed_coordinator_resumes_bit_identical(tmp_path, local_ray):
    args = ["train", "--quiet", "--preset", "e2train", "--epochs", "2", "--rounds", "4",
            "--boards", "2", "--combine", "sign", "--split", "dirichlet", "--alpha", "2"]
    ckpt = tmp_path / "fleet.ckpt"
    assert cli.main([*args, "--json", str(tmp_path / "straight.json")]) == 0
    straight = json.loads((tmp_path / "straight.json").read_text())
    proc = subprocess.run([sys.executable, "-c", COORDINATOR, *args, "--checkpoint",
                           str(ckpt), "--ray-address", local_ray], timeout=300,
                          capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    saved = fleet.load_checkpoint(ckpt)
    strip = lambda history: [dict(h, wall_s=0) for h in history]
    assert saved["round"] == 2 and strip(saved["history"]) == strip(straight["history"][:2])
    assert cli.main([*args, "--checkpoint", str(ckpt), "--resume", str(ckpt),
                     "--json", str(tmp_path / "resumed.json")]) == 0
    resumed = json.loads((tmp_path / "resumed.json").read_text())
    assert resumed["weights_sha256"] == straight["weights_sha256"]
    # the same weights, accuracies and work; only the link traffic after the resume differs
    # by a few bytes (new links: descriptors written again, other sequence numbers to escape)
    link = ("link_bytes", "energy_pj")
    same = lambda history: [{k: v for k, v in h.items() if k not in link}
                            for h in strip(history)]
    assert same(resumed["history"]) == same(straight["history"])
    work = lambda d: {k: v for k, v in d["counters"].items() if not k.startswith("link")}
    assert [work(d) for d in resumed["devices"]] == [work(d) for d in straight["devices"]]
    assert fleet.load_checkpoint(ckpt)["round"] == 4
    # a resume with other fleet settings is refused before anything trains
    assert cli.main([*args[:-1], "3", "--resume", str(ckpt)]) == 2


def test_fleet_errors_are_clear(capsys):
    for argv, message in [
        (["--rounds", "3"], "--rounds set(s) up a fleet; add --boards N or --ports"),
        (["--boards", "2", "--ports", "model"], "--boards 2 but --ports names 1 devices"),
        (["--boards", "0"], "at least one board"),
        (["--boards", "2", "--backend", "board"], "named by --ports"),
        (["--boards", "2", "--epochs", "1", "--rounds", "30"], "30 rounds, but device 0"),
        (["--boards", "2", "--plot", "x.png"], "--plot is for a single device"),
        (["--ports", "/dev/ember-no-such-port"], "no device of the fleet finished round 1: "
         "device 0 (board:/dev/ember-no-such-port): could not open (ember.spec.ConfigError: "
         "cannot open port '/dev/ember-no-such-port'"),
    ]:
        assert cli.main(["train", "--quiet", *argv]) == 2
        assert message in capsys.readouterr().err


def test_import_without_ray_says_how_to_get_it():
    code = "import sys; sys.modules['ray'] = None; import ember.fleet"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "ember.fleet needs Ray" in proc.stderr and "ember-train[fleet]" in proc.stderr
    # the arithmetic does not need Ray
    code = "import sys; sys.modules['ray'] = None; import ember.federated, ember.cli"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_fleet_bench_quick_writes_its_table_and_plot(tmp_path):
    from ember import bench
    assert bench.main(["--fleet", "--quick", "--sim-epochs", "0", "--out", str(tmp_path)]) == 0
    r = json.loads((tmp_path / "fleet.json").read_text())
    assert [(row["devices"], row["split"], row["scaled"]) for row in r["rows"]] == \
        [(1, "iid", False), (2, "iid", False), (2, "iid", True), (2, "dirichlet", False),
         (2, "dirichlet", True), (2, "iid", True)]
    assert [row["epochs"] for row in r["rows"]] == [2] * 5 + [3]
    assert r["rows"][0]["delta_points"] == 0.0 and r["sim"] is None
    assert all(row["link_bytes_per_round"] > 0 and row["energy_uj_mean"] > 0
               for row in r["rows"])
    assert "| devices | split |" in (tmp_path / "fleet.md").read_text()
    assert (tmp_path / "fleet_accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
