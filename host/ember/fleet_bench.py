"""`python -m ember.bench --fleet`: the figures of many-board training (docs/fleet.md).

    python -m ember.bench --fleet [--quick] [--seeds N] [--epochs N] [--sim-epochs N] [--out DIR]

On the model backend, fleets of N = 1, 2, 4 and 8 devices train the E2-Train settings on
digits (64-32-10, batch 32), one round per epoch, each device on 1/N of the training set:
IID shards and label-skewed Dirichlet(alpha 0.5) shards, each with the settings as they are
and with the step sizes scaled to the fleet (lr_shift - log2 N, psg_step + log2 N: averaging
N devices that each took 1/N of the steps moves the weights about 1/N as far); then the
largest fleet again, scaled, with 1.5 times the epochs. Per row: test
accuracy (mean and std over seeds) and its difference to one device, total energy and the
per-device mean, link bytes per round, wall time. Plus 2 simulated boards (Verilator) for
`--sim-epochs` epochs, checked bit for bit against the same fleet on the model backend.

Ray's own costs come first: start-up, starting 8 actors, one call, the weights sent to 8
actors and back (`--ray-only`: just these, into fleet_ray.json).

Output in --out (default build/bench): fleet.json, fleet.md (the table docs/fleet.md quotes)
and fleet_accuracy.png (test accuracy against rounds).

fleet.json keys: rows[].{devices, split, scaled, epochs, test_accuracy_mean, test_accuracy_std,
delta_points, energy_uj_mean, device_energy_uj_mean, link_bytes_per_round, wall_s_mean,
accuracy_by_round}; sim.{boards, epochs, test_accuracy, energy_uj, link_bytes_per_round,
wall_s, same_as_model}; ray.{ray_init_s, start_actors_s, call_ms,
weights_to_all_and_back_ms}; setup.{preset, epochs, seeds, alpha, network, batch_size};
aim.{met, worst_delta_points, by_devices}.
"""

import argparse
import json
import math
import statistics
import time
from pathlib import Path

from . import data, fleet, policies

SIZES = (1, 2, 4, 8)
SPLITS = ("iid", "dirichlet")
ALPHA = 0.5
PRESET = "e2train"


def scaled_settings(devices, base):
    """The step sizes of `base` scaled for an N-device fleet (linear scaling: N times the
    SGD step and the PSG sign step; only powers of two are exact as shifts)."""
    b = int(math.log2(devices))
    return {"lr_shift": max(0, base.lr_shift - b), "psg_step": base.psg_step + b}


def run_row(ds, devices, split, scaled, seeds, epochs, log):
    runs = []
    for seed in seeds:
        cfg = policies.make_config(PRESET, seed=seed, epochs=epochs)
        if scaled:
            cfg = policies.make_config(PRESET, seed=seed, epochs=epochs,
                                       **scaled_settings(devices, cfg))
        t = time.perf_counter()
        r = fleet.Fleet(fleet.boards_from(devices), ds, cfg,
                        fleet.FleetConfig(split=split, alpha=ALPHA), progress=False).run()
        r["wall_total_s"] = time.perf_counter() - t
        runs.append(r)
    accs = [r["test_accuracy"] for r in runs]
    row = {
        "devices": devices, "split": split, "scaled": scaled, "epochs": epochs,
        "test_accuracy_mean": statistics.mean(accs),
        "test_accuracy_std": statistics.pstdev(accs),
        "energy_uj_mean": statistics.mean(r["energy_pj"] for r in runs) / 1e6,
        "device_energy_uj_mean": statistics.mean(d["energy_pj"] for r in runs
                                                 for d in r["devices"]) / 1e6,
        "device_energy_uj_max": max(d["energy_pj"] for r in runs for d in r["devices"]) / 1e6,
        "link_bytes_per_round": statistics.mean(b for r in runs
                                                for b in r["link_bytes_per_round"]),
        "wall_s_mean": statistics.mean(r["wall_total_s"] for r in runs),
        "accuracy_by_round": [statistics.mean(r["history"][i]["test_accuracy"] for r in runs)
                              for i in range(len(runs[0]["history"]))],
        "weights_sha256": [r["weights_sha256"] for r in runs],
    }
    log(f"  N={devices} {split:9s} {'scaled' if scaled else 'as is':6s} {epochs} epochs: "
        f"{100 * row['test_accuracy_mean']:.2f} % +- {100 * row['test_accuracy_std']:.2f}, "
        f"{row['energy_uj_mean']:.1f} uJ, {row['link_bytes_per_round']:,.0f} link B/round, "
        f"{row['wall_s_mean']:.1f} s")
    return row


def sim_figures(ds, epochs, log):
    """2 simulated boards against the same fleet on the model backend."""
    cfg = policies.make_config(PRESET, seed=0, epochs=epochs)
    settings = fleet.FleetConfig(split="iid")
    model = fleet.Fleet(fleet.boards_from(2), ds, cfg, settings, progress=False).run()
    t = time.perf_counter()
    sim = fleet.Fleet(fleet.boards_from(2, backend="sim"), ds, cfg, settings,
                      progress=False).run()
    wall = time.perf_counter() - t
    same = [h["weights_sha256"] for h in sim["history"]] == \
        [h["weights_sha256"] for h in model["history"]]
    out = {"boards": sim["boards"], "epochs": epochs, "test_accuracy": sim["test_accuracy"],
           "energy_uj": sim["energy_pj"] / 1e6,
           "device_energy_uj": [d["energy_pj"] / 1e6 for d in sim["devices"]],
           "link_bytes_per_round": statistics.mean(sim["link_bytes_per_round"]),
           "wall_s": wall, "model_wall_s": model["wall_s"], "same_as_model": same,
           "cycles": [d["counters"]["cycles"] for d in sim["devices"]]}
    log(f"  2 simulated boards, {epochs} epochs: {100 * out['test_accuracy']:.2f} %, "
        f"{out['energy_uj']:.1f} uJ, {out['link_bytes_per_round']:,.0f} link B/round, "
        f"{wall:.0f} s; bit for bit as the model fleet: {same}")
    if not same:
        raise AssertionError("the simulated fleet differs from the model fleet")
    return out


class _Echo:
    """A do-nothing actor: what Ray's own costs are measured with."""

    def echo(self, value=None):
        return value


def ray_overhead(started_s, actors=8, calls=200):
    """Ray's own costs here: start-up (measured by the caller), starting `actors` actor
    processes, one call to an actor, and the current weights of 64-32-10 sent to every actor
    and back (a round's traffic without the training). Medians of repeated calls."""
    import ray
    import numpy as np
    t = time.perf_counter()
    echo = ray.remote(_Echo).options(num_cpus=0)
    pool = [echo.remote() for _ in range(actors)]
    ray.get([a.echo.remote() for a in pool])
    start_actors = time.perf_counter() - t
    one = []
    for _ in range(calls):
        t = time.perf_counter()
        ray.get(pool[0].echo.remote())
        one.append(time.perf_counter() - t)
    weights = [np.zeros((32, 64), np.int16), np.zeros((10, 32), np.int16)]
    fan = []
    for _ in range(calls // 4):
        t = time.perf_counter()
        ray.get([a.echo.remote(weights) for a in pool])
        fan.append(time.perf_counter() - t)
    for a in pool:
        ray.kill(a)
    return {"ray_init_s": started_s, "actors": actors, "start_actors_s": start_actors,
            "call_ms": 1e3 * statistics.median(one),
            "weights_to_all_and_back_ms": 1e3 * statistics.median(fan)}


def markdown(rows, sim, setup):
    base = next(r for r in rows if r["devices"] == 1)
    lines = [f"Fleets on digits, {setup['network']}, {setup['preset']} settings, batch "
             f"{setup['batch_size']}, one round per epoch, {setup['seeds']} seeds; each device "
             f"trains on 1/N of the {setup['train_samples']} training samples (dirichlet: "
             f"alpha {setup['alpha']}).",
             "",
             "| devices | split | steps | epochs | test accuracy | vs 1 device | energy total | "
             "energy per device | link bytes per round | wall |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        delta = 100 * (r["test_accuracy_mean"] - base["test_accuracy_mean"])
        lines.append(
            f"| {r['devices']} | {r['split'] if r['devices'] > 1 else '-'} | "
            f"{'scaled' if r['scaled'] else 'as is'} | {r['epochs']} | "
            f"{100 * r['test_accuracy_mean']:.2f} % +- {100 * r['test_accuracy_std']:.2f} | "
            f"{delta:+.2f} | {r['energy_uj_mean']:.1f} uJ | "
            f"{r['device_energy_uj_mean']:.1f} uJ (max {r['device_energy_uj_max']:.1f}) | "
            f"{r['link_bytes_per_round']:,.0f} | {r['wall_s_mean']:.1f} s |")
    if sim:
        lines += ["", f"2 simulated boards (Verilator), iid, {sim['epochs']} epochs: test "
                  f"accuracy {100 * sim['test_accuracy']:.2f} %, energy {sim['energy_uj']:.1f} "
                  f"uJ ({' / '.join(f'{e:.1f}' for e in sim['device_energy_uj'])} uJ per "
                  f"board), {sim['link_bytes_per_round']:,.0f} link bytes per round, wall "
                  f"{sim['wall_s']:.0f} s (model backend {sim['model_wall_s']:.1f} s); "
                  f"weights bit for bit those of the model fleet: "
                  f"{'yes' if sim['same_as_model'] else 'NO'}."]
    return "\n".join(lines)


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, scaled in zip(axes, (False, True)):
        for r in rows:
            if r["scaled"] != scaled and r["devices"] > 1:
                continue
            rounds = range(1, len(r["accuracy_by_round"]) + 1)
            style = "-" if r["split"] == "iid" or r["devices"] == 1 else "--"
            label = "1 device" if r["devices"] == 1 else f"{r['devices']} devices, {r['split']}"
            if r["epochs"] != rows[0]["epochs"]:
                style, label = ":", f"{label}, {r['epochs']} epochs"
            ax.plot(rounds, [100 * a for a in r["accuracy_by_round"]], style, label=label,
                    color=f"C{[1, 2, 4, 8].index(r['devices'])}")
        ax.set_title("step sizes scaled to the fleet" if scaled else "settings as they are")
        ax.set_xlabel("round (= epoch of every device over its shard)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy (%)")
    axes[1].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ember.bench --fleet", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 1 seed, 2 epochs, N = 1 and 2, 1 simulated epoch, Ray's "
                         "costs with 2 actors")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--sim-epochs", type=int,
                    help="epochs of the 2 simulated boards (default 2, --quick 1; 0: none)")
    ap.add_argument("--ray-only", action="store_true",
                    help="only measure Ray's start-up and per-call overheads")
    ap.add_argument("--out", default="build/bench")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = lambda s: print(s, flush=True)
    ds = data.load_digits()
    seeds = list(range(1 if args.quick else args.seeds))
    epochs = 2 if args.quick else args.epochs
    sizes = (1, 2) if args.quick else SIZES
    import ray
    started = not ray.is_initialized()
    t = time.perf_counter()
    if started:
        ray.init(include_dashboard=False, log_to_driver=False, object_store_memory=256 << 20)
    overhead = ray_overhead(time.perf_counter() - t if started else None,
                            **({"actors": 2, "calls": 40} if args.quick else {}))
    log(f"Ray: init {overhead['ray_init_s'] or 0:.1f} s, {overhead['actors']} actors started "
        f"in {overhead['start_actors_s']:.1f} s, a call {overhead['call_ms']:.2f} ms, weights "
        f"to {overhead['actors']} actors and back {overhead['weights_to_all_and_back_ms']:.1f}"
        f" ms (medians)")
    if args.ray_only:
        if started:
            ray.shutdown()
        (out / "fleet_ray.json").write_text(json.dumps(overhead, indent=2, sort_keys=True))
        return 0
    try:
        log(f"fleets: N = {', '.join(map(str, sizes))}, {len(seeds)} seeds x {epochs} epochs")
        rows = [run_row(ds, 1, "iid", False, seeds, epochs, log)]
        for n in sizes[1:]:
            for split in SPLITS:
                for scaled in (False, True):
                    rows.append(run_row(ds, n, split, scaled, seeds, epochs, log))
        # the largest fleet again with half as many epochs more: what it takes to catch up
        more = epochs + epochs // 2
        rows.append(run_row(ds, sizes[-1], "iid", True, seeds, more, log))
        sim_epochs = args.sim_epochs if args.sim_epochs is not None else \
            (1 if args.quick else 2)
        sim = sim_figures(ds, sim_epochs, log) if sim_epochs else None
    finally:
        if started:
            ray.shutdown()
    base = rows[0]["test_accuracy_mean"]
    for r in rows:
        r["delta_points"] = 100 * (r["test_accuracy_mean"] - base)
    iid_scaled = [r for r in rows if r["devices"] > 1 and r["split"] == "iid" and r["scaled"]
                  and r["epochs"] == epochs]
    worst = min((r["delta_points"] for r in iid_scaled), default=0.0)
    setup = {"preset": PRESET, "epochs": epochs, "seeds": len(seeds), "alpha": ALPHA,
             "network": "64-32-10", "batch_size": 32, "train_samples": len(ds.x_train)}
    results = {"setup": setup, "rows": rows, "sim": sim, "ray": overhead,
               "aim": {"met": worst >= -1.0, "worst_delta_points": worst,
                       "rows": "iid, step sizes scaled, the same epochs",
                       "by_devices": {r["devices"]: r["delta_points"] for r in iid_scaled}}}
    (out / "fleet.json").write_text(json.dumps(results, indent=2, sort_keys=True))
    table = markdown(rows, sim, setup)
    (out / "fleet.md").write_text(table + "\n")
    plot(rows, out / "fleet_accuracy.png")
    log(table)
    log(f"\naim (N devices within 1 point of one device, iid, scaled steps): "
        f"{'met' if worst >= -1.0 else 'NOT met'} (worst {worst:+.2f} points)")
    log(f"written: {out}/fleet.json, fleet.md, fleet_accuracy.png")
    return 0
