"""The schedule an AutoLRS run kept, as a ``step,lr`` CSV: written by ``export_schedule``,
read back and replayed without any search by both adapters' ``ReplaySchedule``."""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Sequence

from aikit.core.errors import InvalidValue
from aikit.core.validate import writable_file


def write_schedule(path: str | os.PathLike, schedule: Sequence[tuple[int, float]]) -> None:
    """Save ``(step, lr)`` pairs as a CSV with a ``step,lr`` header (floats by ``repr``, so
    reading them back gives the same bits)."""
    with open(writable_file(path, "give a file name, e.g. lr_schedule.csv"), "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["step", "lr"])
        for step, lr in schedule:
            writer.writerow([int(step), repr(float(lr))])


def read_schedule(path: str | os.PathLike) -> list[float]:
    """The LR of steps 0, 1, 2, ... from a ``step,lr`` CSV; steps must run 0, 1, 2, ... with no gap
    and LRs must be finite and >= 0."""
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle))
    if not rows or [c.strip() for c in rows[0]] != ["step", "lr"]:
        raise InvalidValue(f"{path}: expected a 'step,lr' header, got {rows[0] if rows else 'an empty file'}")
    lrs = []
    for line, row in enumerate(rows[1:], start=2):
        try:
            step, lr = int(row[0]), float(row[1])
        except (ValueError, IndexError):
            raise InvalidValue(f"{path} line {line}: expected 'step,lr' numbers, got {row}") from None
        if step != len(lrs):
            raise InvalidValue(f"{path} line {line}: step {step}, expected {len(lrs)} (steps run 0, 1, 2, ...)")
        if not (math.isfinite(lr) and lr >= 0):
            raise InvalidValue(f"{path} line {line}: lr must be finite and >= 0, got {lr}")
        lrs.append(lr)
    if not lrs:
        raise InvalidValue(f"{path}: no steps after the header")
    return lrs


def schedule_lrs(schedule: str | os.PathLike | Sequence[float]) -> list[float]:
    """The LRs a ``ReplaySchedule`` replays: a ``step,lr`` CSV's (:func:`read_schedule`) or a
    list's, as floats; an empty list is refused."""
    lrs = read_schedule(schedule) if isinstance(schedule, (str, os.PathLike)) else [float(x) for x in schedule]
    if not lrs:
        raise InvalidValue("the schedule to replay is empty")
    return lrs


def replay_lr(lrs: Sequence[float], step: int) -> float:
    """The replayed LR of ``step``; past the schedule's end its last LR (said in the docs)."""
    return lrs[min(step, len(lrs) - 1)]
