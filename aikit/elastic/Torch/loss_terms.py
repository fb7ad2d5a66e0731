"""The loss terms a trace optimizer's micro-batches declare (``accumulate(model, weight=n)``).

This replica's count of terms and of the micro-batches that declared them ride in the update's one
all-reduce; the update is then the mean over the step's terms on every replica, not over its samples.
A step whose micro-batches declared them only in part is refused, on every replica alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from aikit.core.errors import InvalidValue
from aikit.runtime.Torch.accumulator import Accumulator


class LossTerms:
    """A trace optimizer's loss terms: those of the step in progress on this replica (its
    ``engine``'s count, :attr:`declared` micro-batches) and :attr:`total`, the last update's over
    every replica (None: not declared, the update is the mean over its samples)."""

    def __init__(self, engine: Accumulator) -> None:
        self.engine = engine
        self.declared = 0
        self.total: Any = None

    @contextlib.contextmanager
    def counted(self, model: torch.nn.Module, weight: int | torch.Tensor, user: str | None) -> Iterator[None]:
        """A micro-batch's forward and backward weighed by its ``weight`` terms; ``user``: the
        optimizer that weighs its micro-batches its own way (refused), else None."""
        if user is not None:
            raise InvalidValue(
                f"{user} weighs micro-batches its own way (a sum, or gradient noise measured from "
                "equal micro-batch means), so it takes no weight=: use a TraceOptimizer whose rule is not measured "
                "(linear, sqrt, seesaw, constant) for loss terms"
            )
        with self.engine.count_terms(model, weight):
            yield
        self.declared += 1

    def restart(self, saved: list[int] | None = None) -> None:
        """The step starts again from what :meth:`saved` gave (None: from none)."""
        self.engine.terms, self.declared = saved or (0, 0)

    def saved(self) -> list[int] | None:
        """The step's terms so far and the micro-batches that declared them (None: none did)."""
        return [int(self.engine.terms), self.declared] if self.declared else None

    def counts(self) -> list[Any]:
        """This replica's terms and declaring micro-batches for the update's all-reduce, the step's count reset."""
        counts, self.declared = [self.engine.take_terms(), float(self.declared)], 0
        return counts

    def take(self, terms: Any, declared: float, expected: int, step: int) -> None:
        """The update's :attr:`total` from the summed :meth:`counts` of a step of ``expected``
        micro-batches; one that declared them for some only is refused, its gradients dropped."""
        if declared not in (0, expected):
            self.engine.discard()
            self.engine.optimizer.zero_grad()
            raise InvalidValue(
                f"{declared:g} of the {expected} micro-batches of step {step} declared their loss terms "
                "with accumulate(model, weight=...): declare them for every micro-batch of a step or for none"
            )
        self.total = terms if declared else None
