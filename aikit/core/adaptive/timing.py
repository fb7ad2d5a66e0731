"""Timing an adaptive run's updates for the throughput model, the same way in both adapters."""

from __future__ import annotations

import time
from collections.abc import Callable


class UpdateClock:
    """Times an adaptive run's updates for the throughput model, the same way in both adapters.

    An update's *cycle* runs from the end of the previous update to its own end: its micro-steps
    and the work between two updates (all-reduce, optimizer step, decision). With it goes the
    cycle less its micro-steps but one, what an update of a single micro-step would take
    (AdaptDL times accumulation and update steps apart for the same reason): so the per-update
    cost is known from the first batch on, and a larger batch's saving can be predicted.

    :meth:`micro_step` marks the boundary between two micro-steps, so the marks of one update
    span its micro-steps but one, none of them holding the update's own work: PyTorch marks after
    each micro-step (its update runs after the last mark, where the update ends), Keras before
    each (its update runs inside the last micro-step's ``train_on_batch``). Not timed: the first
    update after :meth:`restart` (there is no previous end to time from: a new epoch's
    DataLoader, a resume), and an update the adapter says may include other work.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.restart()

    def restart(self) -> None:
        """The next update is not timed (training stopped in between)."""
        self._end: float | None = None
        self._latest: float | None = None  # this update's latest mark
        self._accumulating = 0.0  # seconds between this update's marks

    def end_micro_step(self) -> None:
        """Mark the boundary of a micro-step of the update in progress."""
        stamp = self.clock()
        if self._latest is not None:
            self._accumulating += stamp - self._latest
        self._latest = stamp

    def measure(self, timed: bool = True, *, ends_at_last_mark: bool = False) -> list[float]:
        """End the update: ``[cycle, single, 1.0]``, or zeros where it is not timed, as numbers
        the replicas add up in the update's all-reduce (:func:`update_timing` reads the sums).
        ``ends_at_last_mark``: the update ended at its last mark (PyTorch's; otherwise now)."""
        end = self._latest if ends_at_last_mark and self._latest is not None else self.clock()
        timed = timed and self._end is not None
        cycle = end - self._end if timed else 0.0
        measured = [cycle, cycle - self._accumulating if timed else 0.0, float(timed)]
        self._end, self._latest, self._accumulating = end, None, 0.0
        return measured


def update_timing(sums: list[float], num_replicas: int = 1) -> tuple[float, float] | None:
    """``(cycle, single)`` from :meth:`UpdateClock.measure`'s numbers summed over ``num_replicas``
    (their mean), or None unless every replica timed the update."""
    cycle, single, timed = (value / num_replicas for value in sums)
    return (cycle, single) if timed == 1 and single > 0 else None
