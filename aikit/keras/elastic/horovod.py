"""Horovod glue for Keras 3 on TensorFlow: ``horovod.tensorflow``'s collectives, not its Keras layer.

Horovod's Keras layer (``horovod.keras``, ``horovod.tensorflow.keras``) is written for Keras 2
optimizers and breaks on Keras 3 (horovod#4290); its TensorFlow ops work on TF 2.21 once built
without their XLA ops (scripts/install_horovod.sh). Launch with ``horovodrun -np 2 python train.py``::

    import horovod.tensorflow as hvd
    import aikit.keras.elastic
    from aikit.keras.elastic import horovod

    hvd.init()
    aikit.keras.elastic.init(256, 64)       # gpus = hvd.size(), master = (hvd.rank() == 0)
    model.compile(horovod.DistributedOptimizer(keras.optimizers.Adam(1e-3), aikit.keras.elastic.steps), ...)
    model.fit(x_of_this_rank, y_of_this_rank, batch_size=aikit.keras.elastic.batch_size,
              callbacks=[horovod.BroadcastVariables()])

Every rank feeds its own shard of the data, in micro-batches of ``batch_size``.
"""

from __future__ import annotations

from aikit.core.errors import InvalidState
from aikit.keras.optimizers import Optimizer
from aikit.optional import require
from aikit.runtime.Keras.backend import BACKEND, keras, seam

if not seam.HOROVOD:
    raise InvalidState(
        f"aikit.keras.elastic.horovod runs Horovod's TensorFlow ops, so it needs Keras on TensorFlow, but Keras runs "
        f"on {BACKEND!r}: on JAX train data parallel with aikit.keras.elastic.init (keras.distribution, over processes "
        "joined by keras.distribution.initialize); on TensorFlow set KERAS_BACKEND=tensorflow"
    )

hvd = require("horovod.tensorflow", "aikit.keras.elastic.horovod",
              "use tf.distribute (MultiWorkerMirroredStrategy from TF_CONFIG, MirroredStrategy for the GPUs of one "
              "machine)")

__all__ = ["BroadcastVariables", "DistributedOptimizer"]


@keras.saving.register_keras_serializable(package="aikit")
class DistributedOptimizer(Optimizer):
    """aikit's Keras GA optimizer whose update first averages the accumulated gradients over the
    Horovod ranks in one grouped all-reduce; the micro-steps before it communicate nothing.

    With equal micro-batches on every rank (Keras feeds one size) the update is the big-batch
    mean: the mean over ranks of each rank's mean over its micro-steps.
    """

    def __init__(self, optimizer: keras.optimizers.Optimizer, steps: int = 1, name: str | None = None, **kwargs):
        if not hvd.is_initialized():
            raise InvalidState("Horovod is not initialised: call horovod.tensorflow.init() before aikit's Horovod glue")
        super().__init__(optimizer, steps, name=name, **kwargs)

    def _replicas_nonfinite(self, sums):
        """The ranks' count of non-finite sums, summed over Horovod (one number): each rank's own
        sums differ, and every rank must skip an update, or none, before the all-reduce below."""
        count = super()._replicas_nonfinite(sums)
        return hvd.allreduce(count, op=hvd.Sum) if hvd.size() > 1 else count

    def _update(self, sums, variables) -> None:
        present = [total for total in sums if total is not None]
        if hvd.size() > 1 and present:
            for total, mean in zip(present, hvd.grouped_allreduce([t.value for t in present], op=hvd.Average),
                                   strict=True):
                total.assign(mean)
        super()._update(sums, variables)


class BroadcastVariables(keras.callbacks.Callback):
    """Start every rank from ``root_rank``'s weights when ``fit`` begins."""

    def __init__(self, root_rank: int = 0):
        super().__init__()
        self.root_rank = root_rank

    def on_train_begin(self, logs=None) -> None:
        # one eager broadcast per variable: hvd.broadcast_variables traces a tf.function that
        # cannot assign to Keras 3 variables
        for variable in self.model.variables:
            variable.assign(hvd.broadcast(variable.value, root_rank=self.root_rank))
