"""One worker of a real two-process MultiWorkerMirroredStrategy run, configured by TF_CONFIG.

``aikit.elastic.TF.init`` finds the strategy from TF_CONFIG and plans over both workers; the
GA optimizer in a ``strategy.run`` loop must equal one-device big-batch training. (Keras
3.15's own ``fit`` fails under MultiWorkerMirroredStrategy on CPU before any aikit code
runs, in its symbolic build, so this worker uses a custom loop.) Prints findings as JSON.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

sys.path.insert(0, os.path.dirname(__file__))
import tensorflow as tf
from tf_common import data, gradients, keras, max_difference, mlp

import aikit.elastic.TF as elastic_tf
from aikit.ga.TF.optimizers import Optimizer

keras.config.set_floatx("float64")
plan = elastic_tf.init(16, 4, verbose=False)
strategy = elastic_tf.strategy
worker = strategy.cluster_resolver.task_id
with strategy.scope():
    model = mlp()
    optimizer = Optimizer(keras.optimizers.Adam(0.01, weight_decay=0.05), plan.steps)
    optimizer.build(model.trainable_variables)


@tf.function
def micro_step(xb, yb):
    def replica_step(xr, yr):
        with tf.GradientTape() as tape:
            per_example = tf.reduce_mean(tf.square(model(xr) - yr), axis=1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=plan.batch_size * plan.gpus)
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    strategy.run(replica_step, args=(xb, yb))


x, y = data(32)
step_batch = plan.batch_size * plan.gpus
for start in range(0, len(x), step_batch):  # every micro-step: worker w takes its slice of the step batch
    rows = slice(start + worker * plan.batch_size, start + (worker + 1) * plan.batch_size)
    micro_step(tf.constant(x[rows]), tf.constant(y[rows]))

reference, adam = mlp(), keras.optimizers.Adam(0.01, weight_decay=0.05)
for start in range(0, len(x), plan.global_batch_size):
    rows = slice(start, start + plan.global_batch_size)
    adam.apply(gradients(reference, x[rows], y[rows]), reference.trainable_variables)

print("RESULTS " + json.dumps({
    "multi_worker": isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy),
    "plan": [plan.steps, plan.batch_size, plan.gpus, plan.global_batch_size],
    "master": plan.master,
    "updates": int(optimizer.iterations.numpy()),
    "difference": max_difference(model, reference),
}))
