"""Train a Keras model on a batch-size trace: the global batch of every update comes from a CSV.

:class:`aikit.core.schedule.Schedule` decides which samples every step uses and deals its
fixed-size micro-batches to the replicas; this module feeds them to Keras. Every micro-step
is one ``train_on_batch`` of ``micro_batch`` samples per replica (static shapes, no
retracing); the GA optimizer's ``steps`` and the wrapped optimizer's learning rate are set,
as variables, before each update: ``steps`` to the step's micro-batches per replica and the
LR by :class:`aikit.core.lr_policy.LRPolicy`, the policy the torch trace optimizers ask (a rule of
:data:`aikit.core.scaling.RULES`, warmup, an LR decay over samples). So one update equals one step
on the trace's global batch at the rule's LR.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from aikit.core.errors import InvalidValue
from aikit.core.lr_policy import LRPolicy
from aikit.core.scaling import lr_rule
from aikit.core.schedule import Schedule
from aikit.core.trace import Trace
from aikit.keras.optimizers import Optimizer
from aikit.runtime.Keras.training import compiled_for, replicas_of, train_update


def fit_trace(model: Any, x: np.ndarray, y: np.ndarray, trace: Trace | str | list[int] | int, *,
              micro_batch: int | None = None, base_lr: float, ref_batch_size: int, rule: str = "linear",
              warmup_steps: int = 0, learning_rates: Sequence[float] | None = None,
              lr_decay: Callable[[int], float] | None = None, epochs: int = 1, initial_epoch: int = 0, seed: int = 42,
              shuffle: bool = True, verbose: bool = False) -> list[dict]:
    """Train ``model`` for ``epochs`` epochs with the global batch of each update from ``trace``.

    ``model`` is a compiled Keras model (or :class:`aikit.keras.elastic.model.Model`) whose
    optimizer is an :class:`aikit.keras.optimizers.Optimizer`; its replicas come from the
    strategy the model was built under (the devices of the ``keras.distribution`` on JAX).
    Every trace entry must be a multiple of
    ``micro_batch`` x replicas (each replica gets the same number of micro-batches).
    ``learning_rates``: the LR of every update by step, used instead of the rule (an AdaScale
    run of :func:`~aikit.keras.elastic.adaptive.fit_adaptive` replays with its rows' ``lr``; its
    ``rule="adascale"`` is accepted then, and only then: AdaScale's LRs come from the gradient
    noise that run measured, which a batch trace does not hold). ``lr_decay`` (e.g.
    :func:`aikit.core.scaling.cosine_decay`) multiplies the base LR by its value at the samples the
    trace trained before each step; ``rule="seesaw"`` needs it (Seesaw's LR: ``base_lr x decay x
    sqrt(B / ref_batch_size)`` over a trace of :func:`aikit.core.ramp.seesaw_schedule`).
    Returns one row per update: epoch, step, batch_size, ga_steps, lr and mean loss.
    """
    micro, micro_name = micro_batch, "micro_batch"
    if micro is None:
        raise InvalidValue("fit_trace needs micro_batch, the samples of one micro-batch on each replica")
    keras_model, optimizer = compiled_for(model, Optimizer, "fit_trace",
                                          "aikit.ga.TF.optimizers.Optimizer(optimizer, steps) (aikit.keras.Optimizer)")
    if learning_rates is None:
        if lr_rule(rule, adaptive=None).measured:
            raise InvalidValue(
                f"rule={rule!r} needs the LRs of the run it replays (AdaScale's gain comes from the gradient "
                "noise that run measured, which a batch trace does not hold): pass "
                "learning_rates=[row['lr'] for row in rows], the rows fit_adaptive returned"
            )
        policy = LRPolicy(rule, ref_batch_size, warmup_steps, lr_decay, user=f"rule={rule!r}")
    else:
        lr_rule(rule, adaptive=None)  # the rule of the run whose LRs these are
        if lr_decay is not None:
            raise InvalidValue(f"lr_decay is not given with learning_rates (those are every step's LR); got "
                               f"{lr_decay!r:.60}")
    if len(x) != len(y):
        raise InvalidValue(f"x has {len(x)} samples but y has {len(y)}")
    replicas = replicas_of(keras_model)
    schedule = Schedule(trace, len(x), num_replicas=replicas, seed=seed, shuffle=shuffle, balanced=True,
                        micro_batch=micro, micro_name=micro_name)
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
                samples = schedule.trace.samples_before(update) if policy.decays else 0
                lr = policy.lr(base_lr, batch_size, update, samples)
            else:
                lr = float(learning_rates[update])
            losses = train_update(keras_model, optimizer, x, y, plan, step, lr)
            row = {"epoch": epoch, "step": update, "batch_size": batch_size, "ga_steps": len(losses),
                   "lr": lr, "loss": float(np.mean(losses))}
            log.append(row)
            if verbose:
                print(" ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    return log
