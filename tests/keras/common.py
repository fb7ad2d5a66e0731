"""Tiny models, data and the plain-Keras big-batch references the backend tests compare against."""

from __future__ import annotations

import keras
import numpy as np

BACKEND = keras.backend.backend()
# Keras 3.15's torch matmul rounds float64 operands at about float32's precision (keras.ops.matmul
# against torch.matmul of the same float64 tensors: 1.4e-7), so on torch a micro-batch's forward
# rounds unlike the big batch's, for Keras' own GA as for aikit's; the other backends agree to 1e-12
EXACT = 1e-6 if BACKEND == "torch" else 1e-12


def mlp(seed: int = 1, inputs: int = 4, outputs: int = 3) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(6, activation="tanh"),
                             keras.layers.Dense(outputs)])


def data(n: int, seed: int = 0, inputs: int = 4, outputs: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, inputs)), rng.normal(size=(n, outputs))


def difference(a: keras.Model, b: keras.Model) -> float:
    return max(float(np.abs(p - q).max()) for p, q in zip(a.get_weights(), b.get_weights(), strict=True))


class PerTokenMean(keras.losses.Loss):
    """The plain per-token mean a big batch trains on: Σ loss·w / Σ w over the tokens not ignored."""

    def __init__(self):
        super().__init__(reduction="none")

    def __call__(self, y_true, y_pred, sample_weight=None):
        ops = keras.ops
        scored = ops.cast(ops.not_equal(y_true, -100), "float64")
        if sample_weight is not None:
            scored = scored * ops.expand_dims(ops.cast(sample_weight, "float64"), -1)
        targets = ops.where(ops.equal(y_true, -100), ops.zeros_like(y_true), y_true)
        values = keras.losses.sparse_categorical_crossentropy(targets, y_pred, from_logits=True)
        return ops.sum(ops.cast(values, "float64") * scored) / ops.sum(scored)
