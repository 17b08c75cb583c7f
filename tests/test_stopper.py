"""The command stopper (ember_hw.stopper.CommandStop) alone in the Amaranth simulator, against its
twin, docs/protocol.md section 10 and spec (STOP_FIELDS, LINK_STATUS), written out below as
`reference_stop`: the watchdog stops a command in its cycle watchdog + 1, an abort stops it in
the cycle after the abort unless it has written a weight by then (then it runs to its end),
STOPPED records why and what it left, cmd_status gives the command's answer, and the next
start clears them. A build without the watchdog unit is stopped only by aborts."""

import dataclasses

import numpy as np
import pytest
from amaranth.sim import Simulator

from ember import spec
from ember_hw.stopper import CommandStop

BUILD = spec.DEFAULT_BUILD
NO_WATCHDOG = dataclasses.replace(BUILD, name="no-watchdog",
                                  features=tuple(f for f in BUILD.features if f != "watchdog"))
STATUS = spec.LINK_STATUS


def stop_word(watchdog, weights_changed, layer):
    """STOPPED of a stopped command (spec.STOP_FIELDS)."""
    fields = {"stopped": 1, "watchdog": watchdog, "weights_changed": weights_changed,
              "layer": layer if weights_changed else 0}
    return sum(fields[name] << lo for name, (lo, _) in spec.STOP_FIELDS.items())


def reference_stop(command, has_watchdog):
    """docs/protocol.md section 10 for one command: (the cycle it stops in or None, STOPPED,
    the answer's LINK_STATUS name). Cycle 1 is the command's first busy cycle; it runs to
    cycle `length` unless stopped; an abort written in cycle a is seen from cycle a + 1."""
    length, watchdog, abort_at, writes, layers = (command[k] for k in (
        "length", "watchdog", "abort_at", "writes", "layers"))
    for t in range(1, length + 1):
        written = any(w <= t for w in writes)       # a weight written by the end of cycle t
        by_watchdog = has_watchdog and t == watchdog + 1
        by_abort = abort_at is not None and t > abort_at and not written
        if by_watchdog or by_abort:
            return t, stop_word(int(by_watchdog), int(written), layers[t]), \
                "watchdog" if by_watchdog else "aborted"
    return None, 0, "ok"


def run_commands(build, commands):
    """Each command on the unit, driven as EngineCore drives it (busy from the cycle after
    start until the command ends or is stopped): [(stop cycle or None, STOPPED, cmd_status)]."""
    dut = CommandStop(build)
    results = []

    async def bench(ctx):
        for command in commands:
            ctx.set(dut.watchdog, command["watchdog"])
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            ctx.set(dut.busy, 1)
            stopped_at = None
            for t in range(1, command["length"] + 1):
                ctx.set(dut.weight_write, t in command["writes"])
                ctx.set(dut.abort, t == command["abort_at"])
                ctx.set(dut.layer, command["layers"][t])
                stop = ctx.get(dut.stop)
                await ctx.tick()
                if stop:
                    stopped_at = t
                    break
            for port in (dut.busy, dut.weight_write, dut.abort):
                ctx.set(port, 0)
            for _ in range(3):      # idle: STOPPED and the answer are held
                assert not ctx.get(dut.stop)
                await ctx.tick()
            status = {v: k for k, v in STATUS.items()}[ctx.get(dut.cmd_status)]
            results.append((stopped_at, ctx.get(dut.stopped), status))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return results


def command(length, watchdog, abort_at=None, writes=(), layer=0, rng=None):
    layers = [int(rng.integers(0, BUILD.max_layers + 1)) if rng is not None else layer
              for _ in range(length + 1)]
    return {"length": length, "watchdog": watchdog, "abort_at": abort_at,
            "writes": set(writes), "layers": layers}


@pytest.mark.parametrize("watchdog", [1, 2, 5, 37])
def test_the_watchdog_stops_a_command_in_its_cycle_watchdog_plus_1(watchdog):
    got = run_commands(BUILD, [command(100, watchdog, layer=3)])
    assert got == [(watchdog + 1, stop_word(1, 0, 0), "watchdog")]


def test_a_watchdog_stop_after_weight_writes_names_the_layer():
    got = run_commands(BUILD, [command(100, 20, writes=[12, 13], layer=2),
                               command(100, 20, writes=[21], layer=5)])
    assert got == [(21, stop_word(1, 1, 2), "watchdog"), (21, stop_word(1, 1, 5), "watchdog")]


def test_an_abort_stops_a_command_that_has_written_no_weight():
    got = run_commands(BUILD, [command(100, 1000, abort_at=7, layer=1)])
    assert got == [(8, stop_word(0, 0, 0), "aborted")]


@pytest.mark.parametrize("write_at", [3, 7, 8])
def test_an_abort_after_a_weight_write_does_not_stop(write_at):
    """A weight written before the abort, in its cycle, or in the cycle it would stop in:
    the command runs to its end and is answered `ok`, STOPPED 0."""
    got = run_commands(BUILD, [command(60, 1000, abort_at=7, writes=[write_at], layer=1)])
    assert got == [(None, 0, "ok")]


def test_the_next_start_clears_the_last_stop():
    got = run_commands(BUILD, [command(50, 10), command(30, 1000), command(50, 1000, 4),
                               command(30, 1000)])
    assert [g[2] for g in got] == ["watchdog", "ok", "aborted", "ok"]
    assert got[1][1] == 0 and got[3][1] == 0


@pytest.mark.parametrize("build", [BUILD, NO_WATCHDOG], ids=lambda b: b.name)
def test_random_commands_stop_as_the_protocol_says(build):
    rng = np.random.default_rng(len(build.features))
    commands = []
    for _ in range(60):
        length = int(rng.integers(1, 80))
        writes = set(int(w) for w in rng.integers(1, length + 1, int(rng.integers(0, 4))))
        abort_at = int(rng.integers(1, length + 1)) if rng.random() < 0.6 else None
        commands.append(command(length, int(rng.integers(1, 90)), abort_at, writes, rng=rng))
    got = run_commands(build, commands)
    want = [reference_stop(c, "watchdog" in build.features) for c in commands]
    assert got == want
    outcomes = {w[2] for w in want}
    assert outcomes == ({"ok", "aborted", "watchdog"} if build is BUILD else {"ok", "aborted"})


def test_a_build_without_the_watchdog_runs_past_its_setting():
    got = run_commands(NO_WATCHDOG, [command(200, 5)])
    assert got == [(None, 0, "ok")]
