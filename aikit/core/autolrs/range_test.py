"""AutoLRS's LR range test: the sweep that sets the search range when no ``min_lr``/``max_lr`` is given.

The LR climbs log-evenly from :data:`RANGE_START` to :data:`RANGE_END` over ``range_steps``
steps (which the run then undoes), the losses smoothed over a fixed fraction of the test
(:func:`range_tracker`); ``max_lr`` is a third of the LR where the smoothed loss bottoms out,
read a step or two earlier under heavy-ball momentum (:func:`momentum_lag`), ``min_lr`` three decades below
(:func:`search_range`).
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


def momentum_lag(momentum: float) -> int:
    """The range test's steps by which ``max_lr`` is read before where the loss bottoms out,
    under an SGD's (or RMSprop's) heavy-ball ``momentum``: ``round(2 * momentum)`` (2 at 0.9).
    The heavy ball's loss answers the climbing LR late (its velocity takes steps to build and
    to turn), so the test's loss bottoms out at an LR it has only just reached; one third of it
    held 0.63 on the digits MLP where the constants 0.1-0.3 won (a 30-step test climbing 1.74x a
    step). Two steps back is a further third there, 1.4x on MNIST-1D's 90-step test at 900
    updates, where a third of the bottom already trained well (measured, docs/autolrs.md: not
    derived). Adam's first moment is an average, not a sum: its ``beta_1`` lags nothing here."""
    return round(2 * min(max(float(momentum), 0.0), 1.0))


def search_range(range_test: dict[str, list[float]], stop_reason: str | None,
                 momentum: float = 0.0) -> tuple[float, float]:
    """``(min_lr, max_lr)`` from a finished range test's LRs and smoothed losses (``momentum``:
    the optimizer's heavy-ball momentum, :func:`momentum_lag`); refused where it has too few
    finite losses to tell where the loss bottoms out."""
    lrs, losses = range_test["lr"], range_test["loss"]
    if not math.isfinite(losses[-1]):
        lrs, losses = lrs[:-1], losses[:-1]
    if len(losses) < 2:
        raise TrainingFailed(
            f"the LR range test stopped at its first LRs {range_test['lr']} with losses "
            f"{range_test['loss']}: a loss that is not finite at an LR of {RANGE_START:g} comes from the "
            "model, the data or the loss function, not the LR; check them (or give min_lr and max_lr)")
    bottom = suggest(lrs, losses, method="bottom")  # where the loss bottoms out
    hot = lrs[max(0, bottom.index - momentum_lag(momentum))]
    max_lr = hot / RANGE_BELOW_HOT
    min_lr = max_lr / 10**RANGE_DECADES
    log.info("AutoLRS: range test over %d steps (%s): the loss bottoms out at lr=%.4g (read at %.4g for momentum "
             "%g); searching min_lr=%.4g to max_lr=%.4g", len(range_test["lr"]), stop_reason or "completed",
             bottom.lr, hot, momentum, min_lr, max_lr)
    return min_lr, max_lr
