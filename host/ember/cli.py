"""The `ember` command: train a network on a device backend and report accuracy and energy."""

import argparse
import dataclasses
import json
import os
import sys

from . import __version__, data, plot, spec
from .device import BACKENDS, open_device
from .federated import COMBINES, SPLITS
from .policies import (KEEP_SCHEDULES, PRESETS, SLU_POLICIES, SSPROP_VARIANTS, TrainConfig,
                       make_config)
from .protocol import LinkError
from .reference import train_float
from .spec import ConfigError
from .trainer import Trainer, load_checkpoint


def _layers(text):
    try:
        widths = tuple(int(w) for w in text.split("-"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"layers '{text}' must look like 64-32-10") from None
    return widths


def _fractions(text):
    try:
        return tuple(float(v) for v in text.split(",") if v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' must be comma-separated fractions") from None


def _bool_flag(p, name, help):
    p.add_argument(f"--{name}", dest=name.replace("-", "_"), action=argparse.BooleanOptionalAction,
                   default=None, help=help)


def build_parser():
    ap = argparse.ArgumentParser(prog="ember", description=__doc__)
    ap.add_argument("--version", action="version", version=f"ember {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a network on a device and report energy")
    t.add_argument("--backend", choices=BACKENDS, default="model",
                   help="model (golden model), sim (simulated board), board (real board)")
    t.add_argument("--simulator", choices=("verilator", "icarus"), default="verilator",
                   help="simulator of the sim backend")
    t.add_argument("--uart", action="store_true",
                   help="sim backend: every byte crosses the engine's UART as bits")
    t.add_argument("--port", help="board backend: serial port name or pyserial URL")
    t.add_argument("--baud", type=int, default=spec.DEFAULT_BAUD,
                   help=f"board backend: baud rate (default {spec.DEFAULT_BAUD})")
    t.add_argument("--build", choices=sorted(spec.BUILDS), default="sim",
                   help="engine build whose limits and lane count apply (default: sim)")
    t.add_argument("--preset", choices=list(PRESETS),
                   help="named bundle of settings (default baseline); the options below "
                        "override it")
    t.add_argument("--epochs", type=int)
    t.add_argument("--batch-size", type=int)
    t.add_argument("--layers", type=_layers, help="widths, input first (default 64-32-10)")
    t.add_argument("--seed", type=int)
    t.add_argument("--dataset", help="'digits' (default) or a .npz file with arrays X and y")
    t.add_argument("--lr-shift", type=int, help="SGD update shift (larger = smaller steps)")
    t.add_argument("--lr-milestones", type=_fractions,
                   help="fractions of the epochs at which lr-shift grows by one")
    t.add_argument("--smd", type=float, help="SMD: probability of dropping a mini-batch")
    t.add_argument("--slu", choices=SLU_POLICIES, help="SLU layer-mask policy")
    t.add_argument("--slu-prob", type=float, help="P(update) of a non-output layer (random)")
    _bool_flag(t, "psg", "predictive sign gradient updates")
    t.add_argument("--psg-tau", type=int, help="PSG threshold (predictor units, or a shift "
                                               "with --psg-relative)")
    _bool_flag(t, "psg-relative", "PSG threshold relative to the layer's largest prediction")
    t.add_argument("--psg-step", type=int, help="PSG step shift at the start")
    t.add_argument("--psg-step-milestones", type=_fractions)
    t.add_argument("--ssprop-keep", type=float, help="ssProp keep ratio (1.0 = off)")
    t.add_argument("--ssprop-schedule", choices=KEEP_SCHEDULES)
    t.add_argument("--ssprop-keep-start", type=float)
    t.add_argument("--ssprop-warmup", type=int)
    t.add_argument("--ssprop-variant", choices=SSPROP_VARIANTS)
    _bool_flag(t, "zero-skip", "skip MAC cycles whose broadcast operand is zero")
    t.add_argument("--profile", help="energy profile name or JSON path (default horowitz45)")
    t.add_argument("--json", metavar="PATH", help="write the full result as JSON")
    t.add_argument("--checkpoint", metavar="PATH",
                   help="after every epoch, write what a resume needs to PATH (JSON, replaced "
                        "atomically)")
    t.add_argument("--resume", metavar="PATH",
                   help="go on from a checkpoint after its last epoch; the settings come from "
                        "the checkpoint, and any given here must equal them")
    t.add_argument("--plot", metavar="PATH",
                   help="write a PNG of test accuracy and energy per epoch")
    t.add_argument("--reference", action="store_true",
                   help="also train the float32 reference and report its accuracy")
    t.add_argument("--quiet", action="store_true", help="no progress output")
    f = t.add_argument_group("many boards (ember.fleet; needs the fleet extra, Ray)")
    f.add_argument("--boards", type=int, help="train on a fleet of N devices of --backend")
    f.add_argument("--ports", help="train on a fleet of the devices named, comma-separated: "
                                   "'model', 'sim', or a board's serial port / pyserial URL")
    f.add_argument("--rounds", type=int, help="combining rounds over the epochs (default: one "
                                              "per epoch)")
    f.add_argument("--combine", choices=COMBINES, help="mean: integer average of the weights "
                   "(default); sign: sign majority vote of the round's weight changes")
    f.add_argument("--split", choices=SPLITS, help="iid shards (default) or label-skewed "
                                                   "dirichlet shards")
    f.add_argument("--alpha", type=float, help="Dirichlet concentration of --split dirichlet "
                                               "(default 0.5; smaller is more skewed)")
    f.add_argument("--round-timeout", type=float, help="seconds a round may take before the "
                                                       "devices still training are dropped")
    f.add_argument("--ray-address", help="join this Ray cluster (default: a local Ray)")
    return ap


FLEET_OPTIONS = ("rounds", "combine", "split", "alpha", "round_timeout", "ray_address")


CONFIG_OPTIONS = ("epochs", "batch_size", "layers", "seed", "dataset", "lr_shift",
                  "lr_milestones", "smd", "slu", "slu_prob", "psg", "psg_tau", "psg_relative",
                  "psg_step", "psg_step_milestones", "ssprop_keep", "ssprop_schedule",
                  "ssprop_keep_start", "ssprop_warmup", "ssprop_variant", "zero_skip", "profile")


def summary(result, reference=None):
    """A readable end-of-run report."""
    lines = []
    s = result["settings"]
    lines.append(f"Ember {result['backend']} backend, build {result['build']['build']} "
                 f"({result['build']['lanes']} lanes), network {'-'.join(map(str, s['layers']))},"
                 f" {result['epochs']} epochs, batch {s['batch_size']}, seed {s['seed']}")
    lines.append(f"  test accuracy   {100 * result['test_accuracy']:6.2f} %")
    if reference:
        lines.append(f"  float32 ref.    {100 * reference['test_accuracy']:6.2f} %")
    lines.append(f"  energy spent    {result['energy_pj'] / 1e6:10.3f} uJ  (profile "
                 f"{result['profile']})")
    lines.append(f"  dense baseline  {result['dense_energy_pj'] / 1e6:10.3f} uJ  "
                 f"-> saved {100 * result['saved_fraction']:.1f} %")
    lines.append("  energy by component (uJ):")
    total = result["energy_pj"] or 1.0
    for k, v in result["energy_breakdown"].items():
        if v:
            lines.append(f"    {k:<20s} {v / 1e6:10.3f}  {100 * v / total:5.1f} %")
    dense = result["dense_macs"] or 1
    lines.append(f"  MACs skipped by reason (of {dense:,} dense):")
    for r, v in result["skipped"].items():
        lines.append(f"    {r:<8s} {v:14,d}  {100 * v / dense:5.1f} %")
    lines.append(f"  weights sha256  {result['weights_sha256']}")
    lines.append(f"  wall time       {result['wall_s']:.1f} s")
    return "\n".join(lines)


def resume_config(checkpoint, preset, overrides):
    """The TrainConfig of a resumed run: the checkpoint's settings. Settings given on the
    command line must agree with them: with --preset, the preset and the options given must
    make exactly the checkpoint's settings; without it, each option given must equal the
    checkpoint's value. Raises ConfigError naming every setting that differs."""
    path = checkpoint.get("path", "")
    try:
        saved = make_config("baseline", **checkpoint["settings"])
    except (ConfigError, TypeError) as e:
        raise ConfigError(f"checkpoint {path} holds settings this ember cannot use: {e}") \
            from None
    given = {k: v for k, v in overrides.items() if v is not None}
    if preset is not None:
        asked = make_config(preset, **given)
    else:
        asked = dataclasses.replace(saved, **{k: tuple(v) if isinstance(v, list) else v
                                              for k, v in given.items()}).check()
    want, have = asked.to_dict(), saved.to_dict()
    diff = [k for k in (f.name for f in dataclasses.fields(TrainConfig)) if want[k] != have[k]]
    if diff:
        shown = ", ".join(f"{k} {want[k]!r} (checkpoint: {have[k]!r})" for k in diff)
        source = f"--preset {preset} and the options given" if preset else "the options given"
        raise ConfigError(f"--resume {path}: {source} differ from the checkpoint's settings: "
                          f"{shown}; give the same settings, or none to take the checkpoint's")
    return saved


def _check_output(path, option):
    """Fail before training, not after it, when an output cannot be written."""
    if path is None:
        return
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ConfigError(f"{option} {path}: directory {directory} does not exist")
    if os.path.isdir(path):
        raise ConfigError(f"{option} {path} is a directory; give a file name")


def cmd_train(args):
    if args.boards is not None or args.ports:
        try:
            from .fleet import cmd_train as fleet_train     # imports Ray: only for a fleet
        except ImportError as e:
            raise ConfigError(str(e)) from None
        return fleet_train(args)
    given = [f"--{k.replace('_', '-')}" for k in FLEET_OPTIONS if getattr(args, k) is not None]
    if given:
        raise ConfigError(f"{', '.join(given)} set(s) up a fleet; add --boards N or --ports")
    overrides = {k: getattr(args, k) for k in CONFIG_OPTIONS}
    checkpoint = load_checkpoint(args.resume) if args.resume else None
    if checkpoint is not None:
        cfg = resume_config(checkpoint, args.preset, overrides)
        preset = args.preset or (checkpoint.get("notes") or {}).get("preset")
    else:
        preset = args.preset or "baseline"
        cfg = make_config(preset, **overrides)
    for path, option in ((args.json, "--json"), (args.checkpoint, "--checkpoint"),
                         (args.plot, "--plot")):
        _check_output(path, option)
    if args.plot:
        plot.require_matplotlib()
    ds = data.load(cfg.dataset, split_seed=0)
    options = {}
    if args.backend == "sim":
        options = {"simulator": args.simulator, "uart": args.uart}
    elif args.backend == "board":
        options = {"port": args.port, "baud": args.baud}
    with open_device(args.backend, build=args.build, **options) as dev:
        result = Trainer(dev, ds, cfg, progress=not args.quiet, checkpoint=args.checkpoint,
                         resume=checkpoint, notes={"preset": preset}).run()
    reference = None
    if args.reference:
        reference = train_float(cfg, ds)
        result["float_reference"] = {"test_accuracy": reference["test_accuracy"],
                                     "train_accuracy": reference["train_accuracy"]}
    print(summary(result, reference))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2, sort_keys=True)
    if args.plot:
        plot.plot_run(result, args.plot, preset=preset)
    return 0


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        if args.command == "train":
            return cmd_train(args)
    except ConfigError as e:
        print(f"ember: error: {e}", file=sys.stderr)
        return 2
    except LinkError as e:
        # the device stopped answering or refused a request: say which, without a traceback
        print(f"ember: link error: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        hint = ""
        if getattr(args, "checkpoint", None) and os.path.exists(args.checkpoint):
            hint = f"; go on with the same command and --resume {args.checkpoint}"
        print(f"ember: interrupted{hint}", file=sys.stderr)
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
