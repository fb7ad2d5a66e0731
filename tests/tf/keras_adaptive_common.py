"""What the one-device and the MirroredStrategy adaptive tests share: a controller that follows a
script, the big-batch reference, and the numpy brute force the noise measurement must match."""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf
from tf_common import keras, mlp

from aikit.core.goodput import GoodputController
from aikit.core.gradient_noise import estimate


class ScriptedController(GoodputController):
    """A GoodputController whose proposals are a script ``{update: batch}`` (so a test knows
    where the plan changes), recording everything as the real one does."""

    def __init__(self, script: dict[int, int], *args, **kwargs):
        super().__init__(*args, policy="error", **kwargs)
        self.script = dict(script)

    def propose(self):
        new = self.script.get(len(self.batches))
        if new is None or new == self.batch:
            return None
        self.changes.append((len(self.batches), self.batch, new, math.inf))
        self.batch = new
        return new


def order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The sample order of an epoch, written out independently of aikit's Schedule."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def big_batch_reference(x, y, rows: list[dict], seed: int, make_optimizer) -> keras.Model:
    """One plain Keras step per update on the update's whole batch, at the update's LR: the
    epoch's permutation taken in consecutive slices of the logged batch sizes."""
    reference = mlp()
    optimizer = make_optimizer()
    offset, epoch = 0, None
    for row in rows:
        if row["epoch"] != epoch:
            epoch, offset, permutation = row["epoch"], 0, order(len(x), seed, row["epoch"])
        samples = permutation[offset:offset + row["batch_size"]]
        offset += row["batch_size"]
        optimizer.learning_rate = row["lr"]
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(reference(x[samples]) - y[samples]))
        optimizer.apply(tape.gradient(loss, reference.trainable_variables), reference.trainable_variables)
    return reference


def brute_force_noise(model: keras.Model, x, y, parts: list[np.ndarray]):
    """``estimate`` fed with each part's gradient norm computed one part at a time in numpy."""
    grads = []
    for rows in parts:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x[rows]) - y[rows]))
        grads.append(np.concatenate([g.numpy().ravel() for g in tape.gradient(loss, model.trainable_variables)]))
    mean = np.mean(grads, axis=0)
    return estimate([float(g @ g) for g in grads], [len(p) for p in parts], float(mean @ mean))
