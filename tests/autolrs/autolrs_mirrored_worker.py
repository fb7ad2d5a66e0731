"""AutoLRS's Keras callback under MirroredStrategy over two logical CPU devices; prints JSON.

A separate process because the logical devices must be configured before TensorFlow
initialises; tests/autolrs/test_autolrs_tf.py runs it and asserts on what it prints.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402
import numpy as np  # noqa: E402

from aikit.autolrs.TF import AutoLRS  # noqa: E402
from aikit.datasets import digits  # noqa: E402


class Probe(keras.callbacks.Callback):
    """After AutoLRS: the LR each step starts with, and every replica's state at each restore."""

    def __init__(self, autolrs: AutoLRS):
        super().__init__()
        self.autolrs, self.step_lrs, self.checkpoint, self.restore_mismatches, self.restores = autolrs, [], None, 0, 0

    def state(self) -> list[np.ndarray]:
        lr = self.model.optimizer._learning_rate
        values = []
        for v in [*self.model.variables, *self.model.optimizer.variables]:
            if v is lr:
                continue
            inner = getattr(v, "value", v)
            replicas = getattr(inner, "values", None) or (inner,)  # every replica's copy
            values += [np.array(r.numpy(), copy=True) for r in replicas]
        return values

    def on_train_batch_begin(self, batch, logs=None):
        self.step_lrs.append(float(self.model.optimizer.learning_rate.numpy()))

    def on_train_batch_end(self, batch, logs=None):
        if self.autolrs.action.checkpoint:
            self.checkpoint = self.state()
        elif self.autolrs.action.restore:
            self.restores += 1
            pairs = zip(self.state(), self.checkpoint, strict=True)
            self.restore_mismatches += sum(not np.array_equal(a, b) for a, b in pairs)


x, y, xv, yv = digits()
x, xv = x.reshape(len(x), 64), xv.reshape(len(xv), 64)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dropout(0.2), keras.layers.Dense(10)])
    model.compile(keras.optimizers.Adam(1e-3), loss=loss_fn)
first_batch_loss = float(loss_fn(y[:32], model(x[:32], training=False)))
autolrs = AutoLRS(lambda: float(loss_fn(yv, model(xv, training=False))), 1e-4, 1e-1, tau=30, tau_max=30,
                  trials=3, val_tau=1000, warmup_steps=2, warmup_lr=1e-3, keep_winner=False)
probe = Probe(autolrs)
history = model.fit(x[:640], y[:640], batch_size=32, epochs=2, shuffle=False, verbose=0, callbacks=[autolrs, probe])
print(json.dumps({
    "first_batch_loss": first_batch_loss,
    "seen": [r.loss for r in autolrs.controller.history],
    "history_lrs": [float(np.float32(r.lr)) for r in autolrs.controller.history],
    "step_lrs": probe.step_lrs,
    "epoch_losses": history.history["loss"],
    "restores": probe.restores,
    "restore_mismatches": probe.restore_mismatches,
    "checkpointed_values": len(probe.checkpoint),
}))
