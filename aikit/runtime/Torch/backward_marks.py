"""Whether each micro-step's backward reached the optimizer's parameters: a forgotten ``backward()``.

A ``step()`` with no backward since the one before adds nothing to the update, which is still
the mean over every micro-step (so it shrinks), and an update none of whose micro-steps had one
changes nothing: both run without an error. :class:`BackwardMarks` tells them by what autograd
leaves on the parameters: a backward sets a ``.grad`` or adds to it in place, which moves its
version counter (a backward with ``create_graph=True`` sets a new one). It compares every
gradient's identity (a weak reference: no gradient is kept alive) and version from one micro-step
to the next: attributes on the host, never a read from the device. A sharded parameter's (FSDP2's
DTensor) ``.grad`` changes only at the reduce-scatter, not in the micro-steps before: there it
checks nothing.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import torch

from aikit.core.errors import NoGradientWarning
from aikit.core.skips import user_stacklevel
from aikit.runtime.Torch.gradient_sync import is_shard


class BackwardMarks:
    """The gradients' marks at the last micro-step, and the micro-steps since that had no backward."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self._warned = False
        self.restart()

    def _marks(self) -> list[Any]:
        return [None if (grad := p.grad) is None else (weakref.ref(grad), grad._version)
                for group in self.optimizer.param_groups for p in group["params"]]

    def restart(self) -> None:
        """A new update's window, from the gradients as they are now."""
        self.sharded = any(is_shard(p) for group in self.optimizer.param_groups for p in group["params"])
        self._last = [] if self.sharded else self._marks()
        self.micro_step = self.missing = 0  # micro-steps taken towards the update; those without a backward

    def end_micro_step(self, expect_backward: bool = True) -> None:
        """Count a micro-step, and whether a backward reached a parameter since the last one
        (``expect_backward`` False: it declared an empty micro-batch, which needs none)."""
        self.micro_step += 1
        if self.sharded:
            return
        marks = self._marks()
        if expect_backward and not _moved(self._last, marks):
            self.missing += 1
        self._last = marks

    def check(self, gradients: bool) -> None:
        """Warn, once per optimizer, of an update without any gradient (``gradients`` False) or
        one some of whose micro-steps had no backward."""
        if self._warned or (gradients and not self.missing):
            return
        self._warned = True
        if not gradients:
            what = (f"an update had no gradient at all: no backward reached the optimizer's parameters in its "
                    f"{self.micro_step} micro-step(s), so it changed nothing (optimizer.updated is still True)")
        else:
            what = (f"{self.missing} of the {self.micro_step} micro-steps of an update had no backward since the "
                    f"step() before, so {'it' if self.missing == 1 else 'they'} added nothing: the update is still "
                    f"the mean over all {self.micro_step} micro-steps (a smaller one)")
        warnings.warn(NoGradientWarning(
            f"aikit: {what}. Call loss.backward() before every optimizer.step() (with a loss that reaches the "
            "parameters). Warned once per optimizer."), stacklevel=user_stacklevel())


def _moved(last: list[Any], marks: list[Any]) -> bool:
    """Whether any gradient was set, replaced or added to between ``last`` and ``marks``."""
    if len(last) != len(marks):  # a param group added
        return True
    for old, new in zip(last, marks, strict=True):
        if old is None or new is None:
            if old is not new:
                return True
        elif old[0]() is not new[0]() or old[1] != new[1]:
            return True
    return False
