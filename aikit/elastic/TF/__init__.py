"""Elastic training for TensorFlow/Keras: ``aikit.elastic.TF.init(global_batch_size, max_device_batch)``.

``init`` finds the devices (TPU, several GPUs, several workers from ``TF_CONFIG``, or one
device), plans GA steps and micro-batches with :func:`aikit.core.plan.make_plan`, and
publishes ``plan``, ``steps``, ``batch_size``, ``global_batch_size``, ``gpus``, ``master`` and
``strategy`` here and on :mod:`aikit.elastic` (and ``hvd``, the ``horovod.tensorflow`` module,
under Horovod). Wrap the
Keras model with :class:`aikit.elastic.TF.model.Model` (``models.Model`` is the same class, as
Run:AI's AIkit Elastic writes it), compile and fit.
"""

from __future__ import annotations

from aikit.optional import tensorflow  # noqa: F401  isort: skip  (first: a missing tensorflow names its extra)
import sys

import tensorflow as tf

from aikit.core.errors import InvalidType, InvalidValue
from aikit.core.plan import POLICIES, Plan, devices_here, make_plan
from aikit.core.validate import positive_int
from aikit.runtime.originals import max_device_batch_of
from aikit.runtime.published import publish
from aikit.runtime.TF import strategies
from aikit.runtime.TF.keras_backend import keras_on_tensorflow

keras_on_tensorflow()

from aikit.elastic.TF import model  # noqa: E402  (needs Keras on TF first)
from aikit.elastic.TF.adaptive import fit_adaptive  # noqa: E402
from aikit.elastic.TF.model import Model, current_plan  # noqa: E402
from aikit.elastic.TF.trace import fit_trace  # noqa: E402
from aikit.ga.TF.optimizers import MAX_STEPS  # noqa: E402

models = model  # Run:AI's AIkit Elastic writes aikit.elastic.models.Model(model): aikit.elastic serves it too

MAX_KERAS_STEPS = MAX_STEPS  # the GA optimizer's steps live in an int64 variable

# "ragged" needs micro-batches of different sizes, which Keras' fit cannot feed
KERAS_POLICIES = tuple(p for p in POLICIES if p != "ragged")

plan: Plan | None = None
strategy: tf.distribute.Strategy | None = None


def init(
    global_batch_size: int,
    max_device_batch: int | None = None,
    gpus: int | None = None,
    *,
    policy: str = "fewer_devices",
    strategy: tf.distribute.Strategy | None = None,
    verbose: bool = True,
    max_gpu_batch_size: int | None = None,
) -> Plan:
    """Plan an update of ``global_batch_size`` samples with at most ``max_device_batch`` per device
    (Run:AI's AIkit Elastic's ``max_gpu_batch_size``, accepted by that name too).

    ``gpus`` defaults to the replicas of ``strategy`` (or of the strategy found, see
    :mod:`aikit.runtime.TF.strategies`, also ``aikit.elastic.TF.strategies``). Keras feeds
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
    if strategy is not None and not isinstance(strategy, tf.distribute.Strategy):
        raise InvalidType(
            f"strategy must be a tf.distribute.Strategy object, got {strategy!r:.60}: pass e.g. "
            "tf.distribute.MirroredStrategy(), or leave strategy out to use every device found"
        )
    hvd = strategies.horovod()
    launched = strategies.horovodrun_processes()
    if hvd is None and launched > 1:
        raise InvalidValue(
            f"this process is one of {launched} that horovodrun started, but horovod.tensorflow is not "
            "initialised, so each would train alone: call `import horovod.tensorflow as hvd; hvd.init()` "
            "before init() and compile with aikit.elastic.TF.horovod.DistributedOptimizer (Run:AI's AIkit "
            "initialised Horovod itself), or run the script once with python: aikit then uses every GPU of "
            "the machine through MirroredStrategy"
        )
    chosen = strategy or strategies.available_strategy()
    available = hvd.size() if hvd else chosen.num_replicas_in_sync
    devices = devices_here(gpus, available, "Horovod" if hvd else type(chosen).__name__, g, m)
    new_plan = make_plan(g, m, devices, policy=policy, rank=hvd.rank() if hvd else strategies.rank(chosen))
    if new_plan.steps > MAX_KERAS_STEPS:
        raise InvalidValue(
            f"global_batch_size {g} needs {new_plan.steps} GA steps of at most {m} samples, more than the "
            f"{MAX_KERAS_STEPS} Keras' step counter (an int64 variable) can hold: use a smaller global batch"
        )
    if hvd is None:
        chosen = strategies.mirrored_on(chosen, new_plan.gpus)
    elif new_plan.gpus != hvd.size():
        raise InvalidValue(
            f"the plan uses {new_plan.gpus} of the {hvd.size()} Horovod processes (global_batch_size {g}), "
            f"but every process must train: launch {new_plan.gpus} process(es), or use a global batch "
            f"that splits evenly over {hvd.size()}"
        )

    # Run:AI's AIkit's runai.elastic.hvd (here and on aikit.elastic): only under Horovod
    publish(new_plan, sys.modules[__name__], strategy=chosen, **({} if hvd is None else {"hvd": hvd}))
    if verbose and new_plan.master:
        print(new_plan.summary(), f"\n  strategy: {type(chosen).__name__}", sep="")
    return new_plan


__all__ = ["Model", "current_plan", "fit_adaptive", "fit_trace", "init", "model", "models", "strategies"]
