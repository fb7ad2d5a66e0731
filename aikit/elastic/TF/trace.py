"""Train a Keras model on a batch-size trace: the global batch of every update comes from a CSV.

:class:`aikit.core.schedule.Schedule` decides which samples every step uses and deals its
fixed-size micro-batches to the replicas; this module feeds them to Keras. Every micro-step
is one ``train_on_batch`` of ``minibatch_size`` samples per replica (static shapes, no
retracing); the GA optimizer's ``steps`` and the wrapped optimizer's learning rate are set,
as variables, before each update: ``steps`` to the step's micro-batches per replica and the
LR by :func:`aikit.core.scaling.scaled_lr` (linear, sqrt or constant rule, optional warmup).
So one update equals one step on the trace's global batch at the rule's LR.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from aikit.core.errors import InvalidValue
from aikit.core.scaling import rule_name, scaled_lr
from aikit.core.schedule import EpochSchedule, Schedule
from aikit.core.trace import Trace
from aikit.ga.TF.keras_backend import keras_on_tensorflow
from aikit.ga.TF.optimizers import Optimizer

keras = keras_on_tensorflow()


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
        raise TypeError(f"{user} needs the model compiled with {needs}, got optimizer {type(optimizer).__name__}")
    if optimizer.accumulated:
        raise ValueError(
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


def fit_trace(
    model: Any,
    x: np.ndarray,
    y: np.ndarray,
    trace: Trace | str | list[int] | int,
    *,
    minibatch_size: int,
    base_lr: float,
    ref_batch_size: int,
    rule: str = "linear",
    warmup_steps: int = 0,
    learning_rates: Sequence[float] | None = None,
    epochs: int = 1,
    initial_epoch: int = 0,
    seed: int = 42,
    shuffle: bool = True,
    verbose: bool = False,
) -> list[dict]:
    """Train ``model`` for ``epochs`` epochs with the global batch of each update from ``trace``.

    ``model`` is a compiled Keras model (or :class:`aikit.elastic.TF.model.Model`) whose
    optimizer is an :class:`aikit.ga.TF.optimizers.Optimizer`; its replicas come from the
    strategy the model was built under. Every trace entry must be a multiple of
    ``minibatch_size`` x replicas (each replica gets the same number of micro-batches).
    ``learning_rates``: the LR of every update by step, used instead of the rule (an AdaScale
    run of :func:`~aikit.elastic.TF.adaptive.fit_adaptive` replays with its rows' ``lr``).
    Returns one row per update: epoch, step, batch_size, ga_steps, lr and mean loss.
    """
    keras_model, optimizer = compiled_for(model, Optimizer, "fit_trace",
                                          "aikit.ga.TF.optimizers.Optimizer(optimizer, steps)")
    rule = rule_name(rule)
    if len(x) != len(y):
        raise InvalidValue(f"x has {len(x)} samples but y has {len(y)}")
    replicas = keras_model.distribute_strategy.num_replicas_in_sync
    schedule = Schedule(trace, len(x), num_replicas=replicas, minibatch_size=minibatch_size, seed=seed,
                        shuffle=shuffle, balanced=True)
    if learning_rates is not None:
        steps = schedule.epoch_bounds(initial_epoch + epochs - 1)[1]
        if len(learning_rates) < steps:
            raise InvalidValue(f"learning_rates has {len(learning_rates)} entries but the {epochs} epoch(s) train "
                               f"steps 0..{steps - 1}: give one LR per step of the trace")

    log: list[dict] = []
    for epoch in range(initial_epoch, initial_epoch + epochs):
        plan = schedule.epoch(epoch)
        for step in range(len(plan)):
            batch_size = int(plan.batch_sizes[step])
            update = plan.first_step + step
            if learning_rates is None:
                lr = scaled_lr(base_lr, batch_size, ref_batch_size, rule, step=update, warmup_steps=warmup_steps)
            else:
                lr = float(learning_rates[update])
            losses = train_update(keras_model, optimizer, x, y, plan, step, lr)
            row = {"epoch": epoch, "step": update, "batch_size": batch_size, "ga_steps": len(losses),
                   "lr": lr, "loss": float(np.mean(losses))}
            log.append(row)
            if verbose:
                print(" ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    return log
