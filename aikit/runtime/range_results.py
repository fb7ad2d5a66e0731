"""What every range-test front end does with its history: suggest, plot, save.

Framework-free (matplotlib is imported only by ``plot``, :func:`aikit.runtime.plots.plot_range_test`);
the arithmetic is ``aikit.core.lr_range``'s. The torch and Keras ``LRFinder`` classes inherit this.
"""

from __future__ import annotations

import math
import os

from aikit.core import lr_range
from aikit.core.errors import InvalidState
from aikit.core.validate import checked_float
from aikit.runtime.plots import plot_range_test


class RangeTestResults:
    """Mixin over ``self.history = {"lr": [...], "loss": [...]}``."""

    history: dict

    def _is_master(self) -> bool:
        """Whether this process draws and writes files (overridden under data parallelism)."""
        return True

    def _tested(self, what: str) -> None:
        """Refuse ``what`` before any range test filled the history."""
        if not self.history["lr"]:
            raise InvalidState(f"{what} reads the range test's history, which is empty: run range_test() first")

    def _enough_to_suggest(self, skip_start: int, skip_end: int, plotting: bool = False) -> None:
        """Refuse a suggestion from too few points with torch-lr-finder's words ("Need at least N
        iterations to suggest a learning rate. Got M"), and then why and what to do."""
        lrs, losses = self.history["lr"], self.history["loss"]
        if not all(isinstance(skip, int) and skip >= 0 for skip in (skip_start, skip_end)):
            return  # the suggestion's own checks name a bad skip
        need = skip_start + skip_end + 2
        if len(lrs) >= need:
            return
        message = f"Need at least {need} iterations to suggest a learning rate. Got {len(lrs)}"
        if len(lrs) == 1 and not math.isfinite(losses[0]):
            raise InvalidState(
                f"{message}: the loss was {losses[0]} at the first LR ({lrs[0]:.2E}), which ended the test. Check the "
                "model, the data and the loss for inf/NaN (inputs or labels, a log or a division by 0), then run "
                "range_test() again")
        plot = "plot(suggest_lr=False) draws them without a suggestion; " if plotting else ""
        raise InvalidState(
            f"{message}: {plot}to suggest one, skip fewer points (skip_start={skip_start}, skip_end={skip_end}) or "
            "run range_test() with more iterations (num_iter, a lower start_lr or a higher diverge_th if the loss "
            "diverged early)")

    def suggest_lr(self, method: str = "steepest", skip_start: int = 10, skip_end: int = 5, **options) -> float:
        """The LR that ``method`` (steepest, valley, minimum, slide or bottom) reads off the curve."""
        self._tested("suggest_lr()")
        self._enough_to_suggest(skip_start, skip_end)
        return lr_range.suggest(
            self.history["lr"], self.history["loss"], method, skip_start, skip_end, **options
        ).lr

    def to_csv(self, path: str | os.PathLike) -> None:
        """Save the history as ``lr,loss`` CSV (on the master process only)."""
        self._tested("to_csv()")
        if self._is_master():
            lr_range.write_history(path, self.history)

    def plot(self, skip_start: int = 10, skip_end: int = 5, log_lr: bool = True, show_lr: float | None = None, ax=None,
             suggest_lr: bool | str = True):
        """Plot loss against LR, as torch-lr-finder does; returns ``ax`` or ``(ax, suggested_lr)``.

        ``suggest_lr`` may name a method of ``aikit.core.lr_range.SUGGESTIONS`` (True means
        "steepest"). ``plt.show()`` runs only when this call created the figure. Under data
        parallelism only the master draws its own figure; other ranks get ``None`` for ``ax``.
        """
        self._tested("plot()")
        if show_lr is not None:
            checked_float(show_lr, "show_lr", "float")  # torch-lr-finder's words
        lrs = lr_range.trim(self.history["lr"], skip_start, skip_end)
        losses = lr_range.trim(self.history["loss"], skip_start, skip_end)
        suggestion = None
        if suggest_lr:
            self._enough_to_suggest(skip_start, skip_end, plotting=True)
            method = "steepest" if suggest_lr is True else suggest_lr
            suggestion = lr_range.suggest(
                self.history["lr"], self.history["loss"], method, skip_start, skip_end
            )
        if ax is not None or self._is_master():
            marked = None if suggestion is None else (self.history["lr"][suggestion.index],
                                                      self.history["loss"][suggestion.index],
                                                      f"{suggestion.method}: {suggestion.lr:.2E}")
            ax = plot_range_test(lrs, losses, log_lr, show_lr, ax, marked)
        if suggestion is None:
            return ax
        if self._is_master():
            print(f"LR suggestion: {suggestion.method}")
            print(f"Suggested LR: {suggestion.lr:.2E}")
        return ax, suggestion.lr
