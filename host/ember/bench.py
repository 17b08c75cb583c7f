"""`make bench`: the energy-versus-accuracy ablation and the engine's performance figures.

    python -m ember.bench [--quick] [--seeds N] [--epochs N] [--sim-seeds N] [--out DIR]
    python -m ember.bench --fleet [...]     many boards: see ember.fleet_bench

For every configuration (dense baseline, SMD, SLU, PSG, ssProp, zero skipping, E2-Train and
Ember-all) on digits with 64-32-10, several seeds: test accuracy (mean, std), energy spent under
the profile, the energy ratio to the baseline at the same epoch budget, and energy-to-accuracy:
the energy spent until the test accuracy first reaches the baseline's final accuracy minus one
point, as a ratio to the baseline's. The counts come from the device: the first `--sim-seeds`
seeds of every configuration run on the simulated board (Verilator) and are checked equal to
the model backend, which carries the other seeds. Plus the float32 reference's accuracy.

Engine figures (from the simulated runs): cycles per training and per inference sample, MAC
utilization per phase (useful MAC-cycles / (lanes x phase cycles)), simulated cycles per second
on Verilator and Icarus, and the golden model's training samples per second. Timings are
medians of repeated runs measured side by side; never assert on them in tests.

Output in --out (default build/bench): results.json (keys below), results.md (the table the
README quotes) and accuracy_energy.png.

results.json keys: configs.<name>.{test_accuracy_mean, test_accuracy_std, energy_pj_mean,
energy_ratio, energy_to_accuracy_pj_mean, energy_to_accuracy_ratio, reached_target, seeds,
sim_checked, skipped_macs_mean}; profiles.<profile>.<config>.{energy_pj_mean, energy_ratio,
rank, compute_ratio, link_share, clock_share} (BENCH_PROFILES, each costed at its board's build:
energy.build_for); float32.{test_accuracy_mean, test_accuracy_std};
engine.{lanes, cycles_per_train_sample, cycles_per_infer_sample, utilization,
phase_cycles_per_sample, sim_cycles_per_s, golden_samples_per_s, sim_train_samples_per_s};
engine_v2 (engine v2's core, not on a build yet: ember_sim.sample_core.figures, plus
dense_pj_per_sample and v1_dense_pj_per_sample under horowitz45);
setup.{epochs, seeds, sim_seeds, profile, profiles, network, batch_size}.

The per-profile ratios are recomputed from the same runs' counters (no retraining): the model
backend's, whose cycle counters are zero, so an FPGA profile charges its static and clock power
over the link's byte times but not over the engine's busy cycles (docs/energy.md says how much
that leaves out).
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from . import data, energy, golden, policies, spec, trainer
from .device import ModelDevice, open_device
from .reference import train_float
from .trainer import Trainer

CONFIGS = {
    "baseline": "baseline", "smd": "smd", "slu": "slu", "psg": "psg", "ssprop": "ssprop",
    "zero": "zero", "e2train": "e2train", "ember-all": "all",
}
EXACT = set(spec.EXACT_COUNTERS) | {"skip_smd"}
#: The profiles whose ratios the bench shows side by side (the first is the runs' own).
BENCH_PROFILES = ("horowitz45", "ice40up5k", "ecp5-85f")


def _exact(c):
    return {k: v for k, v in c.items() if k in EXACT}


def energy_to_accuracy(history, target):
    """Energy spent up to the first epoch whose test accuracy reaches `target` (None if never)."""
    for h in history:
        if h["test_accuracy"] >= target:
            return h["energy_pj"]
    return None


def run_config(preset, seeds, epochs, sim_seeds, ds, log):
    runs = []
    for i, seed in enumerate(seeds):
        cfg = policies.make_config(preset, seed=seed, epochs=epochs)
        model = Trainer(ModelDevice(), ds, cfg, progress=False).run()
        run = {"model": model, "sim": None}
        if i < sim_seeds:
            t = time.perf_counter()
            with open_device("sim", simulator="verilator") as dev:
                sim = Trainer(dev, ds, cfg, progress=False).run()
            sim["wall_train_s"] = time.perf_counter() - t
            same = (sim["weights_sha256"] == model["weights_sha256"] and
                    _exact(sim["counters"]) == _exact(model["counters"]))
            if not same:
                raise AssertionError(f"{preset} seed {seed}: the sim backend differs from the "
                                     "model backend")
            run["sim"] = sim
            log(f"  {preset} seed {seed}: sim = model (weights and counters), "
                f"{sim['wall_train_s']:.0f} s")
        runs.append(run)
    return runs


def engine_figures(sim_runs, lanes):
    """Cycles per sample and utilization from the simulated training runs."""
    c = {k: sum(r["counters"][k] for r in sim_runs) for k in spec.COUNTERS}
    e = {k: sum(r["eval_counters"][k] for r in sim_runs) for k in spec.COUNTERS}
    util = {
        "forward": c["mac_forward"] / (lanes * c["cycles_forward"]) if c["cycles_forward"] else None,
        "input_grad": (c["mac_input_grad"] / (lanes * c["cycles_input_grad"])
                       if c["cycles_input_grad"] else None),
        "weight_grad": ((c["mac_weight_grad"] + c["mac_weight_grad_low"]) /
                        (lanes * c["cycles_weight_grad"]) if c["cycles_weight_grad"] else None),
        "weight_grad_with_update": ((c["mac_weight_grad"] + c["mac_weight_grad_low"]) /
                                    (lanes * (c["cycles_weight_grad"] + c["cycles_update"]))
                                    if c["cycles_weight_grad"] else None),
        "inference": e["mac_forward"] / (lanes * e["cycles_forward"]) if e["cycles_forward"] else None,
    }
    return {
        "cycles_per_train_sample": c["cycles"] / c["samples"] if c["samples"] else None,
        "cycles_per_infer_sample": e["cycles"] / e["infer_samples"] if e["infer_samples"] else None,
        "phase_cycles_per_sample": {k: c[k] / c["samples"] for k in spec.CYCLE_COUNTERS
                                    if c["samples"]},
        "utilization": util,
        "link_bytes_per_train_sample": ((c["link_rx_bytes"] + c["link_tx_bytes"]) / c["samples"]
                                        if c["samples"] else None),
    }


def dense_engine_figures(ds, batches=3, build=None, batch_size=32):
    """Cycles per sample of the dense baseline step (SGD, every layer, no skipping) and of
    inference, on the simulated board (engine build `build`, default spec.DEFAULT_BUILD): the
    engine's raw speed."""
    layers = [64, 32, 10]
    B = batch_size
    with open_device("sim", build=build, simulator="verilator") as dev:
        dev.configure(layers)
        dev.load_weights(golden.init_weights(layers, 0))
        dev.clear_counters()
        t = time.perf_counter()
        for i in range(batches):
            dev.train_batch(ds.x_train[B * i:B * (i + 1)], ds.y_train[B * i:B * (i + 1)])
        wall = time.perf_counter() - t
        c = dev.take_counters()
        dev.infer_all(ds.x_test[:2 * B * batches])
        e = dev.take_counters()
    P = dev.build.lanes
    return {
        "cycles_per_train_sample": c["cycles"] / c["samples"],
        "cycles_per_infer_sample": e["cycles"] / e["infer_samples"],
        "phase_cycles_per_sample": {k: c[k] / c["samples"] for k in spec.CYCLE_COUNTERS},
        "utilization": {
            "forward": c["mac_forward"] / (P * c["cycles_forward"]),
            "input_grad": c["mac_input_grad"] / (P * c["cycles_input_grad"]),
            "weight_grad": c["mac_weight_grad"] / (P * c["cycles_weight_grad"]),
            "weight_grad_with_update": c["mac_weight_grad"] /
            (P * (c["cycles_weight_grad"] + c["cycles_update"])),
            "inference": e["mac_forward"] / (P * e["cycles_forward"]),
        },
        "sim_train_samples_per_s": c["samples"] / wall,
        "link_bytes_per_train_sample": (c["link_rx_bytes"] + c["link_tx_bytes"]) / c["samples"],
    }


def dense_resident_figures(ds, build, batch_size=32):
    """Dense epochs (SGD, every layer, no skipping) of 64-32-10 over the digits' training
    split held in the simulated board's resident data memory (engine build `build`, which
    has the resident unit), as the trainer runs them: each epoch sends the next one's
    schedule while it runs. The second epoch is measured: its cycles per training sample
    with the device's own gather and every batch's overhead, its link bytes per training
    sample (its settings and command, and the third epoch's schedule; the upload, once per
    run, is not in it), and those of them that crossed while the epoch ran."""
    from .schedule import EpochSchedule
    layers, n = [64, 32, 10], len(ds.x_train)
    batches = -(-n // batch_size)
    # the seeds differ by epoch so that each epoch's schedule words do (SGD ignores them)
    epochs = [EpochSchedule(0x5EED + e, n, batch_size, spec.StepSettings(),
                            (False,) * batches, ((True,) * 2,) * batches, (e + 1,) * batches)
              for e in range(3)]
    with open_device("sim", build=build, simulator="verilator") as dev:
        dev.configure(layers)
        dev.load_weights(golden.init_weights(layers, 0))
        dev.load_data(ds.x_train, ds.y_train)
        dev.prepare_epochs(batch_size)
        dev.train_epoch(epochs[0], next_schedule=epochs[1])
        dev.clear_counters()
        before = dev.overlapped_link_bytes
        dev.train_epoch(epochs[1], next_schedule=epochs[2])
        overlapped = dev.overlapped_link_bytes - before
        c = dev.take_counters()
    return {"resident_cycles_per_train_sample": c["cycles"] / c["samples"],
            "resident_link_bytes_per_train_sample":
                (c["link_rx_bytes"] + c["link_tx_bytes"]) / c["samples"],
            "resident_overlapped_link_bytes_per_train_sample": overlapped / c["samples"]}


def engine_v2_figures(build=None, batch=32):
    """Engine v2's core (not on a build yet) on the dense step of 64-32-10: its cycles,
    utilization and reads (ember_sim.sample_core.figures), and the dense step's energy per
    training sample under horowitz45 with v2's event counts and with v1's."""
    from ember_sim import sample_core
    build = build or spec.DEFAULT_BUILD
    out = sample_core.figures(build, batch)
    layers = [64, 32, 10]
    for key, dataflow in (("v1_dense_pj_per_sample", "outputs"),
                          ("dense_pj_per_sample", "samples")):
        b = spec.with_dataflow(build, dataflow)
        out[key] = round(energy.EnergyModel("horowitz45", b).total(
            trainer.dense_counters(layers, b, batch)) / batch, 1)
    return out


def simulator_speed(cycles_verilator=400_000, cycles_icarus=40_000):
    """Simulated cycles per second of the whole simulated board, Python asleep."""
    from ember_sim import board, rtl
    out = {}
    for sim, cycles in (("verilator", cycles_verilator), ("icarus", cycles_icarus)):
        b = board.build_board(spec.DEFAULT_BUILD, sim)
        r = rtl.run(b, "ember_sim.benches.board_bench", testcase="idle_speed",
                    case={"cycles": cycles}).result
        out[sim] = r["cycles"] / r["seconds"]
    return out


def golden_speed(ds, repeats=5, epochs=2):
    """Training samples per second of the golden model itself (GoldenModel.train_batch)."""
    layers = [64, 32, 10]
    times = []
    for _ in range(repeats):
        m = golden.GoldenModel()
        m.configure(layers)
        m.load_weights(golden.init_weights(layers, 0))
        t = time.perf_counter()
        for _ in range(epochs):
            for i in range(0, len(ds.x_train), 32):
                m.train_batch(ds.x_train[i:i + 32], ds.y_train[i:i + 32])
        times.append(time.perf_counter() - t)
    return epochs * len(ds.x_train) / statistics.median(times)


def summarize(runs_by_config, float_accs):
    base_runs = runs_by_config["baseline"]
    base_final = float(np.mean([r["model"]["test_accuracy"] for r in base_runs]))
    target = base_final - 0.01
    base_energy = float(np.mean([r["model"]["energy_pj"] for r in base_runs]))
    base_eta = [energy_to_accuracy(r["model"]["history"], target) for r in base_runs]
    base_eta = float(np.mean([e for e in base_eta if e is not None]))
    out = {}
    for name, runs in runs_by_config.items():
        accs = [r["model"]["test_accuracy"] for r in runs]
        energies = [r["model"]["energy_pj"] for r in runs]
        etas = [energy_to_accuracy(r["model"]["history"], target) for r in runs]
        reached = [e for e in etas if e is not None]
        skipped = {k: float(np.mean([r["model"]["skipped"][k] for r in runs]))
                   for k in spec.SKIP_REASONS}
        out[name] = {
            "test_accuracy_mean": float(np.mean(accs)), "test_accuracy_std": float(np.std(accs)),
            "energy_pj_mean": float(np.mean(energies)),
            "energy_ratio": float(np.mean(energies)) / base_energy,
            "energy_to_accuracy_pj_mean": float(np.mean(reached)) if reached else None,
            "energy_to_accuracy_ratio": float(np.mean(reached)) / base_eta if reached else None,
            "reached_target": f"{len(reached)}/{len(runs)}",
            "seeds": len(runs), "sim_checked": sum(1 for r in runs if r["sim"]),
            "skipped_macs_mean": skipped,
        }
    return out, {"test_accuracy_mean": float(np.mean(float_accs)),
                 "test_accuracy_std": float(np.std(float_accs))}, target


def profile_ratios(runs_by_config, profiles=BENCH_PROFILES):
    """Each configuration's mean training energy under each profile, from the model runs'
    counters, as a ratio to the baseline's; its rank (1 = least energy) and the shares of
    link and clock energy in it. A profile is costed at its board's build (energy.build_for)."""
    out = {}
    for name in profiles:
        m = energy.EnergyModel(name, energy.build_for(name))
        means, compute, shares = {}, {}, {}
        for config, runs in runs_by_config.items():
            grouped = [m.grouped(r["model"]["counters"]) for r in runs]
            totals = [sum(g.values()) for g in grouped]
            means[config] = float(np.mean(totals))
            compute[config] = float(np.mean([energy.comparable_pj(g) for g in grouped]))
            shares[config] = {f"{g}_share": float(np.mean([x[g] / t if t else 0.0
                                                            for x, t in zip(grouped, totals)]))
                              for g in ("link", "clock")}
        order = sorted(means, key=means.get)
        out[m.name] = {c: {"energy_pj_mean": e, "energy_ratio": e / means["baseline"],
                           "rank": order.index(c) + 1,
                           # arithmetic and memory alone (link and clock left out:
                           # energy.UNCOUNTED_IN_DENSE)
                           "compute_ratio": compute[c] / compute["baseline"], **shares[c]}
                       for c, e in means.items()}
    return out


def profile_markdown(by_profile):
    """The method ratios under every profile side by side: energy / baseline (rank)."""
    names = list(by_profile)
    rows = ["| configuration | " + " | ".join(f"{n}: energy / baseline (rank)" for n in names)
            + " | " + " | ".join(f"{n}: link share | {n}: compute / baseline's"
                                 for n in names[1:]) + " |",
            "|---|" + "---|" * (3 * len(names) - 2)]
    for config in by_profile[names[0]]:
        cells = [f"{by_profile[n][config]['energy_ratio']:.3f} ({by_profile[n][config]['rank']})"
                 for n in names]
        for n in names[1:]:
            cells += [f"{100 * by_profile[n][config]['link_share']:.1f} %",
                      f"{by_profile[n][config]['compute_ratio']:.3f}"]
        rows.append(f"| {config} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def markdown(configs, float_ref, target):
    rows = ["| configuration | test accuracy | energy (uJ) | energy / baseline | "
            f"energy to {100 * target:.1f} % / baseline's | sim-checked seeds |",
            "|---|---|---|---|---|---|"]
    for name, r in configs.items():
        eta = "not reached" if r["energy_to_accuracy_ratio"] is None else \
            f"{r['energy_to_accuracy_ratio']:.3f} ({r['reached_target']})"
        rows.append(f"| {name} | {100 * r['test_accuracy_mean']:.2f} +- "
                    f"{100 * r['test_accuracy_std']:.2f} % | {r['energy_pj_mean'] / 1e6:.1f} | "
                    f"{r['energy_ratio']:.3f} | {eta} | {r['sim_checked']}/{r['seeds']} |")
    rows.append(f"| float32 reference | {100 * float_ref['test_accuracy_mean']:.2f} +- "
                f"{100 * float_ref['test_accuracy_std']:.2f} % | - | - | - | - |")
    return "\n".join(rows)


def plot(configs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, r in configs.items():
        ax.errorbar(r["energy_pj_mean"] / 1e6, 100 * r["test_accuracy_mean"],
                    yerr=100 * r["test_accuracy_std"], fmt="o", capsize=3)
        ax.annotate(name, (r["energy_pj_mean"] / 1e6, 100 * r["test_accuracy_mean"]),
                    textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xlabel("training energy (uJ, horowitz45 profile)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("Ember on digits, 64-32-10: accuracy against energy")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    import sys
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--fleet" in argv:               # many boards: ember.fleet_bench (needs Ray)
        from . import fleet_bench
        return fleet_bench.main([a for a in argv if a != "--fleet"])
    ap = argparse.ArgumentParser(prog="python -m ember.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 1 seed, 1 epoch, one sim-checked configuration")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--sim-seeds", type=int, default=1,
                    help="seeds of each configuration run on the simulated board (0: none)")
    ap.add_argument("--out", default="build/bench")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = lambda s: print(s, flush=True)
    ds = data.load_digits()
    seeds = list(range(1 if args.quick else args.seeds))
    epochs = 1 if args.quick else args.epochs
    runs = {}
    for name, preset in CONFIGS.items():
        sim_seeds = (1 if name == "ember-all" else 0) if args.quick else args.sim_seeds
        log(f"{name}: {len(seeds)} seeds x {epochs} epochs ({sim_seeds} on the simulated board)")
        runs[name] = run_config(preset, seeds, epochs, sim_seeds, ds, log)
    float_accs = [train_float(policies.make_config("baseline", seed=s, epochs=epochs), ds)
                  ["test_accuracy"] for s in seeds]
    configs, float_ref, target = summarize(runs, float_accs)
    by_profile = profile_ratios(runs)
    log("engine figures: dense baseline on the simulated board, simulator speeds, golden model")
    engine = dense_engine_figures(ds, batches=1 if args.quick else 3)
    engine["lanes"] = spec.DEFAULT_BUILD.lanes
    engine["sim_cycles_per_s"] = simulator_speed(*((100_000, 10_000) if args.quick
                                                   else (400_000, 40_000)))
    engine["golden_samples_per_s"] = golden_speed(ds, repeats=1 if args.quick else 5)
    sim_runs = [r["sim"] for rs in runs.values() for r in rs if r["sim"]]
    if sim_runs:
        engine["all_sim_runs"] = engine_figures(sim_runs, spec.DEFAULT_BUILD.lanes)
    log("engine v2's core: the same dense step in the Amaranth simulator")
    engine_v2 = engine_v2_figures(batch=8 if args.quick else 32)
    results = {"setup": {"epochs": epochs, "seeds": len(seeds),
                         "sim_seeds": 1 if args.quick else args.sim_seeds,
                         "profile": "horowitz45", "profiles": list(by_profile),
                         "network": "64-32-10", "batch_size": 32},
               "configs": configs, "profiles": by_profile, "float32": float_ref,
               "engine": engine, "engine_v2": engine_v2,
               "target_accuracy": target}
    (out / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True))
    table = markdown(configs, float_ref, target)
    ptable = profile_markdown(by_profile)
    (out / "results.md").write_text(table + "\n\nEnergy / baseline under each profile "
                                    "(same counters):\n\n" + ptable + "\n")
    plot(configs, out / "accuracy_energy.png")
    u = engine["utilization"]
    log(table)
    log("\nenergy / baseline under each profile (same counters, no retraining):\n" + ptable)
    log(f"\nengine (P={engine['lanes']}, dense 64-32-10, batch 32): "
        f"{engine['cycles_per_train_sample']:.0f} cycles per training sample, "
        f"{engine['cycles_per_infer_sample']:.0f} per inference sample; MAC utilization "
        f"forward {100 * u['forward']:.0f} %, input gradient {100 * u['input_grad']:.0f} %, "
        f"weight gradient {100 * u['weight_grad']:.0f} % ({100 * u['weight_grad_with_update']:.0f}"
        f" % with the update), inference {100 * u['inference']:.0f} %")
    s = engine["sim_cycles_per_s"]
    log(f"simulated cycles/s: Verilator {s['verilator']:,.0f}, Icarus {s['icarus']:,.0f}; "
        f"golden model {engine['golden_samples_per_s']:,.0f} training samples/s; "
        f"simulated board {engine['sim_train_samples_per_s']:.0f} training samples/s (wall)")
    v = engine_v2
    log(f"engine v2's core (P={v['lanes']}, the same step at batch {v['batch']}, not on a "
        "build yet): "
        f"{v['cycles_per_train_sample']:.0f} cycles per training sample, "
        f"{v['cycles_per_infer_sample']:.0f} per inference sample; MAC utilization "
        + ", ".join(f"{k.replace('_', ' ')} {100 * u:.1f} %" for k, u in v["utilization"].items())
        + f"; weight reads per training sample {v['weight_reads_per_train_sample']:.0f} "
        f"(v1 {v['v1_weight_reads_per_train_sample']:.0f}), activation reads "
        f"{v['act_reads_per_train_sample']:.0f} (v1 {v['v1_act_reads_per_train_sample']:.0f}); "
        f"dense energy per training sample (horowitz45) {v['dense_pj_per_sample']:,.0f} pJ "
        f"(v1 {v['v1_dense_pj_per_sample']:,.0f} pJ)")
    log(f"written: {out}/results.json, results.md, accuracy_energy.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
