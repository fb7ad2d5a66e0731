"""Two logical CPU devices under one MirroredStrategy that counts its reductions, for the check
scripts that run in a process of their own (mirrored_checks.py, adaptive_mirrored_checks.py).

Import it before anything else imports TensorFlow: the logical devices must be configured before
TensorFlow initialises its devices.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

DEVICES = ["/cpu:0", "/cpu:1"]
# one strategy for every check: two MirroredStrategy objects in one process can collide on
# collective instance keys in eager mode
strategy = tf.distribute.MirroredStrategy(DEVICES)

calls: list[int] = []  # the tensors in every cross-replica reduction (all-reduces go through here)
_batch_reduce_to = strategy.extended.batch_reduce_to


def _counted_batch_reduce_to(*args, **kwargs):
    calls.append(len(args[1]) if len(args) > 1 else len(kwargs["value_destination_pairs"]))
    return _batch_reduce_to(*args, **kwargs)


strategy.extended.batch_reduce_to = _counted_batch_reduce_to
