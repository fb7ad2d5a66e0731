"""What the Keras fit loops of aikit share: one micro-step with each replica on its own samples
(the backend's seam feeds them: distributed values on TensorFlow, this process's share of the
mesh on JAX, one device on torch), and the check that a model is compiled for the loop.

:func:`~aikit.keras.elastic.trace.fit_trace` and :func:`~aikit.keras.elastic.adaptive.fit_adaptive`
plan their updates differently (a trace, a controller) and train every micro-step here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from aikit.core.errors import InvalidType, InvalidValue
from aikit.core.schedule import EpochSchedule
from aikit.runtime.Keras.backend import check_backend, seam


def compiled_for(model: Any, optimizer_class: type, user: str, needs: str) -> tuple[Any, Any]:
    """The Keras model behind ``model`` (aikit's ``Model`` wrapper or a Keras model) and its
    optimizer, refused unless it is an ``optimizer_class`` (``needs`` says how to compile it)
    with no update left half accumulated: ``user`` would start its plan in the middle of one."""
    check_backend(user)
    keras_model = getattr(model, "model", model)
    optimizer = keras_model.optimizer
    if not isinstance(optimizer, optimizer_class):
        raise InvalidType(f"{user} needs the model compiled with {needs}, got optimizer {type(optimizer).__name__}")
    if optimizer.accumulated:
        raise InvalidValue(
            f"the optimizer holds {optimizer.accumulated} accumulated micro-step(s) of an unfinished update: "
            f"finish it (or start from a fresh optimizer) before {user}"
        )
    seam.check_placed(keras_model, user)
    optimizer.match_loss(keras_model)  # the reduction its compiled loss needs, or the mismatch refused
    return keras_model, optimizer


def replicas_of(keras_model: Any) -> int:
    """The replicas a compiled model trains on (a strategy's, a mesh's devices, or one)."""
    return seam.model_replicas(keras_model)


def parts_per_micro_step(keras_model: Any) -> int:
    """The gradients of one micro-step the optimizer sees apart (a strategy's replicas; one on JAX,
    whose mesh XLA reduces inside the step, and on torch): the parts gradient noise is measured from."""
    return seam.parts_per_micro_step(keras_model)


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
        losses.append(seam.train_micro_step(keras_model, x, y, rows))
    return losses
