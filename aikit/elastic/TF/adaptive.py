"""Train a Keras model at the global batch a :class:`~aikit.core.goodput.GoodputController` picks.

:func:`fit_adaptive` is :func:`~aikit.elastic.TF.trace.fit_trace` with the trace written as the
run goes (Pollux/AdaptDL's adaptive batch, in Keras): before each update the controller's batch
is planned (:meth:`GoodputController.plan`: GA steps x micro-batch on every replica), the GA
optimizer's ``steps`` and the LR are set as variables, and every micro-step is one
``train_on_batch``; after it, the update's duration and its gradient noise (measured by
:class:`~aikit.ga.TF.noise.NoiseOptimizer` inside the update's one all-reduce) go to the
controller, which may choose another batch for the next update. So every update equals one
big-batch step, whatever its plan.

Sample accounting is :class:`~aikit.core.schedule.Schedule`'s: an epoch is one pass over the
same seeded permutation, updates take consecutive samples of it, and an update never straddles
two epochs. Where fewer samples remain than the chosen batch, the epoch's last update takes
the largest batch of them that runs on the replicas (as many of them as can be dealt equally:
fewer than the replicas are left out of that epoch only), so every sample of the epoch is used
once. The batches of all updates form a ``step,batchsize`` trace that ``fit_trace`` replays
exactly (with the LR rule ``linear``, ``sqrt`` or ``constant``; AdaScale's LR depends on the
measured noise, which a trace does not hold).
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any

import numpy as np

from aikit.core.errors import InvalidValue
from aikit.core.goodput import GoodputController
from aikit.core.scaling import adaptive_lr, adaptive_rule_name
from aikit.core.schedule import Schedule
from aikit.core.trace import Trace
from aikit.ga.TF.noise import NoiseOptimizer
from aikit.runtime.TF.keras_backend import keras_on_tensorflow
from aikit.runtime.TF.training import compiled_for, train_micro_step

keras = keras_on_tensorflow()
log = logging.getLogger("aikit.adaptive")


__all__ = ["fit_adaptive", "learning_rate"]


def learning_rate(base_lr: float, batch: int, controller: GoodputController, rule: str) -> float:
    """The LR of an update at ``batch``: :func:`aikit.core.scaling.adaptive_lr` over
    ``controller.base_batch`` with the controller's smoothed noise (None before a first estimate)."""
    noise = controller.noise.smoothed if controller.noise.updates else None
    return adaptive_lr(base_lr, batch, controller.base_batch, rule, noise)


def epoch_order(dataset_size: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The sample order of ``epoch``: :class:`Schedule`'s own, so ``fit_trace`` replays it."""
    return Schedule(1, dataset_size, minibatch_size=1, seed=seed, shuffle=shuffle).epoch(epoch).order


def fit_adaptive(
    model: Any,
    x: np.ndarray,
    y: np.ndarray,
    controller: GoodputController,
    *,
    base_lr: float,
    rule: str = "adascale",
    epochs: int = 1,
    seed: int = 42,
    shuffle: bool = True,
    trace_path: str | os.PathLike | None = None,
    verbose: bool = False,
) -> list[dict]:
    """Train ``model`` for ``epochs`` epochs at the global batch ``controller`` picks.

    ``model`` is a compiled Keras model (or :class:`aikit.elastic.TF.model.Model`) whose
    optimizer is a :class:`~aikit.ga.TF.noise.NoiseOptimizer`; its replicas come from the
    strategy it was built under and must be the controller's ``devices``. The controller must
    plan with ``policy="error"``: Keras feeds equal micro-batches, so only batches that split
    evenly over the replicas are run. ``base_lr`` is the LR tuned at ``controller.base_batch``;
    ``rule`` scales it to each update's batch: ``"adascale"`` (the gain from the measured
    noise), ``"linear"``, ``"sqrt"`` or ``"constant"``. ``trace_path``: where to write the run's
    batches as a ``step,batchsize`` CSV (after every epoch, so a stopped run leaves its trace).

    Returns one row per update: epoch, step, batch_size, ga_steps, micro_batch, lr, loss,
    seconds (None where not timed), and the smoothed grad_sq, trace and noise_scale after it.
    Every change of batch is logged (logger ``aikit.adaptive``) and kept in ``controller.changes``.
    A controller restored (``load_state_dict``) from the end of an epoch goes on with the next one.
    """
    keras_model, optimizer = compiled_for(
        model, NoiseOptimizer, "fit_adaptive",
        "aikit.ga.TF.noise.NoiseOptimizer(optimizer), which measures the gradient noise the controller needs")
    if not isinstance(controller, GoodputController):
        raise TypeError(f"controller must be an aikit.core.goodput.GoodputController, got {type(controller).__name__}")
    rule = adaptive_rule_name(rule)
    replicas = keras_model.distribute_strategy.num_replicas_in_sync
    if controller.devices != replicas or controller.policy != "error":
        raise InvalidValue(
            f"the controller plans for devices={controller.devices} with policy={controller.policy!r}, but "
            f"the model trains on {replicas} replica(s) with equal micro-batches: create it as "
            f"GoodputController(max_device_batch, {replicas}, ..., policy='error')"
        )
    if controller.min_batch < replicas:
        raise InvalidValue(
            f"min_batch {controller.min_batch} is below the {replicas} replicas: every replica needs a "
            f"sample in every update, so use min_batch >= {replicas}"
        )
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} samples but y has {len(y)}")
    if controller.max_batch > len(x):
        raise InvalidValue(
            f"max_batch {controller.max_batch} is larger than the data set ({len(x)} samples): an update "
            "cannot span epochs, so use max_batch <= the data set size"
        )
    first = controller.plan(controller.batch)
    if replicas * first.steps < 2:
        raise InvalidValue(
            f"batch {controller.batch} runs as one micro-batch on one replica, from which gradient noise cannot "
            f"be measured: use max_device_batch below {controller.batch} (two or more micro-steps) or train on "
            "two or more replicas"
        )

    rows: list[dict] = []
    seen_micro: set[int] = set()  # micro-batch sizes run so far: the first update at a new one may compile
    epoch0 = _epochs_done(controller, len(x), replicas)
    for epoch in range(epoch0, epoch0 + epochs):
        order = epoch_order(len(x), seed, epoch, shuffle)
        offset = 0
        while len(x) - offset >= replicas:
            chosen = controller.batch
            batch = chosen if chosen <= len(x) - offset else _largest_runnable(controller, len(x) - offset)
            plan = controller.plan(batch)
            lr = learning_rate(base_lr, batch, controller, rule)
            optimizer.steps = plan.steps
            optimizer.learning_rate = lr
            samples = order[offset:offset + batch]
            start = time.perf_counter()
            losses = [  # each micro-step: micro_batch samples on each replica
                train_micro_step(keras_model, x, y, np.split(part, replicas))
                for part in np.split(samples, plan.steps)
            ]
            seconds = time.perf_counter() - start if plan.batch_size in seen_micro else None
            seen_micro.add(plan.batch_size)
            controller.observe(seconds, optimizer.noise(plan.batch_size), batch=batch)
            offset += batch
            row = {"epoch": epoch, "step": len(controller.batches) - 1, "batch_size": batch,
                   "ga_steps": plan.steps, "micro_batch": plan.batch_size, "lr": lr,
                   "loss": float(np.mean(losses)), "seconds": seconds, **_noise_columns(controller)}
            rows.append(row)
            if verbose:
                print(" ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
            proposed = controller.propose()
            if proposed is not None:
                update, old, new, predicted = controller.changes[-1]
                message = (f"adaptive batch: {old} -> {new} from update {update} (predicted goodput gain "
                           f"{predicted:.3f}x; plan {controller.plan(new).steps} GA steps x "
                           f"{controller.plan(new).batch_size} on {replicas} replica(s))")
                log.info(message)
                if verbose:
                    print(message)
        if len(x) > offset:
            log.info("epoch %d: %d sample(s) left out (fewer than the %d replicas)", epoch, len(x) - offset, replicas)
        if trace_path is not None:
            Trace(controller.batches, source="fit_adaptive").to_csv(trace_path)
    return rows


def _largest_runnable(controller: GoodputController, samples: int) -> int:
    """The largest batch of at most ``samples`` that runs with equal micro-batches on every device."""
    for batch in range(samples - samples % controller.devices, 0, -controller.devices):
        try:
            controller.plan(batch)
        except InvalidValue:
            continue
        return batch
    raise AssertionError("unreachable: one sample per device always splits evenly")


def _epochs_done(controller: GoodputController, dataset_size: int, replicas: int) -> int:
    """Epochs the controller's recorded updates complete: a resumed run goes on with the next.
    Packs them as the run did (an update that does not fit opens the next epoch)."""
    if not controller.batches:
        return 0
    epoch, offset = 0, 0
    for batch in controller.batches:
        if batch > dataset_size - offset:
            epoch, offset = epoch + 1, 0
        offset += batch
    if dataset_size - offset >= replicas:
        raise InvalidValue(
            f"the controller's {len(controller.batches)} recorded updates end inside epoch {epoch} ({offset} of "
            f"{dataset_size} samples): resume from a controller state saved at the end of an epoch"
        )
    return epoch + 1


def _noise_columns(controller: GoodputController) -> dict:
    if not controller.noise.updates:
        return {"grad_sq": math.nan, "trace": math.nan, "noise_scale": math.nan}
    noise = controller.noise.smoothed
    return {"grad_sq": noise.grad_sq, "trace": noise.trace, "noise_scale": noise.noise_scale}
