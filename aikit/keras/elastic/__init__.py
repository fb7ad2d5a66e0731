"""Elastic training for Keras 3 on every backend: ``aikit.keras.elastic.init(global_batch_size, max_device_batch)``
(also ``aikit.elastic.TF.init``, the seed's path).

``init`` finds the devices the backend trains on (TensorFlow: a TPU, several GPUs, several workers
from ``TF_CONFIG``, Horovod, or one device, through ``tf.distribute``; JAX: every device of every
process ``keras.distribution.initialize`` joined, through ``keras.distribution``; torch: one
device), plans GA steps and micro-batches with :func:`aikit.core.plan.make_plan`, and publishes
``plan``, ``steps``, ``batch_size``, ``global_batch_size``, ``gpus``, ``master`` and the backend's
placement (``strategy``, and ``hvd`` under Horovod, on TensorFlow; ``distribution`` on JAX) here
and on :mod:`aikit.elastic`. Wrap the Keras model with :class:`aikit.keras.elastic.model.Model`
(``models.Model`` is the same class, as Run:AI's AIkit Elastic writes it), compile and fit.
"""

from __future__ import annotations

import sys

from aikit.core.errors import InvalidValue
from aikit.core.plan import POLICIES, Plan, devices_here, make_plan
from aikit.core.validate import positive_int
from aikit.keras.elastic import model
from aikit.keras.elastic.adaptive import fit_adaptive
from aikit.keras.elastic.model import Model, current_plan
from aikit.keras.elastic.trace import fit_trace
from aikit.keras.optimizers import MAX_STEPS
from aikit.keras.precision import check_float64
from aikit.runtime.Keras.backend import check_backend, seam
from aikit.runtime.originals import max_device_batch_of
from aikit.runtime.process import publish

strategies = seam.STRATEGIES  # the path users wrote: aikit.elastic.TF.strategies (None without tf.distribute)

models = model  # Run:AI's AIkit Elastic writes aikit.elastic.models.Model(model): aikit.elastic serves it too

MAX_KERAS_STEPS = MAX_STEPS  # the GA optimizer's steps live in an integer variable

# "ragged" needs micro-batches of different sizes, which Keras' fit cannot feed
KERAS_POLICIES = tuple(p for p in POLICIES if p != "ragged")

plan: Plan | None = None
strategy = None  # what init publishes beside the plan: TensorFlow's tf.distribute strategy,
distribution = None  # JAX's keras.distribution (None: one device)


def init(global_batch_size: int, max_device_batch: int | None = None, gpus: int | None = None, *,
         policy: str = "fewer_devices", strategy=None, verbose: bool = True,
         max_gpu_batch_size: int | None = None) -> Plan:
    """Plan an update of ``global_batch_size`` samples with at most ``max_device_batch`` per device
    (Run:AI's AIkit Elastic's ``max_gpu_batch_size``, accepted by that name too).

    ``gpus`` defaults to every device found: on TensorFlow the replicas of ``strategy`` (a
    ``tf.distribute.Strategy``, or the strategy found, see :mod:`aikit.runtime.Keras.strategies`,
    also ``aikit.elastic.TF.strategies``); on JAX the devices of every process (or of the
    ``keras.distribution`` the program set; else ``init`` sets ``DataParallel`` over the plan's
    devices); on torch one. Keras feeds
    equal micro-batches, so a global batch that does not split evenly either uses fewer devices
    (``policy="fewer_devices"``, the default) or is refused with the nearest batches that do
    split (``policy="error"``).
    """
    g = positive_int(global_batch_size, "global_batch_size")
    m = max_device_batch_of(max_device_batch, max_gpu_batch_size)
    if policy not in KERAS_POLICIES:
        raise InvalidValue(
            f"policy must be one of {KERAS_POLICIES} for Keras, got {policy!r}: Keras' fit feeds "
            "micro-batches of one size, so 'ragged' plans are for the PyTorch adapter"
        )
    check_backend("aikit.keras.elastic.init")
    check_float64("aikit.keras.elastic.init")
    available, where, rank, found = seam.found_devices(strategy)
    devices = devices_here(gpus, available, where, g, m)
    new_plan = make_plan(g, m, devices, policy=policy, rank=rank)
    if new_plan.micro_steps > MAX_KERAS_STEPS:
        raise InvalidValue(
            f"global_batch_size {g} needs {new_plan.micro_steps} GA steps of at most {m} samples, more than the "
            f"{MAX_KERAS_STEPS} Keras' step counter (an integer variable) can hold: use a smaller global batch"
        )
    placement = seam.distribute(found, new_plan.num_replicas, g)
    # Run:AI's AIkit's runai.elastic.hvd (here and on aikit.elastic): only under Horovod
    publish(new_plan, sys.modules[__name__], **placement)
    if verbose and new_plan.master:
        print(new_plan.summary(), f"\n  {seam.describe(placement)}", sep="")
    return new_plan


__all__ = ["Model", "current_plan", "fit_adaptive", "fit_trace", "init", "model", "models"]
