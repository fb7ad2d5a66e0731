"""AutoLRS's LR range test: the sweep that sets the search range when no ``min_lr``/``max_lr`` is given.

The LR climbs log-evenly from :data:`RANGE_START` to :data:`RANGE_END` over ``range_steps``
steps (which the run then undoes), the losses smoothed over a fixed fraction of the test
(:func:`range_tracker`); ``max_lr`` is a third of the LR where the smoothed loss bottoms out,
``min_lr`` three decades below (:func:`search_range`).
"""

from __future__ import annotations

import logging
import math

from aikit.core.errors import TrainingFailed
from aikit.core.lr_range import LossTracker, lr_sequence, suggest

log = logging.getLogger("aikit.autolrs")

RANGE_START, RANGE_END = 1e-6, 10.0  # the default range test's sweep
RANGE_BELOW_HOT = 3.0  # max_lr = (the LR where the range test's loss bottoms out) / 3: that LR is already too hot
RANGE_SMOOTHING = 5.0  # the range test's losses are averaged over about range_steps / this many steps
RANGE_DECADES = 3  # min_lr = max_lr / 10**3


def range_lrs(range_steps: int) -> list[float]:
    """The LR of each of the test's steps."""
    return lr_sequence(RANGE_START, RANGE_END, range_steps)


def range_tracker(range_steps: int) -> LossTracker:
    """The range test's loss tracker, averaging over a fixed fraction of the test (0.05,
    torch-lr-finder's, at 100 steps), so that a shorter test does not find where its loss
    bottoms out later in its sweep than a longer one."""
    return LossTracker(min(0.5, RANGE_SMOOTHING / range_steps))


def tracker_state(tracker: LossTracker) -> dict:
    """A running range test's tracker as plain numbers (for a controller's ``state_dict``)."""
    return {"best": tracker.best, "last": tracker.last, "stop_reason": tracker.stop_reason}


def restored_tracker(state: dict, range_steps: int) -> LossTracker:
    """The tracker :func:`tracker_state` saved."""
    tracker = range_tracker(range_steps)
    tracker.best, tracker.last, tracker.stop_reason = (state[k] for k in ("best", "last", "stop_reason"))
    return tracker


def ramped(lr: float, since: int, ramp_steps: int) -> float:
    """The LR of stage 0 after a range test, ``since`` its start or rollback: ``lr`` (the test's
    ``max_lr``), or less in its first ``ramp_steps`` steps: a linear warmup from the untrained
    net to that LR, which trains an untrained net too hard at once."""
    if since < ramp_steps:
        return lr * (since + 1) / (ramp_steps + 1)
    return lr


def search_range(range_test: dict[str, list[float]], stop_reason: str | None) -> tuple[float, float]:
    """``(min_lr, max_lr)`` from a finished range test's LRs and smoothed losses; refused where
    it has too few finite losses to tell where the loss bottoms out."""
    lrs, losses = range_test["lr"], range_test["loss"]
    if not math.isfinite(losses[-1]):
        lrs, losses = lrs[:-1], losses[:-1]
    if len(losses) < 2:
        raise TrainingFailed(
            f"the LR range test stopped at its first LRs {range_test['lr']} with losses "
            f"{range_test['loss']}: a loss that is not finite at an LR of {RANGE_START:g} comes from the "
            "model, the data or the loss function, not the LR; check them (or give min_lr and max_lr)")
    hot = suggest(lrs, losses, method="bottom").lr  # where the loss bottoms out
    max_lr = hot / RANGE_BELOW_HOT
    min_lr = max_lr / 10**RANGE_DECADES
    log.info("AutoLRS: range test over %d steps (%s): the loss bottoms out at lr=%.4g; searching min_lr=%.4g to "
             "max_lr=%.4g", len(range_test["lr"]), stop_reason or "completed", hot, min_lr, max_lr)
    return min_lr, max_lr
