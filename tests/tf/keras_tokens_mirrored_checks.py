"""Token-weighted Keras GA under a real MirroredStrategy over two logical CPUs, in a process of
its own (the devices must be configured first): ``fit`` with TokenMean and a custom loop with
``apply(..., weight=n)``, each replica holding different numbers of tokens, against one device's
big-batch steps. Prints ``RESULTS {json}`` for tests/tf/test_keras_tokens.py."""

from __future__ import annotations

import json

from two_cpus import calls, strategy  # isort: skip  (first: configures the logical devices)

import numpy as np
import tensorflow as tf
from keras_tokens_case import big_batch, keras, model, sequences, token_mean

from aikit.ga.TF.optimizers import Optimizer
from aikit.ga.TF.tokens import TokenMean

keras.backend.set_floatx("float64")
results: dict = {}
inputs, labels = sequences()
WINDOWS = [np.arange(0, 8), np.arange(8, 16), np.arange(16, 24)]  # per update: 2 micro-steps x 2 replicas x 2


def sgd():  # SGD scales with the gradient, so a wrong total shows (Adam's normalisation would hide it)
    return keras.optimizers.SGD(0.5, momentum=0.9)


def difference(a, b) -> float:
    return max(float(np.abs(p - q).max()) for p, q in zip(a.get_weights(), b.get_weights(), strict=True))


expected = big_batch(sgd, WINDOWS)

# fit: each global batch of 4 split over the 2 replicas, 2 micro-steps per update
with strategy.scope():
    net = model()
    optimizer = Optimizer(sgd(), steps=2)
    net.compile(optimizer=optimizer, loss=TokenMean(optimizer, from_logits=True))
net.fit(inputs[:24], labels[:24], batch_size=4, epochs=1, shuffle=False, verbose=0)
results["fit_difference"] = difference(net, expected)
results["fit_updates"] = int(optimizer.iterations.numpy())
replica_tokens = [[int((labels[s:s + 2] != -100).sum()), int((labels[s + 2:s + 4] != -100).sum())]
                  for s in range(0, 24, 4)]
results["replica_tokens"] = replica_tokens

# a custom loop: strategy.run, each replica its own micro-batch and its own count
with strategy.scope():
    custom = model()
    ga = Optimizer(sgd(), steps=2)
    ga.build(custom.trainable_variables)


@tf.function
def micro_step(xb, yb):
    def replica_step(xr, yr):
        with tf.GradientTape() as tape:
            loss, terms = token_mean(custom, xr, yr)
            loss = loss / strategy.num_replicas_in_sync  # scaled for distribution, as Keras' losses are
        ga.apply(tape.gradient(loss, custom.trainable_variables), custom.trainable_variables, weight=terms)

    strategy.run(replica_step, args=(xb, yb))


def per_replica(values):
    return strategy.experimental_distribute_values_from_function(
        lambda context: tf.constant(values[context.replica_id_in_sync_group]))


before = len(calls)
for start in range(0, 24, 4):
    micro_step(per_replica([inputs[start:start + 2], inputs[start + 2:start + 4]]),
               per_replica([labels[start:start + 2], labels[start + 2:start + 4]]))
results["custom_difference"] = difference(custom, expected)
results["custom_updates"] = int(ga.iterations.numpy())
results["custom_reductions"] = len(calls) - before
print("RESULTS " + json.dumps(results))
