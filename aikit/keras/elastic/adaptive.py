"""Train a Keras model at the global batch a :class:`~aikit.core.goodput.GoodputController` picks.

:func:`fit_adaptive` is :func:`~aikit.keras.elastic.trace.fit_trace` with the trace written as the
run goes (Pollux/AdaptDL's adaptive batch, in Keras). The algorithm is
:mod:`aikit.core.adaptive`'s, the same as PyTorch's ``AdaptiveSampler`` and
``AdaptiveOptimizer``: which batch each update takes and where an epoch ends
(:class:`~aikit.core.adaptive.AdaptiveSchedule`: an epoch is one pass over the seeded
permutation ``fit_trace`` uses, updates take consecutive samples of it and never straddle two
epochs, an epoch's last update takes the largest batch of what is left that splits evenly over
the replicas), how updates are timed (:class:`~aikit.core.adaptive.UpdateClock`), and each
update's history row and decision (:class:`~aikit.core.adaptive.AdaptiveRun`); each update's LR is
its :class:`~aikit.core.lr_policy.LRPolicy`'s, as PyTorch's.

What is Keras' here: before each update the GA optimizer's ``steps`` and the LR are set as
variables (no retracing), and every micro-step is one ``train_on_batch`` with each replica on its
own samples. The per-device batch grows with the global batch, as PyTorch's does with
``max_device_batch``: each update split evenly in the fewest micro-batches of at most the
controller's ``max_device_batch``, every ``noise_every``-th update in two halves at least on one
device (where the noise is measured); a new micro-batch size does not retrace the training step
after the first two shapes (``tf.function``'s ``reduce_retracing`` makes it shape-generic), so the
tracings stay bounded however many sizes the run goes through; the update's gradient noise is measured by
:class:`~aikit.keras.noise.NoiseOptimizer` inside the update's one all-reduce. So every update
equals one big-batch step, whatever its plan. The batches of all updates form a
``step,batchsize`` trace that ``fit_trace`` replays exactly (with the rows' ``lr`` for AdaScale,
whose LR depends on the measured noise, which a trace does not hold).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from aikit.core import adaptive
from aikit.core.adaptive import AdaptiveRun, AdaptiveSchedule, UpdateClock, update_timing
from aikit.core.errors import InvalidType, InvalidValue
from aikit.core.goodput import GoodputController
from aikit.core.lr_policy import LRPolicy
from aikit.core.trace import Trace
from aikit.keras.noise import NoiseOptimizer
from aikit.runtime.Keras.training import compiled_for, parts_per_micro_step, replicas_of, train_update

log = logging.getLogger("aikit.adaptive")


__all__ = ["fit_adaptive", "learning_rate"]


def learning_rate(base_lr: float, batch: int, controller: GoodputController, rule: str) -> float:
    """The LR of an update at ``batch``: :func:`aikit.core.adaptive.learning_rate`."""
    return adaptive.learning_rate(controller, base_lr, batch, rule)


def fit_adaptive(model: Any, x: np.ndarray, y: np.ndarray, controller: GoodputController, *, base_lr: float,
                 rule: str = "adascale", epochs: int = 1, seed: int = 42, shuffle: bool = True,
                 trace_path: str | os.PathLike | None = None, verbose: bool = False,
                 clock: Callable[[], float] = time.perf_counter, hold_after: int | None = None) -> list[dict]:
    """Train ``model`` for ``epochs`` epochs at the global batch ``controller`` picks.

    ``model`` is a compiled Keras model (or :class:`aikit.keras.elastic.model.Model`) whose
    optimizer is a :class:`~aikit.keras.noise.NoiseOptimizer`; its replicas come from the
    strategy it was built under and must be the controller's ``devices``. The controller must
    plan with ``policy="error"``: Keras feeds equal micro-batches, so only batches that split
    evenly over the replicas are run. ``base_lr`` is the LR tuned at ``controller.ref_batch_size``;
    ``rule`` scales it to each update's batch: ``"adascale"`` (the gain from the measured
    noise), ``"linear"``, ``"sqrt"`` or ``"constant"``. ``trace_path``: where to write the run's
    batches as a ``step,batchsize`` CSV (after every epoch, so a stopped run leaves its trace).
    ``clock`` times the updates (seconds). ``hold_after``: hold the batch from the first update
    that starts at or after this many samples of the run, as PyTorch's ``AdaptiveSampler``
    (:class:`~aikit.core.adaptive.AdaptiveSchedule`): no more decisions, no noise measured.

    Returns one row per update, as PyTorch's ``AdaptiveOptimizer.history``
    (:func:`aikit.core.adaptive.history_row`: epoch, step, batch_size, ga_steps, micro_batch, lr,
    seconds, and the smoothed grad_sq, trace and noise_scale after it), with the update's mean
    ``loss``. Every change of batch is logged (logger ``aikit.adaptive``) and kept in
    ``controller.changes``. A controller restored (``load_state_dict``) from the end of an epoch
    goes on with the next one.
    """
    keras_model, optimizer = compiled_for(
        model, NoiseOptimizer, "fit_adaptive",
        "aikit.ga.TF.noise.NoiseOptimizer(optimizer) (aikit.keras.NoiseOptimizer), which measures the gradient "
        "noise the controller needs")
    replicas = replicas_of(keras_model)
    parts = parts_per_micro_step(keras_model)
    _check(controller, replicas, parts, x, y)
    run = AdaptiveRun(AdaptiveSchedule(len(x), controller, seed, shuffle, hold_after=hold_after), rule)
    policy = LRPolicy(run.rule, controller.ref_batch_size, adaptive=True, user="fit_adaptive")
    first = run.schedule.resume_recorded()
    update_clock = UpdateClock(clock)
    compiled: set[int] = set()  # micro-batch sizes run so far: the first update at a new one may compile
    for epoch in range(first, first + epochs):
        step = 0
        while step < len(run.schedule.epoch(epoch)):  # the epoch's updates, each decided after the one before
            _train_one_update(keras_model, optimizer, x, y, run, update_clock, compiled, epoch, step, policy, base_lr,
                              verbose)
            step += 1
        left = len(x) - run.schedule.epoch(epoch).samples
        if left:
            log.info("epoch %d: %d sample(s) left out (fewer than the %d replicas)", epoch, left, replicas)
        if trace_path is not None:
            Trace(controller.batches, source="fit_adaptive").to_csv(trace_path)
    return run.history


def _check(controller: GoodputController, num_replicas: int, parts: int, x: np.ndarray, y: np.ndarray) -> None:
    """Refuse a controller this model cannot follow, or data it cannot train on, naming the fix."""
    if not isinstance(controller, GoodputController):
        raise InvalidType(
            f"controller must be an aikit.core.goodput.GoodputController, got {type(controller).__name__}")
    if controller.devices != num_replicas or controller.policy != "error" or not controller.split.grows:
        raise InvalidValue(
            f"the controller plans for devices={controller.devices} with policy={controller.policy!r}"
            f"{', fixed_micro_batch=True' if controller.split and not controller.split.grows else ''}, but "
            f"the model trains on {num_replicas} replica(s) with equal micro-batches: create it as "
            f"GoodputController(max_device_batch, {num_replicas}, ..., policy='error')"
        )
    if controller.min_batch < num_replicas:
        raise InvalidValue(
            f"min_batch {controller.min_batch} is below the {num_replicas} replicas: every replica needs a "
            f"sample in every update, so use min_batch >= {num_replicas}"
        )
    if len(x) != len(y):
        raise InvalidValue(f"x has {len(x)} samples but y has {len(y)}")
    if controller.max_batch > len(x):
        raise InvalidValue(
            f"max_batch {controller.max_batch} is larger than the data set ({len(x)} samples): an update "
            "cannot span epochs, so use max_batch <= the data set size"
        )
    if parts * controller.plan(controller.batch).micro_steps < 2 and not controller.split.noise_every:
        raise InvalidValue(
            f"batch {controller.batch} runs as one micro-batch on one replica, from which gradient noise cannot "
            "be measured: give the controller noise_every=4 (every fourth update in two halves, where the noise is "
            "measured, as PyTorch's AdaptiveSampler does), use max_device_batch below "
            f"{controller.batch} (two or more micro-steps), or train on two or more replicas"
        )


def _train_one_update(keras_model: Any, optimizer: NoiseOptimizer, x: np.ndarray, y: np.ndarray, run: AdaptiveRun,
                      update_clock: UpdateClock, compiled: set[int], epoch: int, step: int, policy: LRPolicy,
                      base_lr: float, verbose: bool) -> None:
    """Update ``step`` of ``epoch`` at the policy's LR for its batch (from the noise measured so
    far: AdaScale's gain); then what it measured goes to
    the controller, whose decision the next update follows. Marks the clock before each
    micro-step: the update's own work runs inside the last one."""
    plan = run.schedule.epoch(epoch)
    batch, micro, steps = int(plan.batch_sizes[step]), plan.micro_size(step), int(plan.micro_steps[step])
    lr = policy.lr(base_lr, batch, noise=run.controller.noise.measured)
    losses = train_update(keras_model, optimizer, x, y, plan, step, lr, update_clock.end_micro_step)
    timing = update_timing(update_clock.measure(timed=micro in compiled))  # a new shape may have compiled
    compiled.add(micro)
    # a part is one replica's micro-batch, or on JAX the mesh's whole micro-batch (XLA reduced it)
    part_samples = micro * replicas_of(keras_model) // parts_per_micro_step(keras_model)
    run.record(batch, micro, steps, timing, optimizer.noise(part_samples))
    row = run.finish(epoch, lr, say=print if verbose else None)
    row["loss"] = float(np.mean(losses))
    if verbose:
        print(" ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
