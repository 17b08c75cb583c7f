"""A float32 reference trainer for the same networks, to show what quantization costs.

Same architecture as the engine (dense, bias-free, ReLU, softmax cross-entropy), same initial
weights (the integer ones divided by 2**14), same inputs (the data set's per-feature scaling
and UQ2.6 bytes, divided by 64), same shuffles and the same learning-rate schedule: the
integer update shift s corresponds to a float learning rate of 2**-(s - 7) on the gradient
summed over the batch (docs/numerics.md, "Update").
"""

import numpy as np

from . import spec
from .golden import init_weights
from .policies import STREAM_INIT, STREAM_SHUFFLE, epoch_settings, rng
from .schedule import draw_order

#: lr_shift s <-> float step 2**-(s - LR_OFFSET) on the batch-summed gradient
LR_OFFSET = spec.OUT_GRAD_FRAC_BITS + spec.ACT_FRAC_BITS - spec.WEIGHT_FRAC_BITS


class FloatNet:
    """Float32 twin of the integer network."""

    def __init__(self, layers, seed):
        self.weights = [w.astype(np.float32) / (1 << spec.WEIGHT_FRAC_BITS)
                        for w in init_weights(layers, [seed, STREAM_INIT])]

    def forward(self, x):
        acts = [x]
        for i, w in enumerate(self.weights):
            z = acts[-1] @ w.T
            acts.append(np.maximum(z, 0) if i < len(self.weights) - 1 else z)
        return acts

    def predict(self, x):
        return self.forward(x)[-1].argmax(axis=1)

    def grads(self, x, y):
        """Weight gradients of the cross-entropy summed over the batch (not averaged)."""
        acts = self.forward(x)
        z = acts[-1] - acts[-1].max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        p[np.arange(len(y)), y] -= 1.0
        d = p
        grads = [None] * len(self.weights)
        for i in range(len(self.weights) - 1, -1, -1):
            grads[i] = d.T @ acts[i]
            if i:
                d = (d @ self.weights[i]) * (acts[i] > 0)
        return grads, acts[-1]

    def step(self, x, y, lr):
        grads, logits = self.grads(x, y)
        for w, g in zip(self.weights, grads):
            w -= np.float32(lr) * g
        return int((logits.argmax(axis=1) == y).sum())


def train_float(cfg, ds, progress=None):
    """Train the float reference with cfg's layers, epochs, batch size, seed and lr schedule.
    The network's ends come from the data set unless cfg.layers is set (TrainConfig.for_data).
    Returns per-epoch history and final accuracies."""
    cfg = cfg.for_data(ds)
    net = FloatNet(list(cfg.layers), cfg.seed)
    shuffle = rng(cfg.seed, STREAM_SHUFFLE)
    xtr, xte = ds.float_view(ds.x_train), ds.float_view(ds.x_test)
    history = []
    for epoch in range(cfg.epochs):
        lr = 2.0 ** -(epoch_settings(cfg, epoch).lr_shift - LR_OFFSET)
        _, order = draw_order(shuffle, len(xtr))
        correct = 0
        for i in range(0, len(order), cfg.batch_size):
            idx = order[i:i + cfg.batch_size]
            correct += net.step(xtr[idx], ds.y_train[idx], lr)
        test = float((net.predict(xte) == ds.y_test).mean())
        history.append({"epoch": epoch + 1, "train_accuracy": correct / len(order),
                        "test_accuracy": test})
        if progress:
            progress(history[-1])
    return {"backend": "float32", "epochs": cfg.epochs, "history": history,
            "train_accuracy": history[-1]["train_accuracy"],
            "test_accuracy": history[-1]["test_accuracy"]}
