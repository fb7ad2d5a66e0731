"""LR range test arithmetic (Smith, 2017; fastai's ``lr_find``), shared by every front end.

A range test trains for ``num_iter`` updates while the LR climbs from ``start_lr`` to
``end_lr``, records the (smoothed) loss at every LR and stops early once the loss diverges.
This module owns the numbers: the LR sequence, the smoothing and stop rules and the
suggestion rules that read an LR off the curve. The torch and Keras adapters only train.

The formulas are torch-lr-finder 0.2.2's, so its users get the same LRs and losses to the
bit: iteration ``i`` of ``n`` uses ``start * (end / start) ** (i / (n - 1))`` ("exp") or
``start + i / (n - 1) * (end - start)`` ("linear"), the first iteration uses ``start_lr`` and
the last exactly ``end_lr``.
"""

from __future__ import annotations

import csv
import math
import os
from typing import NamedTuple

import numpy as np

from aikit.core.errors import InvalidValue
from aikit.core.validate import checked_float, checked_int

STEP_MODES = ("exp", "linear")


def _number(value: object, name: str) -> float:
    number = checked_float(value, name, "a number", lambda _: True)
    if not math.isfinite(number):
        raise InvalidValue(f"{name} must be finite, got {value!r}")
    return number


def step_mode_name(step_mode: str) -> str:
    """``"exp"`` or ``"linear"`` (any case), or a ValueError naming both."""
    name = step_mode.lower() if isinstance(step_mode, str) else step_mode
    if name not in STEP_MODES:
        raise ValueError(f"step_mode must be one of {STEP_MODES} (any case), got {step_mode!r}")
    return name


def lr_sequence(start_lr: float, end_lr: float, num_iter: int, step_mode: str = "exp") -> list[float]:
    """The LR of every iteration: ``start_lr`` first, exactly ``end_lr`` last.

    Computed in Python floats with torch-lr-finder's formula, so histories match it bit for bit.
    """
    mode = step_mode_name(step_mode)
    num_iter = checked_int(num_iter, "num_iter", 2, None,
                           "an integer larger than 1 (the test needs a start and an end LR)")
    start, end = _number(start_lr, "start_lr"), _number(end_lr, "end_lr")
    if mode == "exp" and (start <= 0 or end <= 0):
        raise ValueError(
            f"step_mode='exp' needs start_lr > 0 and end_lr > 0, got start_lr={start!r}, "
            f"end_lr={end!r}; pass a positive start_lr or use step_mode='linear'"
        )
    if mode == "linear" and (start < 0 or end < 0):
        raise ValueError(f"learning rates must be >= 0, got start_lr={start!r}, end_lr={end!r}")
    last = num_iter - 1
    if mode == "exp":
        return [start * (end / start) ** (i / last) for i in range(num_iter)]
    return [start + i / last * (end - start) for i in range(num_iter)]


class LossTracker:
    """Smooths the loss and says when the test must stop, one iteration at a time.

    The first loss is kept raw and is the first best; every later one becomes
    ``smooth_f * loss + (1 - smooth_f) * previous`` (``smooth_f=0`` turns smoothing off).
    The test stops after a loss that is not finite, or after one that rose above
    ``diverge_th`` times the best (for a negative best: above ``best + (diverge_th - 1) * |best|``,
    so losses below zero do not stop the test at once). The stopping point is kept.
    """

    def __init__(self, smooth_f: float = 0.05, diverge_th: float = 5):
        smooth_f = _number(smooth_f, "smooth_f")
        if not 0 <= smooth_f < 1:
            raise ValueError(f"smooth_f must lie in [0, 1), got {smooth_f!r}; 0 turns smoothing off")
        self.smooth_f = smooth_f
        self.diverge_th = checked_float(diverge_th, "diverge_th", "a number >= 1 (the test stops once loss > "
                                        "diverge_th * best)", lambda factor: factor >= 1,
                                        fix="pass float('inf') never to stop on divergence")
        self.best: float | None = None
        self.last: float | None = None
        self.stop_reason: str | None = None

    def update(self, loss: float) -> float:
        """Take one raw loss; return the value to record and set ``stop_reason`` if the test ends."""
        loss = float(loss)
        if self.last is None:
            self.best = loss
        else:
            if self.smooth_f > 0:
                loss = self.smooth_f * loss + (1 - self.smooth_f) * self.last
            if loss < self.best:
                self.best = loss
        self.last = loss
        if not math.isfinite(loss):
            self.stop_reason = f"the loss is {loss}"
        elif self._diverged(loss):
            self.stop_reason = "the loss has diverged"
        return loss

    def _diverged(self, loss: float) -> bool:
        if not math.isfinite(self.best):
            return False
        if self.best >= 0:
            return loss > self.diverge_th * self.best
        return loss - self.best > (self.diverge_th - 1) * abs(self.best)


# --- suggestions: read an LR off the (lr, loss) curve --------------------------------------


class Suggestion(NamedTuple):
    """A suggested ``lr`` and the ``index`` of the history point it comes from (to mark it)."""

    lr: float
    index: int
    method: str


def trim(values: list, skip_start: int = 0, skip_end: int = 0) -> list:
    """``values[skip_start:-skip_end]`` (``values[skip_start:]`` when ``skip_end`` is 0)."""
    if skip_start < 0:
        raise ValueError(f"skip_start cannot be negative, got {skip_start}")
    if skip_end < 0:
        raise ValueError(f"skip_end cannot be negative, got {skip_end}")
    return values[skip_start:-skip_end] if skip_end else values[skip_start:]


def _steepest(lrs: np.ndarray, losses: np.ndarray) -> tuple[int, float]:
    """Steepest descent over the iteration index (torch-lr-finder's rule; a hint, not an oracle)."""
    index = int(np.gradient(losses).argmin())
    return index, lrs[index]


def _minimum(lrs: np.ndarray, losses: np.ndarray) -> tuple[int, float]:
    """A tenth of the LR at the lowest loss (fastai's ``minimum``): the minimum is already too hot."""
    index = int(losses.argmin())
    return index, lrs[index] / 10


def _valley(lrs: np.ndarray, losses: np.ndarray) -> tuple[int, float]:
    """Halfway down the longest valley (fastai's ``valley``): the longest strictly decreasing
    subsequence of losses, from its first point to its last; the first longest one wins."""
    length = np.ones(len(losses), dtype=int)
    previous = np.full(len(losses), -1)
    for i in range(1, len(losses)):
        higher = np.flatnonzero(losses[:i] > losses[i])
        if len(higher):
            j = higher[np.argmax(length[higher])]
            length[i], previous[i] = length[j] + 1, j
    end = start = int(np.argmax(length))
    while previous[start] >= 0:
        start = int(previous[start])
    index = start + (end - start) // 2
    return index, lrs[index]


def _slide(lrs: np.ndarray, losses: np.ndarray, lr_diff: int = 15, thresh: float = 0.005) -> tuple[int, float]:
    """fastai's interval slide rule: walk an ``lr_diff``-wide window left from the end while the
    loss gradients at its two ends differ by more than ``thresh``; its left end is the LR."""
    if len(losses) <= lr_diff:
        raise ValueError(
            f"the 'slide' suggestion needs more than lr_diff={lr_diff} points, got {len(losses)}; "
            "run more iterations, skip fewer, or pass a smaller lr_diff"
        )
    grad = np.gradient(losses)
    right, left = len(losses) - 1, len(losses) - 1 - lr_diff
    index = left
    while left >= 0 and abs(grad[right] - grad[left]) > thresh:
        index = left
        right, left = right - 1, left - 1
    return index, lrs[index]


SUGGESTIONS = {"steepest": _steepest, "valley": _valley, "minimum": _minimum, "slide": _slide}


def suggest(
    lrs: list[float],
    losses: list[float],
    method: str = "steepest",
    skip_start: int = 0,
    skip_end: int = 0,
    **options,
) -> Suggestion:
    """Suggest an LR from a range test's history by ``method`` (one of ``SUGGESTIONS``).

    The first ``skip_start`` and last ``skip_end`` points are ignored, and so is a final
    non-finite loss (the point that stopped the test). ``Suggestion.index`` indexes the
    untrimmed history. ``options`` go to the method (``lr_diff``, ``thresh`` for "slide").
    """
    if method not in SUGGESTIONS:
        raise ValueError(f"suggestion method must be one of {tuple(SUGGESTIONS)}, got {method!r}")
    if len(lrs) != len(losses):
        raise ValueError(f"lrs and losses differ in length: {len(lrs)} != {len(losses)}")
    if len(lrs) < skip_start + skip_end + 2:
        raise RuntimeError(
            f"Need at least {skip_start + skip_end + 2} iterations to suggest a learning rate. Got {len(lrs)}"
        )
    lr_part = np.asarray(trim(list(lrs), skip_start, skip_end), dtype=float)
    loss_part = np.asarray(trim(list(losses), skip_start, skip_end), dtype=float)
    finite = np.isfinite(loss_part)
    if not finite.all():
        first_bad = int(np.argmin(finite))
        if first_bad < 2 or finite[first_bad:].any():
            raise ValueError(
                f"losses must be finite (a non-finite one may only end the history), got "
                f"{loss_part[first_bad]} at index {first_bad + skip_start}; skip it with skip_start"
            )
        lr_part, loss_part = lr_part[:first_bad], loss_part[:first_bad]
    index, lr = SUGGESTIONS[method](lr_part, loss_part, **options)
    return Suggestion(float(lr), index + skip_start, method)


# --- history on disk ----------------------------------------------------------------------


def write_history(path: str | os.PathLike, history: dict) -> None:
    """Save a ``{"lr": [...], "loss": [...]}`` history as CSV with an ``lr,loss`` header;
    floats are written with ``repr`` so reading them back gives the same bits."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["lr", "loss"])
        writer.writerows(zip(history["lr"], history["loss"], strict=True))


def read_history(path: str | os.PathLike) -> dict:
    """Read a history written by :func:`write_history`."""
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    return {"lr": [float(row["lr"]) for row in rows], "loss": [float(row["loss"]) for row in rows]}
