"""Tiny models and the reference big-batch training the TF tests compare against."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf


def mlp(seed: int = 1, inputs: int = 4, outputs: int = 3) -> keras.Model:
    """The same small MLP (same initial weights) for every seed."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(6, activation="tanh"),
                             keras.layers.Dense(outputs)])


def data(n: int, seed: int = 0, inputs: int = 4, outputs: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, inputs)), rng.normal(size=(n, outputs))


def gradients(model: keras.Model, x, y) -> list:
    """Gradients of the mean squared error over the batch (the loss a big batch would use)."""
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
    return tape.gradient(loss, model.trainable_variables)


def max_difference(a: keras.Model, b: keras.Model) -> float:
    return max(float(np.abs(p - q).max()) for p, q in zip(a.get_weights(), b.get_weights(), strict=True))
