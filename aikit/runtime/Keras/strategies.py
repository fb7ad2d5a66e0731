"""Which ``tf.distribute`` strategy runs the plan, and on how many devices.

In order: a strategy the caller passes or has entered (``with strategy.scope():``) is used
as it is; a TPU gives ``TPUStrategy``; a ``TF_CONFIG`` naming several workers gives
``MultiWorkerMirroredStrategy``; several visible GPUs give ``MirroredStrategy``; otherwise
the default strategy (one device).
"""

from __future__ import annotations

import json
import os
import sys

import tensorflow as tf

from aikit.core.errors import InvalidValue


def find_tpu() -> tf.distribute.cluster_resolver.TPUClusterResolver | None:
    """A connected TPU cluster resolver, or None where no TPU can be found."""
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, tf.errors.NotFoundError):
        return None
    return resolver


def workers_in_tf_config() -> int:
    """Workers (chief included) that ``TF_CONFIG`` names; 0 without a TF_CONFIG."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return 0
    try:
        cluster = json.loads(raw).get("cluster", {})
    except (json.JSONDecodeError, AttributeError):
        raise InvalidValue(f"TF_CONFIG is not a JSON object with a 'cluster' entry: {raw[:200]!r}") from None
    return len(cluster.get("worker", [])) + len(cluster.get("chief", []))


def horovod():
    """``horovod.tensorflow`` when the program imported and initialised it, else None: under
    horovodrun every process is one device and Horovod all-reduces (aikit.elastic.TF.horovod)."""
    hvd = sys.modules.get("horovod.tensorflow")
    return hvd if hvd is not None and hvd.is_initialized() else None


def horovodrun_processes() -> int:
    """Processes that horovodrun (or mpirun) started with this one; 0 when it did not start it."""
    for name in ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def available_strategy() -> tf.distribute.Strategy:
    """The strategy that uses every device found (see the module docstring)."""
    if tf.distribute.has_strategy():
        return tf.distribute.get_strategy()
    if os.environ.get("TPU_NAME") or os.environ.get("COLAB_TPU_ADDR") or tf.config.list_physical_devices("TPU"):
        resolver = find_tpu()
        if resolver is not None:
            return tf.distribute.TPUStrategy(resolver)
    if workers_in_tf_config() > 1:
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) > 1:
        return tf.distribute.MirroredStrategy([d.name for d in gpus])
    return tf.distribute.get_strategy()


def mirrored_on(strategy: tf.distribute.Strategy, devices: int) -> tf.distribute.Strategy:
    """``strategy`` narrowed to its first ``devices`` local devices (a plan may use fewer).

    Only a single-host MirroredStrategy (or the default strategy) can be narrowed; the others
    are refused with the device count they would need.
    """
    if devices == strategy.num_replicas_in_sync:
        return strategy
    if isinstance(strategy, tf.distribute.MirroredStrategy) and devices < strategy.num_replicas_in_sync:
        chosen = list(strategy.extended.worker_devices)[:devices]
        return tf.distribute.MirroredStrategy(chosen) if devices > 1 else tf.distribute.OneDeviceStrategy(chosen[0])
    raise InvalidValue(
        f"the plan uses {devices} devices but the {type(strategy).__name__} has "
        f"{strategy.num_replicas_in_sync} replicas and cannot be narrowed: pass gpus="
        f"{strategy.num_replicas_in_sync}, a global batch that splits over all of them, or a strategy "
        f"with {devices} replicas"
    )


def rank(strategy: tf.distribute.Strategy) -> int:
    """This worker's index (0 on the chief or a single host): the plan's rank."""
    resolver = getattr(strategy, "cluster_resolver", None)
    task_id = getattr(resolver, "task_id", None)
    return int(task_id or 0)
