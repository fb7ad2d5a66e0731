"""Updates skipped for a non-finite gradient: the count, the one warning, the failure of a run of them.

An update whose gradient is inf or NaN is skipped, as a ``torch.amp.GradScaler`` skips one (no
weight changes, nothing that counts updates advances), whatever the framework. One skip is a
bad batch, and training goes on; the first is warned about once per optimizer
(:class:`~aikit.core.errors.NonFiniteGradientWarning`), with what to check. A run of skips is
training that has failed: the weights no longer move, every batch gives inf or NaN at them, so
after ``max_skips_in_a_row`` of them :class:`~aikit.core.errors.TrainingFailed` says so.
:class:`SkipCount` keeps an optimizer's counts (the torch GA engine's); the Keras wrapper keeps
them in its graph and words its warning and failure with :func:`nonfinite_warning` and
:func:`too_many_skips`.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

from aikit.core.errors import NonFiniteGradientWarning, TrainingFailed
from aikit.core.validate import positive_int

# A bad batch or a spike skips an update or two, and AMP's GradScaler, once it has found its scale,
# skips one now and then; ten in a row, each on other data at unchanged weights, is no spike but a
# model, loss or LR that gives inf/NaN everywhere: stop within ten updates rather than train an
# epoch on nothing. A GradScaler still finding its first scale (from a large ``init_scale``:
# Megatron-LM starts at 2**32) halves it at every skip; those skips count only once its scale is
# below 1, where the loss is no longer scaled up and what overflows is the gradient itself (issue
# 47: left to itself, a GradScaler halved its scale down to 1e-44).
MAX_SKIPS_IN_A_ROW = 10
AMP_DETAIL = "found by AMP's GradScaler"

_AIKIT = str(Path(__file__).resolve().parents[1]) + os.sep  # aikit's own frames


def checked_max_skips(value: object) -> int | None:
    """``max_skips_in_a_row`` as a positive int, or None (skip for ever)."""
    return None if value is None else positive_int(value, "max_skips_in_a_row")


TORCH_COUNTS = "optimizer.updated is False, optimizer.skipped counts the skips"


def nonfinite_warning(detail: str, max_in_a_row: int | None, counts: str = TORCH_COUNTS) -> NonFiniteGradientWarning:
    """The warning of an optimizer's first skip; ``detail`` says what was not finite, ``counts``
    what the optimizer's counters say."""
    then = (f"; {max_in_a_row} skips in a row raise TrainingFailed (max_skips_in_a_row)" if max_in_a_row
            else "; max_skips_in_a_row=None: it skips them for ever")
    apply = "" if detail.startswith(AMP_DETAIL) else (
        "; skip_nonfinite=False applies such gradients, as torch's and Keras' optimizers do")
    return NonFiniteGradientWarning(
        f"aikit skipped an update: its gradient is not finite ({detail}), so no weight changed and nothing that "
        f"counts updates advanced, as a GradScaler skips one ({counts}). Check the loss and the data for inf/NaN "
        f"(a log or a division by 0, a bad sample) and the learning rate{then}{apply}. Warned once per optimizer."
    )


def too_many_skips(in_a_row: int, skipped: int, detail: str, updated: bool = True) -> TrainingFailed:
    """The failure of a run of ``in_a_row`` skips (``skipped`` in all; ``updated``: the optimizer
    says ``optimizer.updated``, as torch's wrappers do)."""
    counts = f"optimizer.updated is False; optimizer.skipped is {skipped}" if updated else (
        f"optimizer.skipped is {skipped}")
    return TrainingFailed(
        f"{in_a_row} updates in a row were skipped because their gradient was not finite ({detail}): the weights "
        f"have not changed since ({counts}), and every batch "
        "gives inf/NaN at them. Check the learning rate (lower it, or warm it up), the loss (a log or a division "
        "by 0, a mean over an empty batch) and the data (inf/NaN inputs or labels); max_skips_in_a_row=None skips "
        f"for ever{'' if detail.startswith(AMP_DETAIL) else ', skip_nonfinite=False applies such gradients'}"
    )


class SkipCount:
    """An optimizer's skipped updates: ``skipped`` (AMP's too), the non-finite ones ``in_a_row``."""

    def __init__(self, max_in_a_row: int | None = MAX_SKIPS_IN_A_ROW) -> None:
        self.max_in_a_row = checked_max_skips(max_in_a_row)
        self.skipped = 0  # updates skipped: for a non-finite gradient, or by AMP's GradScaler
        self.in_a_row = 0  # non-finite ones since the last update applied
        self.any_applied = False  # an update was applied: AMP's scaler has found a scale that works
        self._warned = False

    def applied(self) -> None:
        """An update was applied: a run of skips ends."""
        self.in_a_row = 0
        self.any_applied = True

    def amp_skipped(self, scale: Callable[[], float], count: int = 1, last_in_a_row: int | None = None,
                    updates: int | None = None) -> None:
        """AMP's GradScaler skipped ``count`` updates (``last_in_a_row`` and ``updates`` as for
        :meth:`nonfinite`). Lowering its scale is its work, so a skip is not warned about; but once
        it has found a scale (an update applied) a run of skips is refused as any other, and before,
        while it still finds its first, once ``scale()`` (read only then) is below 1: warned, and
        ``max_in_a_row`` of those refused."""
        if updates is not None and count < updates:
            self.any_applied = True  # some of the updates read together were applied
        if self.any_applied:
            self.nonfinite(AMP_DETAIL, count, last_in_a_row, updates, warn=False)
            return
        now = scale()
        if now >= 1:
            self.skipped += count  # still finding its first scale
            return
        self.nonfinite(f"{AMP_DETAIL}, whose scale is down to {now:.3g} without finding one that works", count,
                       last_in_a_row, updates)

    def nonfinite(self, detail: str, count: int = 1, last_in_a_row: int | None = None,
                  updates: int | None = None, warn: bool = True) -> None:
        """``count`` updates skipped for a non-finite gradient: counted, warned once, refused in a
        long run. Read together from a device (a fused optimizer skipped them in its kernel), of
        ``updates`` the last ``last_in_a_row`` were skipped in a row: a run is refused at the read
        that finds it long enough and still going."""
        trailing = count if last_in_a_row is None else last_in_a_row
        self.skipped += count
        self.in_a_row = self.in_a_row + trailing if trailing == (count if updates is None else updates) else trailing
        if warn and not self._warned:
            self._warned = True
            warnings.warn(nonfinite_warning(detail, self.max_in_a_row), stacklevel=user_stacklevel())
        if self.max_in_a_row is not None and self.in_a_row >= self.max_in_a_row:
            in_a_row, self.in_a_row = self.in_a_row, 0  # caught, training may go on: another run to fail
            raise too_many_skips(in_a_row, self.skipped, detail)


def user_stacklevel() -> int:
    """The ``stacklevel`` of a warning that names the first caller outside aikit (the user's
    ``optimizer.step()``), however deep in aikit it is raised."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_AIKIT):
        frame, level = frame.f_back, level + 1
    return level
