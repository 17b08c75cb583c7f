"""Export a trained network to a plain NumPy file, and run it without Ember.

`write_export(checkpoint, path)` writes an .npz (docs/api.md, "Export format") with the
integer weights and their formats, the per-layer forward shifts, the input scaling fitted on
the training split, and float equivalents of the weights. `predict_numpy` is the NumPy-only
inference that docs/api.md quotes verbatim: from the file alone it gives the engine's
predictions bit for bit (tests/test_export.py compares it with a device).
"""

import numpy as np

from . import golden, spec
from .spec import ConfigError

EXPORT_FORMAT = "ember-export"
EXPORT_VERSION = 1


def forward_shifts(layers):
    """The forward shifts the trainer's networks use: spec.HIDDEN_SHIFT for every hidden
    layer, spec.OUTPUT_SHIFT for the output layer (the device's defaults)."""
    return [spec.HIDDEN_SHIFT] * (len(layers) - 2) + [spec.OUTPUT_SHIFT]


def export_arrays(layers, weights, scaling):
    """The arrays of an export file (see docs/api.md, "Export format")."""
    weights = golden.check_weights(list(layers), weights)
    if scaling is None:
        raise ConfigError("the network has no stored input scaling (a version 1 checkpoint "
                          "of a data set of one's own); resume it (ember train --resume) to "
                          "write one that does")
    if scaling.features != layers[0]:
        raise ConfigError(f"the input scaling has {scaling.features} features; the network "
                          f"takes {layers[0]} inputs")
    arrays = {
        "format": np.array(EXPORT_FORMAT), "version": np.array(EXPORT_VERSION),
        "layers": np.array(layers, dtype=np.int64),
        "shifts": np.array(forward_shifts(layers), dtype=np.int64),
        "weight_format": np.array(f"Q{spec.WEIGHT_BITS - spec.WEIGHT_FRAC_BITS - 1}."
                                  f"{spec.WEIGHT_FRAC_BITS}"),
        "weight_frac_bits": np.array(spec.WEIGHT_FRAC_BITS),
        "input_format": np.array(f"UQ{spec.ACT_BITS - spec.ACT_FRAC_BITS}.{spec.ACT_FRAC_BITS}"),
        "act_bits": np.array(spec.ACT_BITS), "act_frac_bits": np.array(spec.ACT_FRAC_BITS),
        "logit_format": np.array(f"Q{spec.LOGIT_BITS - spec.LOGIT_FRAC_BITS - 1}."
                                 f"{spec.LOGIT_FRAC_BITS}"),
        "logit_bits": np.array(spec.LOGIT_BITS), "logit_frac_bits": np.array(spec.LOGIT_FRAC_BITS),
        "scaling_kind": np.array(scaling.kind),
        "scaling_offset": np.asarray(scaling.offset, dtype=np.float64),
        "scaling_scale": np.asarray(scaling.scale, dtype=np.float64),
        "scaling_base": np.array(float(scaling.base)),
        "weights_sha256": np.array(golden.weights_sha256(weights)),
    }
    for l, w in enumerate(weights):
        arrays[f"weights_{l}"] = w.astype(np.int16)
        arrays[f"float_weights_{l}"] = (w.astype(np.float64) /
                                        (1 << spec.WEIGHT_FRAC_BITS)).astype(np.float32)
    return arrays


def write_export(checkpoint, path):
    """Write checkpoint `checkpoint` (from trainer.load_checkpoint) as an export .npz."""
    arrays = export_arrays(checkpoint["settings"]["layers"], checkpoint["weights"],
                           checkpoint["input_scaling"])
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return arrays


def predict_numpy(path, x):
    """Predicted class of every raw sample in x (samples, features), from an export file
    alone: the engine's integer inference (docs/numerics.md), bit for bit."""
    f = np.load(path)
    act_max = (1 << int(f["act_bits"])) - 1
    logit_max = (1 << (int(f["logit_bits"]) - 1)) - 1
    # the input scaling fitted on the training split, then UQ2.6 bytes
    real = (np.asarray(x, dtype=np.float64) - f["scaling_offset"]) / f["scaling_scale"] \
        + f["scaling_base"]
    a = np.clip(np.round(real * (1 << int(f["act_frac_bits"]))), 0, act_max).astype(np.int64)
    n_layers = len(f["layers"]) - 1
    for l in range(n_layers):
        z = a @ f[f"weights_{l}"].astype(np.int64).T
        s = int(f["shifts"][l])
        if s:   # round to nearest, ties away from zero
            z = (z + (1 << (s - 1)) - (z < 0)) >> s
        if l < n_layers - 1:
            a = np.clip(z, 0, act_max)                     # ReLU, saturated to UQ2.6
        else:
            a = np.clip(z, -logit_max - 1, logit_max)      # Q7.8 logits
    return a.argmax(axis=1)     # ties go to the lowest class, as on the engine
