"""`make bench`: Ember's benchmarks. Results go to build/bench/.

    python -m ember.bench [--quick] [--out DIR]

Measured here: the golden model's training samples per second (medians of repeated runs, with
the float reference measured side by side in the same run) and the accuracy and energy of
every preset. Timings are ratios and medians; never assert on them in tests.
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from . import data, policies
from .device import ModelDevice
from .reference import train_float
from .trainer import Trainer


def model_speed(ds, repeats=5, epochs=2):
    """Training samples per second of the golden model and of the float reference."""
    cfg = policies.make_config("baseline", epochs=epochs)
    samples = epochs * len(ds.x_train)
    model_s, float_s = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        Trainer(ModelDevice(), ds, cfg, progress=False).run()
        model_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        train_float(cfg, ds)
        float_s.append(time.perf_counter() - t)
    # the trainer also evaluates once per epoch: that inference is included in the time
    return {
        "network": "64-32-10", "batch_size": cfg.batch_size, "samples": samples,
        "golden_samples_per_s": samples / statistics.median(model_s),
        "float_samples_per_s": samples / statistics.median(float_s),
        "repeats": repeats,
    }


def presets(ds, seeds, epochs):
    """Test accuracy and energy of every preset on the model backend."""
    rows = {}
    for name in policies.PRESETS:
        accs, energies, saved = [], [], []
        for seed in seeds:
            cfg = policies.make_config(name, seed=seed, epochs=epochs)
            r = Trainer(ModelDevice(), ds, cfg, progress=False).run()
            accs.append(r["test_accuracy"])
            energies.append(r["energy_pj"])
            saved.append(r["saved_fraction"])
        rows[name] = {"test_accuracy_mean": float(np.mean(accs)),
                      "test_accuracy_std": float(np.std(accs)),
                      "energy_pj_mean": float(np.mean(energies)),
                      "saved_fraction_mean": float(np.mean(saved))}
    f = [train_float(policies.make_config("baseline", seed=s, epochs=epochs), ds)
         ["test_accuracy"] for s in seeds]
    rows["float32"] = {"test_accuracy_mean": float(np.mean(f)),
                       "test_accuracy_std": float(np.std(f))}
    return rows


def markdown(rows):
    base = rows["baseline"]["energy_pj_mean"]
    out = ["| configuration | test accuracy (mean +- std) | energy (uJ) | energy / baseline |",
           "|---|---|---|---|"]
    for name, r in rows.items():
        acc = f"{100 * r['test_accuracy_mean']:.2f} +- {100 * r['test_accuracy_std']:.2f} %"
        if "energy_pj_mean" in r:
            e = r["energy_pj_mean"]
            out.append(f"| {name} | {acc} | {e / 1e6:.1f} | {e / base:.3f} |")
        else:
            out.append(f"| {name} | {acc} | - | - |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ember.bench", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="one seed, few epochs (smoke test)")
    ap.add_argument("--out", default="build/bench")
    args = ap.parse_args(argv)
    ds = data.load_digits()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds, epochs = ((0,), 2) if args.quick else ((0, 1, 2), 20)
    results = {"model_speed": model_speed(ds, repeats=1 if args.quick else 5,
                                          epochs=1 if args.quick else 2),
               "seeds": list(seeds), "epochs": epochs,
               "presets": presets(ds, seeds, epochs)}
    (out / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True))
    table = markdown(results["presets"])
    (out / "results.md").write_text(table + "\n")
    s = results["model_speed"]
    print(f"golden model: {s['golden_samples_per_s']:,.0f} training samples/s "
          f"(float32 reference {s['float_samples_per_s']:,.0f}/s; median of {s['repeats']})")
    print(table)
    print(f"written: {out / 'results.json'}, {out / 'results.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
