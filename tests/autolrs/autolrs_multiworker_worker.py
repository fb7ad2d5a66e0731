"""One worker of a real two-process MultiWorkerMirroredStrategy run of AutoLRS's Keras callback,
configured by TF_CONFIG; prints JSON for tests/autolrs/test_autolrs_tf.py.

Keras 3.15's own ``fit`` fails under MultiWorkerMirroredStrategy on CPU before any callback
runs (see tests/tf/multiworker_worker.py), so a ``strategy.run`` loop calls the callback's
hooks as ``fit`` would and feeds the compiled loss tracker. Each worker builds its AutoLRS with
its own seed and trains on its own half of every batch: if the workers followed their own
controllers their LRs would differ; the chief's decision must reach both.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()

import keras  # noqa: E402
import numpy as np  # noqa: E402

from aikit.autolrs.TF import AutoLRS  # noqa: E402
from aikit.datasets import digits  # noqa: E402

STEPS, HALF = 40, 16
worker = strategy.cluster_resolver.task_id
x, y, _, _ = digits()
x = x.reshape(len(x), 64)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
with strategy.scope():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9), loss=loss_fn)
    model.optimizer.build(model.trainable_variables)
tracker = next(m for m in model.metrics if m.name == "loss")
autolrs = AutoLRS(lambda: 0.0, 1e-3, 0.5, tau=10, tau_max=10, trials=3, trial_ratio=3, val_tau=10**6,
                  keep_winner=False, design=0, seed=100 + worker)
autolrs.set_model(model)


@tf.function
def train_step(xb, yb):
    def replica_step(xr, yr):
        with tf.GradientTape() as tape:
            loss = loss_fn(yr, model(xr, training=True))
            scaled = loss / strategy.num_replicas_in_sync  # the optimizer sums the replicas' gradients
        model.optimizer.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)
        tracker.update_state(loss)

    strategy.run(replica_step, args=(xb, yb))


autolrs.on_train_begin()
step_lrs = []
for step in range(STEPS):
    rows = slice((2 * step + worker) * HALF, (2 * step + worker + 1) * HALF)  # this worker's half of the batch
    autolrs.on_train_batch_begin(step)
    step_lrs.append(float(model.optimizer.learning_rate.numpy()))
    train_step(tf.constant(x[rows]), tf.constant(y[rows]))
    autolrs.on_train_batch_end(step)

controller = autolrs.controller
print("RESULTS " + json.dumps({
    "worker": worker,
    "multi_worker": isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy),
    "replicas": strategy.num_replicas_in_sync,
    "step_lrs": step_lrs,
    "decided_lrs": [float(np.float32(r.lr)) for r in controller.history],
    "restores": sum(1 for s in controller.stages for _ in s.trials[1:]),
    "weights": [float(w) for v in model.trainable_variables for w in np.ravel(v.numpy())],
}))
