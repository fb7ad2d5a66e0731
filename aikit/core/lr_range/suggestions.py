"""Reading an LR off a range test's (lr, loss) curve: torch-lr-finder's steepest descent,
fastai's ``valley``, ``minimum`` and ``slide``, and ``bottom`` (AutoLRS's), by name."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from aikit.core.errors import InvalidState, InvalidValue

BOTTOM_NEAR = 0.1  # "bottom": the loss within this fraction of its whole drop of its lowest


class Suggestion(NamedTuple):
    """A suggested ``lr`` and the ``index`` of the history point it comes from (to mark it)."""

    lr: float
    index: int
    method: str


def trim(values: list, skip_start: int = 0, skip_end: int = 0) -> list:
    """``values[skip_start:-skip_end]`` (``values[skip_start:]`` when ``skip_end`` is 0)."""
    if skip_start < 0:
        raise InvalidValue(f"skip_start cannot be negative, got {skip_start}")
    if skip_end < 0:
        raise InvalidValue(f"skip_end cannot be negative, got {skip_end}")
    return values[skip_start:-skip_end] if skip_end else values[skip_start:]


def _steepest(lrs: np.ndarray, losses: np.ndarray) -> tuple[int, float]:
    """Steepest descent over the iteration index (torch-lr-finder's rule; a hint, not an oracle)."""
    index = int(np.gradient(losses).argmin())
    return index, lrs[index]


def _minimum(lrs: np.ndarray, losses: np.ndarray) -> tuple[int, float]:
    """A tenth of the LR at the lowest loss (fastai's ``minimum``): the minimum is already too hot."""
    index = int(losses.argmin())
    return index, lrs[index] / 10


def _bottom(lrs: np.ndarray, losses: np.ndarray) -> tuple[int, float]:
    """Where the loss bottoms out: the first LR at which it came within :data:`BOTTOM_NEAR` of its
    whole drop of the lowest loss. Not the lowest point itself: where the loss runs along a long
    floor before it blows up (a transformer under Adam), the lowest point lies anywhere on the
    floor, and training there stalls (the small LM of ``benchmarks/lr_free.py``: 3-15x the LR
    that trains best). AutoLRS's ``max_lr`` is a third of it."""
    lowest = losses.min()
    index = int(np.argmax(losses <= lowest + BOTTOM_NEAR * (losses[0] - lowest)))
    return index, lrs[index]


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
        raise InvalidValue(
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


SUGGESTIONS = {"steepest": _steepest, "valley": _valley, "minimum": _minimum, "slide": _slide, "bottom": _bottom}


def suggest(lrs: list[float], losses: list[float], method: str = "steepest", skip_start: int = 0, skip_end: int = 0,
            **options) -> Suggestion:
    """Suggest an LR from a range test's history by ``method`` (one of ``SUGGESTIONS``).

    The first ``skip_start`` and last ``skip_end`` points are ignored, and so is a final
    non-finite loss (the point that stopped the test). ``Suggestion.index`` indexes the
    untrimmed history. ``options`` go to the method (``lr_diff``, ``thresh`` for "slide").
    """
    if method not in SUGGESTIONS:
        raise InvalidValue(f"suggestion method must be one of {tuple(SUGGESTIONS)}, got {method!r}")
    if len(lrs) != len(losses):
        raise InvalidValue(f"lrs and losses differ in length: {len(lrs)} != {len(losses)}")
    if len(lrs) < skip_start + skip_end + 2:
        raise InvalidState(
            f"Need at least {skip_start + skip_end + 2} iterations to suggest a learning rate. Got {len(lrs)}"
        )
    lr_part = np.asarray(trim(list(lrs), skip_start, skip_end), dtype=float)
    loss_part = np.asarray(trim(list(losses), skip_start, skip_end), dtype=float)
    finite = np.isfinite(loss_part)
    if not finite.all():
        first_bad = int(np.argmin(finite))
        if first_bad < 2 or finite[first_bad:].any():
            raise InvalidValue(
                f"losses must be finite (a non-finite one may only end the history), got "
                f"{loss_part[first_bad]} at index {first_bad + skip_start}; skip it with skip_start"
            )
        lr_part, loss_part = lr_part[:first_bad], loss_part[:first_bad]
    index, lr = SUGGESTIONS[method](lr_part, loss_part, **options)
    return Suggestion(float(lr), index + skip_start, method)
