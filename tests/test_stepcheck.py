"""The command check (ember_hw.stepcheck.StepCheck, inside the register bank) in the Amaranth
simulator against its golden twin, spec.check_command as the model backend runs it: random
networks, batches and descriptor values, many of them broken on purpose (issue 15's bricking
and overrunning configurations among them), each followed by a train or infer command. The
bank and the model give the same answer (the command starts, or bad_value), the same
REJECTED value and the same class count; every check of spec.COMMAND_CHECKS is seen failing,
and passing commands are seen too."""

import dataclasses

import numpy as np
import pytest

from ember import regmap, spec
from ember.virtual import VirtualEngine
from ember_hw.regbank import RegisterBank

from engine_harness import model_access, run_testbench
from test_regbank import SMALL, BankDriver, mark_labels

# the iCEBreaker's sizes with the command check (its own build leaves the unit out), on
# engine v1, so that the bank's StepCheck answers alone (on engine v2 the shell's program
# checker gives the check's last verdict: tests/test_regbank.py's run_command)
ICEBREAKER = dataclasses.replace(spec.with_dataflow(spec.BUILDS["icebreaker"], "outputs"),
                                 name="icebreaker_checked",
                                 features=spec.BUILDS["icebreaker"].features + ("command_check",))
SCRATCHY = dataclasses.replace(SMALL, name="scratchy", scratch_entries=24)


def raw_layout(widths, build, batch):
    """Descriptor values as the host lays a network out, without the host's checks."""
    out, wbase, abase = [], 0, 0
    for k, n in zip(widths[:-1], widths[1:]):
        out.append({"inputs": k, "outputs": n, "weight_base": wbase, "act_base": abase,
                    "shift": 7})
        wbase += build.blocks(n) * k
        abase += batch * k
    return out


def clamp(value, setting):
    return min(max(value, setting.lo), setting.hi)


def random_case(rng, build, kind, n_layers=None):
    """(writes, label words to write, command) for one case; `kind` picks what to break."""
    fields = build.descriptor_fields()
    n_layers = n_layers or int(rng.integers(1, build.max_layers + 1))
    widths = [int(w) for w in rng.integers(1, build.max_width + 1, n_layers + 1)]
    widths[-1] = max(widths[-1], 2)
    if kind != "big":
        # mostly small networks, so that most pass the memory checks unless broken
        widths = [max(1, w // 4) for w in widths[:-1]] + [max(2, widths[-1] // 4)]
    batch = int(rng.integers(1, build.max_batch + 1))
    if kind not in ("big", "batch_too_big"):
        batch = max(1, batch // 2)
    desc = raw_layout(widths, build, batch)
    layers = n_layers
    labels = (batch + 1) // 2
    command = spec.CONTROL_TRAIN if rng.random() < 0.7 else spec.CONTROL_INFER
    l = int(rng.integers(0, n_layers))
    if kind == "extra_layer" and n_layers < build.max_layers:
        layers = n_layers + 1               # the next descriptor was never written (zeros)
    elif kind == "chain" and n_layers > 1:
        l = max(l, 1)
        desc[l]["inputs"] = clamp(desc[l]["inputs"] + int(rng.choice([-1, 1])),
                                  fields["inputs"])
    elif kind == "weight_base":
        desc[l]["weight_base"] = int(rng.integers(0, build.weight_words))
    elif kind == "act_base":
        desc[l]["act_base"] = int(rng.integers(0, build.act_bytes))
    elif kind == "classes":
        desc[-1]["outputs"] = 1
    elif kind == "labels":
        labels = int(rng.integers(0, labels))
    writes = [(regmap.reg("layers"), layers)]
    if kind != "no_batch":
        writes.append((regmap.reg("batch"), batch))
    for i, d in enumerate(desc):
        writes += [(regmap.layer_field(i, f), d[f]) for f in spec.LAYER_FIELDS]
    return writes, labels, command


KINDS = ("ok", "big", "batch_too_big", "extra_layer", "chain", "weight_base", "act_base",
         "classes", "labels")


@pytest.mark.parametrize("build", [SMALL, ICEBREAKER, SCRATCHY], ids=lambda b: b.name)
def test_command_check_matches_the_golden_check(build):
    rng = np.random.default_rng(15)
    dut = RegisterBank(build)
    labels_base = spec.ADDRESS_MAP["labels"][0]
    results = []

    async def bench(ctx):
        drv = BankDriver(ctx, dut, timeout=2000)
        # one bank and one twin see the same writes, case after case; "layers" and "batch"
        # fail only before either is first written (neither takes 0); case 2 uses layer 1's
        # descriptor, never written (1 input, 1 output)
        for case in range(160):
            kind = ("fresh", "no_batch", "extra_layer")[case] if case < 3 \
                else KINDS[case % len(KINDS)]
            writes, labels, command = random_case(rng, build, kind, 1 if case < 3 else None) \
                if case else ([], 0, spec.CONTROL_TRAIN)
            for addr, value in writes:
                got = (await drv.access(addr, value))[0][0]
                assert got == model_access(twin, addr, value)[0], (hex(addr), value)
            for w in range(labels):
                if model_access(twin, labels_base + w, 0)[0] == "ok":
                    await mark_labels(drv, [w])
            assert ctx.get(dut.classes) == twin.classes()
            got = (await drv.access(regmap.reg("control"), command))[0][0]
            want = model_access(twin, regmap.reg("control"), command)[0]
            rejected = (await drv.access(regmap.reg("rejected")))[0]
            results.append((kind, got, want, rejected, ("ok", twin.rejected)))

    twin = VirtualEngine(build)
    run_testbench(dut, bench)
    for kind, got, want, rejected, twin_rejected in results:
        assert got == want, (kind, got, want, rejected, twin_rejected)
        assert rejected == twin_rejected, (kind, rejected, twin_rejected)
    names = ["passed"] + list(spec.COMMAND_CHECKS)
    seen = {names[r[1]] for *_, r in results}
    # "program" is engine v2's check (the model backend's, for a build of dataflow "samples");
    # "data" the resident unit's, whose commands this check does not start
    expected = set(names) - {"program", "data"}
    if build.scratch_entries >= build.lanes * build.grad_words // 2:
        # batch x widest hidden <= P x batch x widest blocks <= P x grad_words / 2: on this
        # build a batch whose gradients fit always fits the dX scratch
        expected.discard("scratch")
    assert seen == expected, sorted(expected - seen)


@pytest.mark.parametrize("build, cycles", [(spec.BUILDS["v1"], 72), (ICEBREAKER, 89),
                                           (spec.BUILDS["icebreaker"], 2)],
                         ids=["v1", "icebreaker_checked", "icebreaker"])
def test_check_cycles_for_the_digits_network(build, cycles):
    """The check's cost before a command starts (docs/protocol.md, section 8): 64-32-10 at
    batch 16, from the CONTROL write to its answer when the command itself takes no time.
    (The iCEBreaker's own build has no command_check unit: the answer comes at once.)"""
    from test_regbank import configure
    dut = RegisterBank(build)
    seen = {}

    async def bench(ctx):
        drv = BankDriver(ctx, dut, timeout=5000)
        await configure(drv, build, [64, 32, 10], 16)
        seen["answer"] = await drv.access(regmap.reg("control"), spec.CONTROL_INFER)

    run_testbench(dut, bench)
    assert seen["answer"] == (("ok", 0), cycles)


def test_build_without_the_unit_checks_only_counts():
    """A build without command_check (the iCEBreaker's) refuses a command only for 0 layers or
    0 samples, so that none hangs; it runs the rest as its host configured it."""
    from test_regbank import configure
    build = spec.BUILDS["icebreaker"]
    assert "command_check" not in build.features
    dut = RegisterBank(build)
    seen = []

    async def bench(ctx):
        drv = BankDriver(ctx, dut)
        control = regmap.reg("control")
        seen.append((await drv.access(control, spec.CONTROL_INFER))[0][0])
        seen.append((await drv.access(regmap.reg("rejected")))[0])
        await configure(drv, build, [64, 32, 10], 4)
        await drv.access(regmap.layer_field(1, "inputs"), 31)        # breaks the chain
        seen.append((await drv.access(control, spec.CONTROL_INFER))[0][0])
        seen.append((await drv.access(regmap.reg("rejected")))[0])

    run_testbench(dut, bench)
    assert seen == ["bad_value", ("ok", 1), "ok", ("ok", 0)]
