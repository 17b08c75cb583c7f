"""Engine v2's core (ember_hw.sample_engine.SampleEngine) alone in the Amaranth simulator: the
testbench that loads a program, a network and a batch into it and runs one command, and the
figures of the dense step on the digits network (cycles per sample, MAC utilization per GEMM
phase, weight reads per sample) next to the golden model's v1 counts.

    python -m ember_sim.sample_core [--build sim] [--batch 32] [--json out.json]

Until v2 replaces v1 on the builds this is how its figures are measured (`make bench` prints
them); the core has no bus, so the testbench drives its write ports directly.
"""

import argparse
import dataclasses
import json
import sys
import time

import numpy as np
from amaranth.sim import Simulator

from ember import dataflow, golden, spec

#: The step settings the core takes as inputs (spec.StepSettings' names; batch aside).
SETTINGS = ("update_mask", "lr_shift", "zero_skip", "psg", "psg_relative", "psg_tau",
            "psg_step_shift", "keep_q8", "ssprop_random", "lfsr_seed")


async def _write(ctx, addr, data, en, items):
    for a, d in items:
        ctx.set(addr, a)
        ctx.set(data, int(d))
        ctx.set(en, 1)
        await ctx.tick()
    ctx.set(en, 0)


async def run_command(ctx, dut, build, words, layers, weights, batch, x, y=None,
                      settings=None, max_cycles=2_000_000):
    """Load `words` (dataflow.encode), the weights, the input batch x (B, K) and the labels
    y (a train program; None for infer) into `dut`, run the program with `settings`
    (spec.StepSettings; zero skipping alone for inference) and return a dict: cycles,
    fault, events, kind_cycles, and preds (infer) or weights and correct (train)."""
    P = build.lanes
    wbase, _, _ = dataflow.layout(layers, build, batch)
    await _write(ctx, dut.prog_wr_addr, dut.prog_wr_data, dut.prog_wr_en, enumerate(words))
    await _write(ctx, dut.w_wr_addr, dut.w_wr_data, dut.w_wr_en,
                 [(base + i, int(v) & 0xFFFF) for base, w in zip(wbase, weights)
                  for i, v in enumerate(np.asarray(w).ravel())])
    K = layers[0]
    await _write(ctx, dut.act_wr_addr, dut.act_wr_data, dut.act_wr_en,
                 [(((b // P) * K + k) * P + b % P, x[b, k])
                  for b in range(batch) for k in range(K)])
    if y is not None:
        await _write(ctx, dut.label_wr_addr, dut.label_wr_data, dut.label_wr_en, enumerate(y))
    settings = settings or spec.StepSettings(zero_skip=True)
    ctx.set(dut.batch, batch)
    for name in SETTINGS:
        value = getattr(settings, name)
        if name == "update_mask":
            value = sum(int(v) << i for i, v in enumerate(settings.mask(len(layers) - 1)))
        ctx.set(getattr(dut, name), int(value))
    ctx.set(dut.start, 1)
    await ctx.tick()
    ctx.set(dut.start, 0)
    cycles = 0
    while ctx.get(dut.busy):
        await ctx.tick()
        cycles += 1
        if cycles > max_cycles:
            raise TimeoutError(f"the core ran {max_cycles} cycles without finishing")
    await ctx.tick()                    # the tallies are a cycle behind the core's events
    out = {"cycles": cycles, "fault": ctx.get(dut.fault),
           "events": {name: ctx.get(sig) for name, sig in dut.events.items()},
           "kind_cycles": {name: ctx.get(sig) for name, sig in dut.kind_cycles.items()}}
    if y is None:
        preds = []
        for b in range(batch):
            ctx.set(dut.pred_rd_addr, b)
            await ctx.tick()
            preds.append(ctx.get(dut.pred_rd_data))
        out["preds"] = preds
        return out
    out["weights"] = []
    for base, w in zip(wbase, weights):
        flat = []
        for i in range(np.asarray(w).size):
            ctx.set(dut.w_rd_addr, base + i)
            await ctx.tick()
            v = ctx.get(dut.w_rd_data)
            flat.append(v - (1 << 16) if v >= 1 << 15 else v)
        out["weights"].append(np.array(flat, dtype=np.int16).reshape(np.asarray(w).shape))
    out["correct"] = ctx.get(dut.correct)
    return out


def simulate(build, words, layers, weights, batch, x, y=None, settings=None):
    """run_command on a fresh SampleEngine(build) in the Amaranth simulator."""
    from ember_hw.sample_engine import SampleEngine
    dut = SampleEngine(build)
    out = {}

    async def bench(ctx):
        out.update(await run_command(ctx, dut, build, words, layers, weights, batch, x, y,
                                     settings))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return out


def figures(build=spec.DEFAULT_BUILD, batch=32, layers=(64, 32, 10)):
    """The dense step (SGD, every layer, no skipping) and inference of the digits network on
    the v2 core, a batch of the digits training split: cycles per sample, each GEMM phase's
    MAC utilization (its MACs over lanes x its cycles, loading and draining included) and
    weight reads per training sample, with v1's reads from the golden model (one weight read
    per MAC in the forward and input-gradient passes)."""
    from ember import data
    layers = list(layers)
    ds = data.load_digits()
    x, y = ds.x_train[:batch], ds.y_train[:batch]
    weights = golden.init_weights(layers, 0)
    shifts = [spec.HIDDEN_SHIFT] * (len(layers) - 2) + [spec.OUTPUT_SHIFT]
    P = build.lanes
    t = time.perf_counter()
    train = simulate(build, dataflow.encode(dataflow.train_program(layers, build, batch, shifts),
                                            build),
                     layers, weights, batch, x, y, spec.StepSettings())
    infer = simulate(build, dataflow.encode(dataflow.infer_program(layers, build, batch, shifts),
                                            build),
                     layers, weights, batch, x)
    wall = time.perf_counter() - t
    # v1's reads: the golden model counting engine v1's dataflow on the same sizes
    g = golden.GoldenModel(spec.with_dataflow(build, "outputs"))
    g.configure(layers, shifts)
    g.load_weights(weights)
    g.train_batch(x, y, spec.StepSettings())
    assert all((a == b).all() for a, b in zip(train["weights"], g.weights)), \
        "the v2 core left other weights than the golden model"
    e, kc = train["events"], train["kind_cycles"]

    def util(macs, *kinds):
        cycles = sum(kc[k] for k in kinds)
        return round(macs / (P * cycles), 4) if cycles else None

    return {
        "build": build.name, "lanes": P, "batch": batch, "network": "-".join(map(str, layers)),
        "cycles_per_train_sample": round(train["cycles"] / batch, 1),
        "cycles_per_infer_sample": round(infer["cycles"] / batch, 1),
        "phase_cycles_per_train_sample": {k: round(v / batch, 1) for k, v in kc.items() if v},
        "utilization": {"forward": util(e["mac_forward"], "forward", "logits"),
                        "input_grad": util(e["mac_input_grad"], "input_grad"),
                        "weight_grad": util(e["mac_weight_grad"], "weight_grad")},
        "weight_reads_per_train_sample": round(e["weight_reads"] / batch, 1),
        "v1_weight_reads_per_train_sample": round(g.counters["weight_reads"] / batch, 1),
        "act_reads_per_train_sample": round(e["act_reads"] / batch, 1),
        "v1_act_reads_per_train_sample": round(g.counters["act_reads"] / batch, 1),
        "simulated_seconds": round(wall, 1),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ember_sim.sample_core",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=spec.DEFAULT_BUILD.name, choices=sorted(spec.BUILDS))
    ap.add_argument("--lanes", type=int, help="lanes instead of the build's own")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    build = spec.BUILDS[args.build]
    if args.lanes:
        build = dataclasses.replace(build, lanes=args.lanes,
                                    weight_words=build.weight_words * build.lanes // args.lanes)
    out = figures(build, args.batch)
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
