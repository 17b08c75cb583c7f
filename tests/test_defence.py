"""The engine does not trust its host (issue 15, items 1 and 2 of its Why): valid frames that
bricked v1 (a command after a setup of 0 layers, a batch of 0, a layer of 0 inputs or
outputs, more layers than the build holds) and values v1 ran unchecked (a label at or above
the class count, a batch or a width over the build's, bases past a memory, a shift of 40, an
lr_shift of 200, a keep ratio of 0, an LFSR seed of 0) are refused with `bad_value`, by the
simulated board and the model alike, and change nothing: weights, registers, descriptors and
counters read back as they were, and the next clean training step gives the same weights as
on a device that never saw them."""

import numpy as np
import pytest

from ember import golden, regmap, spec
from ember.device import ModelDevice, open_device
from ember.protocol import LinkError
from ember.spec import ConfigError, StepSettings

BUILD = spec.BUILDS["tiny"]
LAYERS = [12, 9, 5]
BATCH = 4


def status_of(call):
    try:
        call()
        return "ok"
    except LinkError as e:
        return e.status


def snapshot(dev):
    """Everything a refused frame must leave alone (the link byte counters aside)."""
    read = dev.link.read_words
    # (REJECTED aside: it says which check refused the last command)
    regs = {name: read(regmap.reg(name), 1)[0] for name, (_, mode) in spec.REGISTERS.items()
            if mode != "wo" and name != "rejected"}
    desc = {(l, f): read(regmap.layer_field(l, f), 1)[0]
            for l in range(BUILD.max_layers) for f in spec.LAYER_FIELDS}
    counters = {k: v for k, v in dev.read_counters().items()
                if not k.startswith("link_") and k not in spec.CYCLE_COUNTERS}
    return regs, desc, counters, [w.tolist() for w in dev.read_weights()]


def refusals(dev):
    """Each refused write or command: (what, status, state unchanged)."""
    write = dev.link.write_words
    reg, field = regmap.reg, regmap.layer_field
    labels = regmap.region("labels")
    cases = [
        ("0 layers", lambda: write(reg("layers"), [0])),
        (f"{BUILD.max_layers + 1} layers", lambda: write(reg("layers"), [BUILD.max_layers + 1])),
        ("batch 0", lambda: write(reg("batch"), [0])),
        (f"batch {BUILD.max_batch + 1}", lambda: write(reg("batch"), [BUILD.max_batch + 1])),
        ("batch 0x80000001", lambda: write(reg("batch"), [0x80000001])),
        ("layer of 0 inputs", lambda: write(field(1, "inputs"), [0])),
        ("layer of 0 outputs", lambda: write(field(1, "outputs"), [0])),
        (f"{BUILD.max_width + 1} inputs", lambda: write(field(0, "inputs"),
                                                        [BUILD.max_width + 1])),
        ("weight base past the memory", lambda: write(field(0, "weight_base"),
                                                      [BUILD.weight_words])),
        ("act base past the memory", lambda: write(field(1, "act_base"), [BUILD.act_bytes])),
        ("shift 40", lambda: write(field(0, "shift"), [40])),
        ("lr_shift 200", lambda: write(reg("lr_shift"), [200])),
        ("keep ratio 0", lambda: write(reg("keep_q8"), [0])),
        ("LFSR seed 0", lambda: write(reg("lfsr_seed"), [0])),
        ("label = classes", lambda: write(labels, [LAYERS[-1]])),
        ("label above classes", lambda: write(labels, [7 << 16])),
    ]
    out = []
    for what, call in cases:
        before = snapshot(dev)
        out.append((what, status_of(call), snapshot(dev) == before))
    # values each in range, but a command with them would run past a memory: the command is
    # refused; the descriptor is then restored
    d1 = regmap.descriptor_writes(LAYERS, BUILD, BATCH)
    for what, addr, value in [
            ("weights run past the memory", field(1, "weight_base"), BUILD.weight_words - 2),
            ("activations run past the memory", field(1, "act_base"), BUILD.act_bytes - 2),
            ("layer 1's weights inside layer 0's", field(1, "weight_base"), 1)]:
        write(addr, [value])
        before = snapshot(dev)
        status = status_of(lambda: write(reg("control"), [spec.CONTROL_TRAIN]))
        failed = list(spec.COMMAND_CHECKS)[dev.link.read_words(reg("rejected"), 1)[0] - 1]
        out.append((f"{what} ({failed})", status, snapshot(dev) == before))
        write(addr, [dict(d1)[addr]])
    return out


def clean_step(dev, rng_seed):
    rng = np.random.default_rng(rng_seed)
    x = rng.integers(0, 256, size=(BATCH, LAYERS[0]))
    y = rng.integers(0, LAYERS[-1], size=BATCH)
    dev.train_batch(x, y, StepSettings(lr_shift=8))
    return [w.tolist() for w in dev.read_weights()]


def exercise(dev):
    # v1's bricking case: a command on a device that was never configured
    fresh = status_of(lambda: dev.link.write_words(regmap.reg("control"),
                                                   [spec.CONTROL_TRAIN]))
    rejected = dev.link.read_words(regmap.reg("rejected"), 1)[0]
    dev.configure(LAYERS)
    dev.load_weights(golden.init_weights(LAYERS, 3))
    clean_step(dev, 1)
    seen = refusals(dev)
    return fresh, rejected, seen, clean_step(dev, 2)


def reference():
    dev = ModelDevice(BUILD)
    dev.configure(LAYERS)
    dev.load_weights(golden.init_weights(LAYERS, 3))
    clean_step(dev, 1)
    return clean_step(dev, 2)


def check(result):
    fresh, rejected, seen, weights = result
    assert fresh == "bad_value"
    assert rejected == 1 + list(spec.COMMAND_CHECKS).index("layers")
    for what, status, unchanged in seen:
        assert status == "bad_value", what
        assert unchanged, what
    assert [what for what, *_ in seen[-3:]] == [
        "weights run past the memory (weights)", "activations run past the memory (acts)",
        "layer 1's weights inside layer 0's (weights)"]
    assert weights == reference()


def test_model_refuses_what_bricked_or_corrupted_v1():
    check(exercise(ModelDevice(BUILD)))


def test_refused_command_raises_config_error_naming_the_check():
    dev = ModelDevice(BUILD)
    dev.configure(LAYERS)
    dev.link.write_words(regmap.layer_field(1, "inputs"), [3])     # breaks the chain
    with pytest.raises(ConfigError, match=r"refused the command \(chain: .*nothing was"):
        dev.infer(np.zeros((1, LAYERS[0]), dtype=np.int64))   # batch 1: as configured


@pytest.mark.rtl
def test_simulated_board_refuses_what_bricked_or_corrupted_v1():
    with open_device("sim", build=BUILD, simulator="verilator") as sim:
        got = exercise(sim)
    check(got)
    assert got == exercise(ModelDevice(BUILD))
