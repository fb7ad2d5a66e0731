"""The numbers of one range test: the LR of every iteration, and when the loss says stop.

The formulas are torch-lr-finder 0.2.2's, so its users get the same LRs and losses to the
bit: iteration ``i`` of ``n`` uses ``start * (end / start) ** (i / (n - 1))`` ("exp") or
``start + i / (n - 1) * (end - start)`` ("linear"), the first iteration uses ``start_lr`` and
the last exactly ``end_lr``.
"""

from __future__ import annotations

import math

from aikit.core.errors import InvalidValue
from aikit.core.validate import checked_float, checked_int

STEP_MODES = ("exp", "linear")


def _number(value: object, name: str) -> float:
    number = checked_float(value, name, "a number", lambda _: True)
    if not math.isfinite(number):
        raise InvalidValue(f"{name} must be finite, got {value!r}")
    return number


def step_mode_name(step_mode: str) -> str:
    """``"exp"`` or ``"linear"`` (any case), or an :class:`InvalidValue` naming both."""
    name = step_mode.lower() if isinstance(step_mode, str) else step_mode
    if name not in STEP_MODES:
        raise InvalidValue(f"step_mode must be one of {STEP_MODES} (any case), got {step_mode!r}")
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
        raise InvalidValue(
            f"step_mode='exp' needs start_lr > 0 and end_lr > 0, got start_lr={start!r}, "
            f"end_lr={end!r}; pass a positive start_lr or use step_mode='linear'"
        )
    if mode == "linear" and (start < 0 or end < 0):
        raise InvalidValue(f"learning rates must be >= 0, got start_lr={start!r}, end_lr={end!r}")
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
            raise InvalidValue(f"smooth_f must lie in [0, 1), got {smooth_f!r}; 0 turns smoothing off")
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
