"""The `ember` command: train a network on a device backend and report accuracy and energy;
predict with a trained network; export it for use without Ember."""

import argparse
import dataclasses
import json
import os
import sys

import numpy as np

from . import __version__, data, export, plot, spec
from .device import BACKENDS, open_device
from .federated import COMBINES, SPLITS
from .policies import (DEFAULT_HIDDEN, KEEP_SCHEDULES, PRESETS, SLU_POLICIES, SSPROP_VARIANTS,
                       TrainConfig, make_config)
from .protocol import LinkError
from .reference import train_float
from .spec import ConfigError
from .trainer import RESIDENT_MODES, Trainer, check_fit, load_checkpoint, resident_plan


def _layers(text):
    try:
        widths = tuple(int(w) for w in text.split("-"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"layers '{text}' must look like 64-32-10") from None
    return widths


def _widths(text):
    try:
        widths = tuple(int(w) for w in text.split(",") if w)
    except ValueError:
        raise argparse.ArgumentTypeError(f"hidden widths '{text}' must look like 64,32") \
            from None
    return widths


def _fractions(text):
    try:
        return tuple(float(v) for v in text.split(",") if v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' must be comma-separated fractions") from None


def _bool_flag(p, name, help):
    p.add_argument(f"--{name}", dest=name.replace("-", "_"), action=argparse.BooleanOptionalAction,
                   default=None, help=help)


def add_device_options(p):
    """The options that choose and open a device (train and predict share them)."""
    p.add_argument("--backend", choices=BACKENDS, default="model",
                   help="model (golden model), sim (simulated board), board (real board)")
    p.add_argument("--simulator", choices=("verilator", "icarus"), default="verilator",
                   help="simulator of the sim backend")
    p.add_argument("--uart", action="store_true",
                   help="sim backend: every byte crosses the engine's UART as bits")
    p.add_argument("--port", help="board backend: serial port name or pyserial URL")
    bauds = ", ".join(f"{board} {baud}" for board, baud in spec.board_bauds().items())
    p.add_argument("--baud", type=int, default=None,
                   help=f"board backend: baud rate (default: the rate of Ember's board "
                        f"bitstreams, {bauds}; the board's BAUD register must match it)")
    p.add_argument("--build", choices=sorted(spec.BUILDS), default="sim",
                   help="engine build whose limits and lane count apply (default: sim)")


def device_options(args):
    """open_device's backend-specific keyword arguments from the parsed options."""
    if args.backend == "sim":
        return {"simulator": args.simulator, "uart": args.uart}
    if args.backend == "board":
        return {"port": args.port, "baud": args.baud}
    return {}


def build_parser():
    ap = argparse.ArgumentParser(prog="ember", description=__doc__)
    ap.add_argument("--version", action="version", version=f"ember {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a network on a device and report energy")
    add_device_options(t)
    t.add_argument("--preset", choices=list(PRESETS),
                   help="named bundle of settings (default baseline); the options below "
                        "override it")
    t.add_argument("--epochs", type=int)
    t.add_argument("--batch-size", type=int)
    t.add_argument("--layers", type=_layers,
                   help="widths, input first (default: the data set's features, --hidden, "
                        "its classes: 64-32-10 for digits)")
    t.add_argument("--hidden", type=_widths,
                   help=f"hidden widths between the data set's ends, e.g. 32 or 64,32 "
                        f"(default {','.join(map(str, DEFAULT_HIDDEN))})")
    t.add_argument("--seed", type=int)
    t.add_argument("--dataset", help="'digits' (default) or a .npz file with arrays X and y")
    t.add_argument("--scaling", help=f"per-feature input scaling fitted on the training split: "
                                     f"{' | '.join(data.SCALINGS)} (default minmax)")
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
    t.add_argument("--profile", help="energy profile name or JSON path (default: the build's "
                   "board profile, ice40up5k on the iCEBreaker, ecp5-85f on the ULX3S, else "
                   "horowitz45)")
    t.add_argument("--resident", choices=RESIDENT_MODES, default="auto",
                   help="keep the data in the device's resident data memory and train each "
                        "epoch with one command (on), stream every batch (off), or keep "
                        "what fits the build (auto, the default); the same weights and "
                        "counters either way, only the link bytes differ")
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

    p = sub.add_parser("predict", help="predict with a trained network (a checkpoint) on a "
                                       "device; print the predictions and the accuracy")
    p.add_argument("--checkpoint", metavar="PATH", required=True,
                   help="a checkpoint written by ember train --checkpoint")
    p.add_argument("--dataset", required=True,
                   help="'digits' or a .npz file with X (and y, for the accuracy)")
    p.add_argument("--split", choices=("all", "train", "test"), default="all",
                   help="which samples: all (default), or the training run's train or test "
                        "split of the data set")
    add_device_options(p)
    p.add_argument("--json", metavar="PATH", help="write predictions and accuracy as JSON")

    e = sub.add_parser("export", help="write a checkpoint's network as a NumPy .npz: integer "
                                      "weights, formats, shifts, input scaling, float weights")
    e.add_argument("--checkpoint", metavar="PATH", required=True,
                   help="a checkpoint written by ember train --checkpoint")
    e.add_argument("--out", metavar="PATH", required=True, help="the .npz to write")
    return ap


FLEET_OPTIONS = ("rounds", "combine", "split", "alpha", "round_timeout", "ray_address")


CONFIG_OPTIONS = ("epochs", "batch_size", "layers", "seed", "dataset", "scaling", "lr_shift",
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
    others = {k: r for k, r in result.get("energy_by_profile", {}).items()
              if k != result["profile"]}
    for name, r in others.items():
        lines.append(f"  under {name:<16s} {r['energy_pj'] / 1e6:10.3f} uJ  -> saved "
                     f"{100 * r['saved_fraction']:.1f} % (compute and memory)")
    lines.append(f"  energy by component (uJ, profile {result['profile']}):")
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
        if asked.layers is None:
            # the network's ends come from the data, which must be the checkpoint's (its
            # data_sha256 is checked before training)
            asked = dataclasses.replace(asked, layers=saved.layers)
        if "scaling" not in given:
            # no preset sets the scaling: not given means the checkpoint's (for a version 1
            # checkpoint, the one-range scaling it was trained with)
            asked = dataclasses.replace(asked, scaling=saved.scaling)
        if "profile" not in given:
            # likewise the profile: not given means the one the run resolved (its build's)
            asked = dataclasses.replace(asked, profile=saved.profile)
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
        if args.resident == "on":
            # a fleet's devices train shards round by round through train_batch
            raise ConfigError("--resident on trains one device; a fleet (--boards, --ports) "
                              "streams its batches: use --resident auto or off")
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
    ds = data.load(cfg.dataset, split_seed=0, scaling=cfg.scaling)
    cfg = cfg.for_data(ds, args.hidden)
    if args.backend != "board":
        # --build is the device's build: refuse what it cannot take before starting it (a
        # board's build is read from the board; the Trainer checks it before training)
        resident_plan(args.resident, ds, check_fit(cfg, ds, spec.BUILDS[args.build]),
                      spec.BUILDS[args.build])
    with open_device(args.backend, build=args.build, **device_options(args)) as dev:
        result = Trainer(dev, ds, cfg, progress=not args.quiet, checkpoint=args.checkpoint,
                         resume=checkpoint, notes={"preset": preset},
                         resident=args.resident).run()
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


def prediction_samples(dataset, split, source):
    """Raw samples X and labels y (None if the file has none) of `dataset` ('digits' or an
    .npz path); split 'train' or 'test' picks the split a training run on it used."""
    if dataset in (None, "digits"):
        x, y = data.digits_arrays()
    else:
        x, y, _ = data.read_npz(dataset)
    x = data.check_samples(x, dataset)
    if split != "all":
        if y is None:
            raise ConfigError(f"--split {split}: data set {dataset} has no labels y, so it "
                              f"has no training split; use --split all")
        x, y, _ = data.validate(x, y, dataset)
        xtr, ytr, xte, yte = data.split(x, y, 0.2, 0)
        x, y = (xtr, ytr) if split == "train" else (xte, yte)
    elif y is not None:
        y = np.asarray(y)
        if y.shape != (len(x),) or not np.issubdtype(y.dtype, np.integer):
            raise ConfigError(f"{source}: y has shape {y.shape} and dtype {y.dtype}; expected "
                              f"({len(x)},) integer labels to match X")
    return x, y


def network_of(checkpoint):
    """Layers, weights and input scaling of a checkpoint; ConfigError if it has no scaling."""
    if checkpoint["input_scaling"] is None:
        raise ConfigError(f"checkpoint {checkpoint['path']} was written by ember 0.1 for a data "
                          f"set of one's own and holds no input scaling; resume it "
                          f"(ember train --resume) to write one that does")
    return checkpoint["settings"]["layers"], checkpoint["weights"], checkpoint["input_scaling"]


def check_samples_fit(layers, x, checkpoint, dataset):
    """A checkpoint's network must take the data set's features."""
    if x.shape[1] != layers[0]:
        raise ConfigError(f"checkpoint {checkpoint} holds network {'-'.join(map(str, layers))},"
                          f" which takes {layers[0]} inputs; data set {dataset} has "
                          f"{x.shape[1]} features")


def cmd_predict(args):
    """ember predict: the checkpoint's network on a device, over a data set's raw samples."""
    checkpoint = load_checkpoint(args.checkpoint)
    layers, weights, scaling = network_of(checkpoint)
    _check_output(args.json, "--json")
    x, y = prediction_samples(args.dataset, args.split, args.dataset)
    check_samples_fit(layers, x, args.checkpoint, args.dataset)
    if args.backend != "board":
        spec.check_network(layers, spec.BUILDS[args.build])
    inputs = scaling.apply(x)
    with open_device(args.backend, build=args.build, **device_options(args)) as dev:
        dev.configure(layers)
        dev.load_weights(weights)
        predicted = dev.infer_all(inputs)
    print("sample  predicted" + ("  label" if y is not None else ""))
    for i, p in enumerate(predicted):
        print(f"{i:6d}  {int(p):9d}" + (f"  {int(y[i]):5d}" if y is not None else ""))
    result = {"checkpoint": args.checkpoint, "dataset": args.dataset, "split": args.split,
              "samples": len(x), "predictions": [int(p) for p in predicted]}
    if y is not None:
        correct = int((predicted == y).sum())
        result["accuracy"] = correct / len(y)
        print(f"accuracy {100 * result['accuracy']:.2f} % ({correct} of {len(y)} samples, "
              f"{args.split} of {args.dataset}, network {'-'.join(map(str, layers))})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


def cmd_export(args):
    """ember export: the checkpoint's network as an .npz (docs/api.md, "Export format")."""
    checkpoint = load_checkpoint(args.checkpoint)
    layers, _, scaling = network_of(checkpoint)
    _check_output(args.out, "--out")
    arrays = export.write_export(checkpoint, args.out)
    print(f"wrote {args.out}: network {'-'.join(map(str, layers))}, weights "
          f"{arrays['weight_format']} int16, inputs {arrays['input_format']} with "
          f"{scaling.kind} scaling of {scaling.features} features, shifts "
          f"{arrays['shifts'].tolist()}, weights sha256 {arrays['weights_sha256']}")
    return 0


COMMANDS = {"train": cmd_train, "predict": cmd_predict, "export": cmd_export}


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        if args.command in COMMANDS:
            return COMMANDS[args.command](args)
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
