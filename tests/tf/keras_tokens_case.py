"""The Keras token-weighting runs tests/tf/test_keras_tokens.py compares: a tiny float64
sequence model over byte sequences of the standard library's sources, padded to one width, some
of them prompts whose labels are all ignored, so micro-batches hold very different numbers of
tokens (some none); and the big-batch reference, one step per window on the per-token mean of
the whole window."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from aikit.datasets import IGNORE, pad_batch, stdlib_text

SEQUENCES, CONTEXT = 32, 16


def sequences() -> tuple[np.ndarray, np.ndarray]:
    """``(inputs, labels)`` of SEQUENCES sequences of 2 to CONTEXT + 1 bytes, padded to CONTEXT;
    every fifth one (from the third) a prompt: all its labels ignored."""
    train, _ = stdlib_text(max_len=CONTEXT, max_bytes=20_000, val_fraction=0, min_len=2)
    pieces = [piece[:2 + (7 * index) % CONTEXT] for index, piece in enumerate(train[:SEQUENCES])]
    inputs, labels = pad_batch(pieces)
    inputs = np.pad(inputs, ((0, 0), (0, CONTEXT - inputs.shape[1])))
    labels = np.pad(labels, ((0, 0), (0, CONTEXT - labels.shape[1])), constant_values=IGNORE)
    labels[2::5] = IGNORE
    return inputs, labels


def model(seed: int = 3) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((CONTEXT,), dtype="int64"), keras.layers.Embedding(256, 8),
                             keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(256)])


def token_mean(model_, inputs, labels, sample_weight=None):
    """The per-token mean cross-entropy of a batch, by hand: the loss a big batch would use."""
    scored = tf.cast(labels != IGNORE, tf.float64)
    if sample_weight is not None:
        scored *= tf.cast(sample_weight, tf.float64)
    targets = tf.where(labels == IGNORE, tf.zeros_like(labels), labels)
    losses = keras.losses.sparse_categorical_crossentropy(targets, model_(inputs), from_logits=True)
    return tf.reduce_sum(losses * scored) / tf.reduce_sum(scored), tf.reduce_sum(scored)


def big_batch(make_optimizer, windows, sample_weight=None) -> keras.Model:
    """One step per window of sequences on their per-token mean."""
    inputs, labels = sequences()
    net, optimizer = model(), make_optimizer()
    for window in windows:
        weight = None if sample_weight is None else sample_weight[window]
        with tf.GradientTape() as tape:
            loss, _ = token_mean(net, inputs[window], labels[window], weight)
        optimizer.apply(tape.gradient(loss, net.trainable_variables), net.trainable_variables)
    return net
