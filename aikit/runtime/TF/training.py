"""What the Keras fit loops of aikit share: one micro-step with each replica on its own samples,
and the check that a model is compiled for the loop.

:func:`~aikit.elastic.TF.trace.fit_trace` and :func:`~aikit.elastic.TF.adaptive.fit_adaptive`
plan their updates differently (a trace, a controller) and train every micro-step here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from aikit.core.errors import InvalidType, InvalidValue
from aikit.core.schedule import EpochSchedule
from aikit.runtime.TF.keras_backend import keras_on_tensorflow

keras_on_tensorflow()  # Keras on TensorFlow, or the error that says how


def train_micro_step(keras_model: Any, x: np.ndarray, y: np.ndarray, rows: Sequence[np.ndarray]) -> float:
    """One micro-step in which replica ``r`` trains on samples ``rows[r]``; returns the loss.

    Under a ``tf.distribute`` strategy each replica is handed its own rows as distributed values:
    ``train_on_batch`` given plain arrays would hand every replica the whole batch (each then
    computing the same gradient, the work done once per replica)."""
    if len(rows) == 1:
        return float(np.ravel(keras_model.train_on_batch(x[rows[0]], y[rows[0]]))[0])
    strategy = keras_model.distribute_strategy
    # what train_on_batch does first, from one replica's arrays: Keras' symbolic build of the
    # compiled loss and metrics needs shapes, which distributed values do not have
    keras_model._maybe_symbolic_build(data_batch=(x[rows[0]], y[rows[0]], None))

    def distributed(array: np.ndarray):
        parts = [array[r] for r in rows]
        return strategy.experimental_distribute_values_from_function(
            lambda context: parts[context.replica_id_in_sync_group])

    return float(np.ravel(keras_model.train_on_batch(distributed(x), distributed(y)))[0])


def compiled_for(model: Any, optimizer_class: type, user: str, needs: str) -> tuple[Any, Any]:
    """The Keras model behind ``model`` (aikit's ``Model`` wrapper or a Keras model) and its
    optimizer, refused unless it is an ``optimizer_class`` (``needs`` says how to compile it)
    with no update left half accumulated: ``user`` would start its plan in the middle of one."""
    keras_model = getattr(model, "model", model)
    optimizer = keras_model.optimizer
    if not isinstance(optimizer, optimizer_class):
        raise InvalidType(f"{user} needs the model compiled with {needs}, got optimizer {type(optimizer).__name__}")
    if optimizer.accumulated:
        raise InvalidValue(
            f"the optimizer holds {optimizer.accumulated} accumulated micro-step(s) of an unfinished update: "
            f"finish it (or start from a fresh optimizer) before {user}"
        )
    return keras_model, optimizer


def train_update(keras_model: Any, optimizer: Any, x: np.ndarray, y: np.ndarray, plan: EpochSchedule, step: int,
                 lr: float, before_micro_step: Callable[[], None] | None = None) -> list[float]:
    """One update: ``step`` of ``plan`` at LR ``lr``. The GA optimizer's ``steps`` and LR are
    set (variables: no retracing), then every micro-step hands each replica its own micro-batch
    (the step's ``j``-th to replica ``j % replicas``); returns the micro-steps' losses.
    ``before_micro_step`` is called before each (the adaptive run's clock)."""
    per_replica = [plan.micro_batches(step, r) for r in range(plan.num_replicas)]
    optimizer.steps = len(per_replica[0])
    optimizer.learning_rate = lr
    losses = []
    for rows in zip(*per_replica, strict=True):
        if before_micro_step is not None:
            before_micro_step()
        losses.append(train_micro_step(keras_model, x, y, rows))
    return losses
