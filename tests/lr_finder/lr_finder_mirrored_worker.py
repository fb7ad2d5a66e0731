"""The Keras range test under MirroredStrategy over two logical CPU devices, and the same test
on one device; prints JSON. A separate process because the logical devices must be configured
before TensorFlow initialises; tests/lr_finder/test_lr_finder_mirrored.py asserts on it."""

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

from aikit.ga.TF.optimizers import Optimizer as GAOptimizer  # noqa: E402
from aikit.lr_finder.TF import LRFinder  # noqa: E402

keras.config.set_floatx("float64")
rng = np.random.default_rng(0)
x = rng.normal(size=(96, 3))
y = x.sum(1, keepdims=True) ** 2
xv, yv = x[:32] + 0.1, y[:32]


def model(strategy, ga_steps=None):
    with strategy.scope():
        keras.utils.set_random_seed(0)
        net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(1e-4, momentum=0.9)
        net.compile(optimizer=optimizer if ga_steps is None else GAOptimizer(optimizer, ga_steps), loss="mse")
    return net


def run(strategy, val: bool, ga_steps=None):
    net = model(strategy, ga_steps)
    before = [w.copy() for w in net.get_weights()]
    finder = LRFinder(net)
    finder.range_test((x, y), val_data=(xv, yv) if val else None, end_lr=1.0, num_iter=8,
                      batch_size=16 // (ga_steps or 1), shuffle=False, progress_bar=False)
    weights = [w.tolist() for w in net.get_weights()]
    trained = not all(np.array_equal(a, b) for a, b in zip(before, net.get_weights(), strict=True))
    finder.reset()
    restored = all(np.array_equal(a, b) for a, b in zip(before, net.get_weights(), strict=True))
    return {"history": finder.history, "trained": trained, "restored": restored, "weights": weights,
            "lr_after": float(net.optimizer.learning_rate.numpy()), "updates": int(net.optimizer.iterations.numpy())}


mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
result = {"replicas": mirrored.num_replicas_in_sync}
for val in (False, True):
    result[f"mirrored_val{val}"] = run(mirrored, val)
    result[f"single_val{val}"] = run(tf.distribute.get_strategy(), val)
result["mirrored_ga"] = run(mirrored, False, ga_steps=2)  # batches of 8 (4 + 4), 2 per update: 16 per update
try:
    LRFinder(model(mirrored)).range_test((x, y), accumulation_steps=2, progress_bar=False)
except ValueError as error:
    result["accumulation_error"] = str(error)
print("RESULT " + json.dumps(result))
