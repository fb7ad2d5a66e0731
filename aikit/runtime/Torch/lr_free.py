"""The LR-free optimizers aikit's users pick instead of tuning an LR, recognised in torch:
Schedule-Free (``schedulefree``: ``AdamWScheduleFree``, ``SGDScheduleFree``,
``RAdamScheduleFree``, ``ScheduleFreeWrapper``) and the step-size estimators (``prodigyopt``'s
Prodigy, ``dadaptation``'s D-Adaptation), read from what they keep rather than imported.

Schedule-Free trains at one point (``y``) and evaluates at another (``x``, its average), so
``optimizer.train()``/``eval()`` must follow the model's mode and precede saving: its README's
contract, which :func:`eval_weights` keeps for a checkpoint. An aikit wrapper (GA, trace)
around one is recognised through the wrapped optimizer's groups.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

SCHEDULE_FREE = "Schedule-Free"
STEP_SIZE_ESTIMATOR = "step-size estimator"


def lr_free_kind(optimizer: Any) -> str | None:
    """:data:`SCHEDULE_FREE` for a Schedule-Free optimizer (its groups hold ``train_mode``, or
    its wrapper class does), :data:`STEP_SIZE_ESTIMATOR` for Prodigy or D-Adaptation (their
    groups hold the estimate ``d`` and its start ``d0``), None for any other optimizer."""
    groups = getattr(optimizer, "param_groups", None) or []
    if hasattr(optimizer, "train_mode") or any("train_mode" in group for group in groups):
        return SCHEDULE_FREE
    if any("d" in group and "d0" in group for group in groups):
        return STEP_SIZE_ESTIMATOR
    return None


def in_train_mode(optimizer: Any) -> bool:
    """Whether a Schedule-Free optimizer holds the training point ``y`` (after ``train()``)."""
    if hasattr(optimizer, "train_mode"):
        return bool(optimizer.train_mode)
    return bool(optimizer.param_groups[0]["train_mode"])


@contextlib.contextmanager
def eval_weights(optimizers: Iterable[Any]) -> Iterator[list[Any]]:
    """Inside, every Schedule-Free optimizer among ``optimizers`` that was in train mode is in
    eval mode (the model holds ``x``, the weights to evaluate and to save); afterwards it is put
    back in train mode. Yields the ones it switched (on every replica alike: the switch moves the
    weights, so every replica must make it)."""
    switched = [opt for opt in optimizers if lr_free_kind(opt) == SCHEDULE_FREE and in_train_mode(opt)]
    for optimizer in switched:
        optimizer.eval()
    try:
        yield switched
    finally:
        for optimizer in switched:
            optimizer.train()
