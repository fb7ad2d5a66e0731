"""When an AutoLRS run's loss has diverged, and when rolling back no longer helps.

A trial whose loss diverges fails; a stage or anneal whose loss diverges is rolled back to its
checkpoint and retried at a third of its LR (:data:`ROLLBACK_FACTOR`), at most
:data:`MAX_ROLLBACKS` times in a row (:func:`hopeless` says why the run stops then).
:func:`diverged` judges the losses since the latest checkpoint or restore against the loss at
that checkpoint (:func:`recent_loss`).
"""

from __future__ import annotations

import math

import numpy as np

from aikit.core.autolrs.stages import Record

ROLLBACK_FACTOR = 3.0  # a diverged stage is retried at lr / 3 (again and again if needed)
DIVERGE_WINDOW = 5  # losses averaged to call a divergence (a single noisy batch is not one)
PROGRESS = 1.5  # a checkpoint's loss this far below the first loss is progress a divergence can lose
MAX_ROLLBACKS = 8  # rollbacks in a row (LR / 3**8) after which the loss is not the LR's doing: stop


def recent_loss(history: list[Record], after: int, upto: int) -> float:
    """The median of the last 10 finite training losses of steps ``after+1 .. upto``."""
    finite = [r.loss for r in history[after:upto] if math.isfinite(r.loss)][-10:]
    return float(np.median(finite)) if finite else math.inf


def diverged(history: list[Record], since: int, reference: float, factor: float,
             stall_floor: float | None = None) -> bool:
    """The losses after step ``since`` (the latest checkpoint or restore) have blown up: NaN/inf,
    or their mean over the last :data:`DIVERGE_WINDOW` steps has lost half the progress the run
    had made by the checkpoint (whose loss is ``reference``: a network killed by a large LR falls
    back to its first loss) or, before any progress (a loss less than 1/:data:`PROGRESS` of the
    first: else noise would trip it), grown ``factor``-fold. Noise late in training is neither.

    ``stall_floor``: the range test's lowest loss, where a stage 0 after it is due its check of
    a stall: a mean that has not made a quarter of the test's drop of the loss from the first
    loss is a net the test's LR killed (a dead ReLU net sits at its first loss, which no blow-up
    rule sees)."""
    recent = [r.loss for r in history[-DIVERGE_WINDOW:] if r.step > since]
    if not all(math.isfinite(x) for x in recent):
        return True
    if len(recent) < DIVERGE_WINDOW:
        return False
    first, mean = history[0].loss, float(np.mean(recent))
    if math.isfinite(first) and first > PROGRESS * reference:
        return mean > reference + (first - reference) / 2
    stalled = stall_floor is not None and math.isfinite(first) and mean > first - (first - stall_floor) / 4
    return mean > factor * reference or stalled


def hopeless(history: list[Record], lr: float, rollbacks_in_row: int, steps: int) -> str:
    """Why the run stops after :data:`MAX_ROLLBACKS` rollbacks in a row, the latest to ``lr``
    before step ``steps``."""
    recent = [r.loss for r in history[-DIVERGE_WINDOW:]]
    highest = lr * ROLLBACK_FACTOR ** (rollbacks_in_row - 1)
    finite = any(math.isfinite(r.loss) for r in history)
    cause = ("no step has had a finite loss: that comes from the model, the data or the loss function, not the "
             "LR; check them" if not finite else
             "the loss blows up however low the LR: check the model, the data and the loss (or give a lower "
             "min_lr and max_lr)")
    return (f"AutoLRS rolled back {MAX_ROLLBACKS} times in a row to the checkpoint before step {steps} "
            f"(lowering the LR from {highest:.4g} to {lr:.4g}), and the loss still diverged (last losses "
            f"{[round(x, 6) for x in recent]}): {cause}")
