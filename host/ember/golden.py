"""The golden model: Ember's integer arithmetic and event accounting, in numpy.

This module *is* the specification that docs/numerics.md describes in prose: the gateware is
tested against these functions bit for bit, and every backend must reproduce the counters that
`GoldenModel` produces. All arithmetic is exact integer arithmetic on int64 arrays; nothing
here uses floating point.

Layer l (0-based here, 1-based in the docs) has K = layers[l] inputs and N = layers[l+1]
outputs; its weights are an (N, K) int16 matrix. Lane p of the MAC array holds output neuron
j*P + p of block j.
"""

import numpy as np

from . import spec
from .spec import ConfigError, StepSettings

_I64 = np.int64


# --- Arithmetic primitives (each has a gateware twin in hw/) ------------------------------------

def round_shift(x, shift):
    """Arithmetic right shift by `shift` >= 0, rounding to nearest with ties away from zero.

    Hardware: add 2**(shift-1), minus one when x is negative, then shift (no divider).
    """
    x = np.asarray(x, dtype=_I64)
    if shift == 0:
        return x.copy()
    return (x + ((1 << (shift - 1)) - (x < 0))) >> shift


def saturate(x, bits, signed=True):
    """Clamp to the range of a `bits`-wide signed (or unsigned) integer."""
    if signed == "symmetric":
        lo, hi = -(1 << (bits - 1)) + 1, (1 << (bits - 1)) - 1
    elif signed:
        lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    else:
        lo, hi = 0, (1 << bits) - 1
    return np.clip(np.asarray(x, dtype=_I64), lo, hi)


def bit_length(m):
    """Bits needed for the non-negative integer m (0 for 0): a leading-one detector."""
    return int(m).bit_length()


def requantize(acc, shift, relu):
    """Accumulator -> next layer's input: round-shift, then ReLU and saturate to UQ2.6 bytes
    (hidden layers) or saturate to Q7.8 logits (output layer)."""
    y = round_shift(acc, shift)
    if relu:
        return saturate(y, spec.ACT_BITS, signed=False)
    return saturate(y, spec.LOGIT_BITS)


def softmax_grad(logits, labels):
    """On-device softmax cross-entropy gradient: probabilities minus one-hot, Q0.15 int16.

    logits: (B, N) Q7.8 integers; labels: (B,) class indices.
    Steps (each an integer operation in the loss unit):
      d = max(logits) - logit            (>= 0, Q8.8)
      t = (d * LOG2E_NUM) >> LOG2E_SHIFT (base-2 exponent, 8 fraction bits)
      e = EXP2_TABLE[top 4 fraction bits of t] >> integer part of t   (0 when that is >= 16)
      S = sum(e);  r = floor(2**31 / S);  p = (e * r + 2**15) >> 16
      g = p - 2**15 * onehot, saturated to int16
    """
    z = np.asarray(logits, dtype=_I64)
    d = z.max(axis=1, keepdims=True) - z
    t = (d * spec.LOG2E_NUM) >> spec.LOG2E_SHIFT
    whole = t >> spec.LOGIT_FRAC_BITS
    frac = (t >> (spec.LOGIT_FRAC_BITS - spec.EXP2_FRAC_BITS)) & ((1 << spec.EXP2_FRAC_BITS) - 1)
    table = np.array(spec.EXP2_TABLE, dtype=_I64)
    e = np.where(whole < 16, table[frac] >> np.minimum(whole, 15), 0)
    total = e.sum(axis=1, keepdims=True)
    recip = (1 << spec.RECIP_BITS) // total
    p = (e * recip + (1 << 15)) >> 16
    onehot = np.zeros_like(p)
    onehot[np.arange(len(p)), np.asarray(labels, dtype=_I64)] = 1 << spec.OUT_GRAD_FRAC_BITS
    return saturate_grad(p - onehot)


def saturate_grad(x):
    """Gradients dY are sign-magnitude in memory: 16 bits, symmetric range +-32767."""
    return saturate(x, spec.GRAD_BITS, signed="symmetric")


def argmax_first(x):
    """Row-wise argmax; ties go to the lowest index (what the comparator chain does)."""
    return np.asarray(x).argmax(axis=1)


def lfsr_sequence(seed, count):
    """`count` successive states of the 16-bit Galois LFSR (taps spec.LFSR_TAPS) after `seed`,
    and the state after the last one (the random variant's channel scores)."""
    out = np.empty(count, dtype=_I64)
    s = seed
    for i in range(count):
        lsb = s & 1
        s >>= 1
        if lsb:
            s ^= spec.LFSR_TAPS
        out[i] = s
    return out, s


def keep_count(n, keep_q8):
    """Channels ssProp keeps out of n: max(1, floor(n * keep_q8 / 256)); all when dense."""
    if keep_q8 >= spec.KEEP_ONE:
        return n
    return max(1, (n * keep_q8) >> 8)


def select_channels(scores, k):
    """Boolean mask of the k channels with the largest scores; among equal scores the lower
    index wins (the selector's threshold search followed by an in-order fill)."""
    scores = np.asarray(scores, dtype=_I64)
    order = np.lexsort((np.arange(len(scores)), -scores))
    kept = np.zeros(len(scores), dtype=bool)
    kept[order[:k]] = True
    return kept


def psg_predict(dy, a):
    """Low-precision weight-gradient estimate from the stored MSB slices, summed over the batch:
    sign(dY) * (|dY| >> 8) (the sign and top 7 magnitude bits of the sign-magnitude gradient,
    so it truncates toward zero) times A >> 4 (the top 4 bits of the activation).

    dy: (B, N) gradients; a: (B, K) uint8 activations. Returns (N, K) integers in
    predictor units (one unit = 2**12 full-precision units)."""
    dy = np.asarray(dy, dtype=_I64)
    hi_dy = np.sign(dy) * (np.abs(dy) >> (spec.GRAD_BITS - spec.PSG_GRAD_MSBS))
    hi_a = np.asarray(a, dtype=_I64) >> (spec.ACT_BITS - spec.PSG_ACT_MSBS)
    return hi_dy.T @ hi_a


def sgd_update(w, g, shift):
    """Baseline integer SGD: W - round(G >> shift), saturated to int16."""
    return saturate(np.asarray(w, dtype=_I64) - round_shift(g, shift), spec.WEIGHT_BITS)


def sign_update(w, sign, step_shift):
    """PSG update: W - sign * 2**step_shift, saturated to int16."""
    return saturate(np.asarray(w, dtype=_I64) - (np.asarray(sign, dtype=_I64) << step_shift),
                    spec.WEIGHT_BITS)


def dense_macs_per_sample(layers):
    """MACs of one dense training sample: forward, weight gradient, and input gradient of every
    layer but the first (the baseline every 'skipped' figure is measured against)."""
    nk = [k * n for k, n in zip(layers[:-1], layers[1:])]
    return 2 * sum(nk) + sum(nk[1:])


def weights_sha256(weights):
    """SHA-256 of the weights in canonical order: layer by layer from the input side, each
    (N, K) matrix row-major, each weight little-endian int16."""
    import hashlib
    h = hashlib.sha256()
    for w in weights:
        h.update(np.ascontiguousarray(w, dtype="<i2").tobytes())
    return h.hexdigest()


def init_weights(layers, seed):
    """He-normal initial weights in Q1.14, from a seeded numpy Generator (host side)."""
    rng = np.random.default_rng(seed)
    out = []
    for k, n in zip(layers[:-1], layers[1:]):
        w = rng.normal(0.0, np.sqrt(2.0 / k), size=(n, k)) * (1 << spec.WEIGHT_FRAC_BITS)
        out.append(saturate(np.round(w), spec.WEIGHT_BITS).astype(np.int16))
    return out


def check_batch(layers, build, x, y=None, max_samples=None, what="batch"):
    """Validate a batch (inputs, optional labels) for a network on a build; returns int64
    arrays. Raises ConfigError naming the value and the limit. max_samples: the most samples
    it may hold (None: the build's max_batch); `what` names it in the errors (a resident
    data split is checked the same way)."""
    x = np.asarray(x)
    limit = build.max_batch if max_samples is None else max_samples
    if x.ndim != 2 or x.shape[1] != layers[0]:
        raise ConfigError(f"{what} has shape {x.shape}; expected (B, {layers[0]})")
    if not 1 <= len(x) <= limit:
        raise ConfigError(f"{what} of {len(x)} samples is outside 1..{limit}")
    if not np.issubdtype(x.dtype, np.integer) or x.min() < 0 or x.max() > spec.ACT_MAX:
        raise ConfigError(f"inputs must be integers in 0..{spec.ACT_MAX} (UQ2.6); got "
                          f"{x.dtype} in {x.min()}..{x.max()}")
    x = x.astype(_I64)
    if y is not None:
        y = np.asarray(y)
        if y.shape != (len(x),):
            raise ConfigError(f"labels have shape {y.shape}; expected ({len(x)},)")
        if not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= layers[-1]:
            raise ConfigError(f"labels span {y.min()}..{y.max()}; the output layer has "
                              f"{layers[-1]} classes")
        y = y.astype(_I64)
    return x, y


def check_weights(layers, weights):
    """Validate weight matrices for a network; returns them as int16 arrays."""
    shapes = [(n, k) for k, n in zip(layers[:-1], layers[1:])]
    if len(weights) != len(shapes):
        raise ConfigError(f"got {len(weights)} weight matrices; the network has "
                          f"{len(shapes)} layers")
    out = []
    for i, (w, shape) in enumerate(zip(weights, shapes)):
        w = np.asarray(w)
        if w.shape != shape:
            raise ConfigError(f"layer {i} weights have shape {w.shape}; expected {shape}")
        if not np.issubdtype(w.dtype, np.integer):
            raise ConfigError(f"layer {i} weights are {w.dtype}; expected integers (Q1.14)")
        if w.size and (w.min() < -32768 or w.max() > 32767):
            raise ConfigError(f"layer {i} weights span {w.min()}..{w.max()}; int16 holds "
                              "-32768..32767")
        out.append(w.astype(np.int16))
    return out


# --- The model -----------------------------------------------------------------------------------

class GoldenModel:
    """Bit-exact integer model of one engine build: weights, training steps and counters.

    Use `configure`, `load_weights`, then `train_batch` / `infer`. `counters` is a dict keyed
    by spec.COUNTERS (cycle counters stay zero: the model does not time anything).
    """

    def __init__(self, build=spec.DEFAULT_BUILD):
        self.build = build
        self.layers = None
        self.weights = None
        self.shifts = None
        self.counters = dict.fromkeys(spec.COUNTERS, 0)

    # configuration and state
    def configure(self, layers, shifts=None):
        """Set the network (widths, input first) and optional per-layer forward shifts."""
        layers = spec.check_network(layers, self.build)
        n = len(layers) - 1
        if shifts is None:
            shifts = [spec.HIDDEN_SHIFT] * (n - 1) + [spec.OUTPUT_SHIFT]
        shifts = [int(s) for s in shifts]
        if len(shifts) != n or any(not 0 <= s <= 31 for s in shifts):
            raise ConfigError(f"forward shifts {shifts} must be {n} values in 0..31")
        self.layers, self.shifts = layers, shifts
        self.weights = [np.zeros((b, a), dtype=np.int16) for a, b in zip(layers, layers[1:])]

    def load_weights(self, weights):
        """Replace all weights; shapes and ranges are checked before anything changes."""
        self._need_config()
        self.weights = check_weights(self.layers, weights)

    def read_weights(self):
        self._need_config()
        return [w.copy() for w in self.weights]

    def clear_counters(self):
        self.counters = dict.fromkeys(spec.COUNTERS, 0)

    def _need_config(self):
        if self.layers is None:
            raise ConfigError("the device has no network configured; call configure() first")

    @property
    def samples(self):
        """The build's lanes run over samples (engine v2's dataflow, spec.Build.dataflow)."""
        return self.build.dataflow == "samples"

    def _live_steps(self, live):
        """Engine v2: the (sample block, k) steps of a pass with a live lane, each a weight
        read (live: (B, K) booleans, None for every lane live)."""
        lanes = self.build.lanes
        if live is None:
            return -(-len(self.x_rows) // lanes) * self.x_cols
        B, K = live.shape
        S = -(-B // lanes)
        pad = np.zeros((S * lanes, K), dtype=bool)
        pad[:B] = live
        return int(pad.reshape(S, lanes, K).any(axis=1).sum())

    @staticmethod
    def _held_reads(k, batch):
        """Engine v2's weight gradient: a kept channel's dY entries read by the lanes, once
        per sample and group of spec.GRAD_HOLD inputs (the word is held for the group)."""
        return -(-k // spec.GRAD_HOLD) * batch

    def check_batch(self, x, y=None):
        """Validate a batch against the network and the build; returns int64 arrays."""
        self._need_config()
        return check_batch(self.layers, self.build, x, y)

    # the passes
    def _forward(self, x, zero_skip):
        """Forward pass over the batch; returns the inputs of every layer and the logits."""
        c, lanes = self.counters, self.build.lanes
        acts = [x]
        a = x
        for l, (w, shift) in enumerate(zip(self.weights, self.shifts)):
            n, k = w.shape
            blocks = -(-n // lanes)
            last = l == len(self.weights) - 1
            live = (a != 0).sum(axis=1) if zero_skip else np.full(len(a), k)
            cycles = int(live.sum())
            c["mac_forward"] += n * cycles
            c["skip_zero"] += n * (a.size - cycles)
            if self.samples:
                # one weight per (sample block, k) with a live lane, for every output; each
                # live lane reads its own activation
                c["weight_reads"] += n * self._live_steps(a != 0 if zero_skip
                                                           else np.ones(a.shape, dtype=bool))
                c["act_reads"] += n * a.size
            else:
                c["weight_reads"] += n * cycles          # one 16-bit lane read per MAC
                c["act_reads"] += blocks * a.size        # zero or not, A[k] is read to know
            z = a @ w.T.astype(_I64)
            a = requantize(z, shift, relu=not last)
            if last:
                c["grad_writes"] += a.size
            else:
                c["act_writes"] += a.size
                acts.append(a)
        return acts, a

    def _loss(self, logits, labels):
        c = self.counters
        c["loss_elements"] += logits.size
        c["grad_reads"] += 3 * logits.size
        c["grad_writes"] += logits.size
        return softmax_grad(logits, labels)

    def infer(self, x):
        """Forward only (zero skipping on); returns the predicted class of every sample."""
        x, _ = self.check_batch(x)
        self.counters["act_writes"] += x.size
        _, logits = self._forward(x, zero_skip=True)
        self.counters["grad_reads"] += logits.size          # the argmax pass
        self.counters["infer_samples"] += len(x)
        return argmax_first(logits)

    def train_batch(self, x, y, settings=StepSettings()):
        """One training step on a batch. Returns the number of samples the forward pass
        classified correctly (before the update)."""
        x, y = self.check_batch(x, y)
        n_layers = len(self.weights)
        settings.check(n_layers, self.build)
        mask = settings.mask(n_layers)
        c, lanes = self.counters, self.build.lanes
        zs = settings.zero_skip
        c["act_writes"] += x.size                      # the link fills the input buffer
        acts, logits = self._forward(x, zs)
        correct = int((argmax_first(logits) == y).sum())
        dy = self._loss(logits, y)
        batch = len(x)
        correction = 0                                  # update-shift correction of layer l
        lfsr = settings.lfsr_seed
        for l in range(n_layers - 1, -1, -1):
            w = self.weights[l].astype(_I64)
            n, k = w.shape
            a = acts[l]
            do_wgrad = mask[l]
            do_igrad = l > 0 and any(mask[:l])
            full = batch * n * k
            if not do_wgrad:
                c["skip_slu"] += full
            if l > 0 and not do_igrad:
                c["skip_slu"] += full
            if not (do_wgrad or do_igrad):
                continue
            # ssProp channel selection
            keep = keep_count(n, settings.keep_q8)
            if keep < n:
                if settings.ssprop_random:
                    scores, lfsr = lfsr_sequence(lfsr, n)
                else:
                    scores = np.abs(dy).sum(axis=0)
                    c["grad_reads"] += dy.size
                kept = select_channels(scores, keep)
            else:
                kept = np.ones(n, dtype=bool)
            dropped = n - keep
            c["skip_ssprop"] += batch * dropped * k * (int(do_wgrad) + int(do_igrad))
            pad = -(-n // lanes) * lanes
            kept_lanes = np.zeros(pad, dtype=bool)
            kept_lanes[:n] = kept
            live_blocks = int(kept_lanes.reshape(-1, lanes).any(axis=1).sum())
            dy_kept = np.where(kept[None, :], dy, 0)
            # input gradient first: it uses the weights before this step's update
            if do_igrad:
                relu_live = a > 0
                live = relu_live if zs else np.ones_like(relu_live)
                n_live = int(live.sum())
                c["mac_input_grad"] += keep * n_live
                c["skip_zero"] += keep * (a.size - n_live)
                c["weight_reads"] += keep * (self._live_steps(live) if self.samples else n_live)
                c["grad_lane_reads"] += keep * n_live
                c["act_reads"] += a.size
                c["grad_writes"] += a.size
                dx = saturate(dy_kept @ w, spec.DX_BITS)
                dx = np.where(relu_live, dx, 0)
                shift = max(0, bit_length(np.abs(dx).max()) - (spec.GRAD_BITS - 1))
                c["grad_reads"] += a.size
                c["grad_writes"] += a.size
                dy_below = saturate_grad(round_shift(dx, shift))
            # weight gradient and update of the kept rows
            if do_wgrad:
                live_b = (a != 0) if zs else np.ones(a.shape, dtype=bool)
                per_k = live_b.sum(axis=0)               # batch cycles for each input k
                cycles = int(per_k.sum())
                c["skip_zero"] += keep * (a.size - cycles)
                if settings.psg:
                    passes = 2 if settings.psg_relative else 1
                    c["mac_weight_grad_low"] += passes * keep * cycles
                    c["act_msb_reads"] += passes * (keep if self.samples else live_blocks) * a.size
                    c["grad_msb_lane_reads"] += passes * keep * (
                        self._held_reads(k, batch) if self.samples else cycles)
                    pred = psg_predict(dy_kept, a)
                    mag = np.abs(pred)
                    if settings.psg_relative:
                        tau = int(mag[kept].max()) >> settings.psg_tau
                    else:
                        tau = settings.psg_tau
                    confident = (mag > tau) & kept[:, None]
                    uncertain = ~confident & kept[:, None]
                    unc_pad = np.zeros((pad, k), dtype=bool)
                    unc_pad[:n] = uncertain
                    words = unc_pad.reshape(-1, lanes, k).any(axis=1)   # (blocks, K)
                    recompute = (int(uncertain.sum()) if self.samples else int(words.sum())) * batch
                    full_macs = int((uncertain * per_k[None, :]).sum())
                    c["act_reads"] += recompute
                    if self.samples:
                        # a group of inputs with an uncertain one reads its dY words again
                        groups = -(-k // spec.GRAD_HOLD)
                        pad = np.zeros((n, groups * spec.GRAD_HOLD), dtype=bool)
                        pad[:, :k] = uncertain
                        c["grad_lane_reads"] += batch * int(
                            pad.reshape(n, groups, spec.GRAD_HOLD).any(axis=2).sum())
                    else:
                        c["grad_lane_reads"] += full_macs
                    c["mac_weight_grad"] += full_macs
                    c["skip_psg"] += int((confident * per_k[None, :]).sum())
                    g_full = dy_kept.T @ a
                    sign = np.where(confident, np.sign(pred), np.sign(g_full))
                    new = sign_update(w, sign, settings.psg_step_shift)
                else:
                    c["mac_weight_grad"] += keep * cycles
                    c["act_reads"] += (keep if self.samples else live_blocks) * a.size
                    c["grad_lane_reads"] += keep * (self._held_reads(k, batch) if self.samples
                                                    else cycles)
                    g = dy_kept.T @ a
                    shift_upd = min(max(settings.lr_shift + correction, 0),
                                    spec.UPDATE_SHIFT_MAX)
                    new = sgd_update(w, g, shift_upd)
                new = np.where(kept[:, None], new, w)
                c["weight_reads"] += keep * k
                c["weight_writes"] += int((new != w).sum())     # write enable: changed only
                self.weights[l] = new.astype(np.int16)
            if do_igrad:
                correction += spec.WEIGHT_FRAC_BITS - shift
                dy = dy_below
        c["batches"] += 1
        c["samples"] += batch
        return correct


def dense_gradients(weights, shifts, x, y):
    """Full-precision integer weight gradients of a dense step (no skipping), without
    updating anything: a list of (N, K) arrays, and the dY of every layer. For comparing with
    the float reference and for unit tests of the gateware's GEMM phases."""
    x = np.asarray(x, dtype=_I64)
    acts, a = [x], x
    for l, (w, s) in enumerate(zip(weights, shifts)):
        a = requantize(a @ np.asarray(w, dtype=_I64).T, s, relu=l < len(weights) - 1)
        acts.append(a)
    dy = softmax_grad(acts[-1], y)
    grads, dys = [None] * len(weights), [None] * len(weights)
    for l in range(len(weights) - 1, -1, -1):
        grads[l], dys[l] = dy.T @ acts[l], dy
        if l:
            dx = saturate(dy @ np.asarray(weights[l], dtype=_I64), spec.DX_BITS)
            dx = np.where(acts[l] > 0, dx, 0)
            shift = max(0, bit_length(np.abs(dx).max()) - (spec.GRAD_BITS - 1))
            dy = saturate_grad(round_shift(dx, shift))
    return grads, dys
