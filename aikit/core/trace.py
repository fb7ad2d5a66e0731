"""Batch-size traces: the global batch size of every training step.

A trace comes from a CSV file with columns ``step,batchsize`` (the seeds' ``" 0, 1024"``
spacing is fine), from a list of sizes, or from a single int (a constant batch size). Steps
must run 0, 1, 2, ... in order and every size must be a positive integer; anything else is
refused with the row and the value.

What happens after the last step is the trace's ``when_exhausted`` policy:

``"error"`` (default for files and lists)
    Asking for a step past the end raises :class:`TraceExhaustedError` naming the step.
``"stop"``
    Training ends with the trace: the epoch it ends in is cut short there.
``"repeat_last"`` (default for an int)
    The last size repeats for ever.
``"cycle"``
    The trace starts over from step 0.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from aikit.core.plan import positive_int

EXHAUSTION_POLICIES = ("error", "stop", "repeat_last", "cycle")


def row_name(source: str, row: int) -> str:
    """How an error points at one trace entry: its row, and its line when it came from a file."""
    line = f", line {row + 2}" if source.endswith((".csv", ".txt")) else ""
    return f"trace {source}: row {row} (step {row}{line})"


class TraceExhaustedError(RuntimeError):
    """A step past the end of a trace whose policy is ``"error"`` or ``"stop"`` was asked for."""


class Trace:
    """A validated sequence of global batch sizes, one per step, and an end-of-trace policy."""

    def __init__(self, sizes: Sequence[int] | np.ndarray, when_exhausted: str = "error", source: str = "list"):
        if when_exhausted not in EXHAUSTION_POLICIES:
            raise ValueError(f"when_exhausted must be one of {EXHAUSTION_POLICIES}, got {when_exhausted!r}")
        try:
            values = np.asarray(sizes, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"trace {source}: batch sizes must be numbers, got {sizes!r:.200}") from None
        if values.ndim != 1 or len(values) == 0:
            raise ValueError(f"trace {source}: a trace needs at least one batch size, got {sizes!r:.200}")
        bad = np.flatnonzero(~(np.isfinite(values) & (values > 0) & (values == np.round(values))))
        if bad.size:
            row = int(bad[0])
            raise ValueError(
                f"{row_name(source, row)} has batch size {values[row]:g}; every batch "
                f"size must be a positive integer ({bad.size} such rows)"
            )
        self.sizes = values.astype(np.int64)
        self.sizes.flags.writeable = False
        self.when_exhausted = when_exhausted
        self.source = source

    def __len__(self) -> int:
        return len(self.sizes)

    def __repr__(self) -> str:
        return f"Trace({len(self)} steps from {self.source}, when_exhausted={self.when_exhausted!r})"

    @property
    def is_finite(self) -> bool:
        """True when the trace ends (policy 'error' or 'stop')."""
        return self.when_exhausted in ("error", "stop")

    def __getitem__(self, step: int) -> int:
        return int(self.window(step, step + 1)[0])

    def window(self, start: int, stop: int) -> np.ndarray:
        """Sizes of steps ``start..stop-1``, extended past the end by the policy."""
        if stop <= len(self):
            return self.sizes[start:stop]
        if self.is_finite:
            raise TraceExhaustedError(
                f"the trace ({self.source}) has {len(self)} steps (0..{len(self) - 1}) but step "
                f"{stop - 1} was asked for: extend the trace, or load it with when_exhausted="
                "'repeat_last' or 'cycle'"
            )
        steps = np.arange(start, stop)
        if self.when_exhausted == "cycle":
            return self.sizes[steps % len(self)]
        return self.sizes[np.minimum(steps, len(self) - 1)]

    def to_csv(self, path: str | os.PathLike) -> None:
        """Write the trace as ``step,batchsize`` CSV."""
        pd.DataFrame({"step": np.arange(len(self)), "batchsize": self.sizes}).to_csv(path, index=False)


def read_csv_trace(path: str | os.PathLike, when_exhausted: str = "error") -> Trace:
    """Load a ``step,batchsize`` CSV, naming the row and value of anything malformed."""
    frame = pd.read_csv(path, skipinitialspace=True, dtype=str)
    frame.columns = [str(c).strip().lower() for c in frame.columns]
    missing = {"step", "batchsize"} - set(frame.columns)
    if missing:
        raise ValueError(
            f"trace {path}: columns must be 'step,batchsize', found {list(frame.columns)} (missing {sorted(missing)})"
        )
    steps = pd.to_numeric(frame["step"], errors="coerce").to_numpy(np.float64)
    wrong = np.flatnonzero(steps != np.arange(len(frame)))
    if wrong.size:
        row = int(wrong[0])
        raise ValueError(
            f"{row_name(str(path), row)} has step {frame['step'].iloc[row]!r}, expected {row}: "
            "steps must be 0, 1, 2, ... in order"
        )
    if len(frame) == 0:
        raise ValueError(f"trace {path} has no rows")
    sizes = pd.to_numeric(frame["batchsize"], errors="coerce").to_numpy(np.float64)
    unreadable = np.flatnonzero(np.isnan(sizes))
    if unreadable.size:
        row = int(unreadable[0])
        raise ValueError(
            f"{row_name(str(path), row)} has batch size {frame['batchsize'].iloc[row]!r}; it must be a positive integer"
        )
    return Trace(sizes, when_exhausted, source=str(path))


def load_trace(
    source: Trace | str | os.PathLike | Sequence[int] | np.ndarray | int,
    when_exhausted: str | None = None,
) -> Trace:
    """A :class:`Trace` from a CSV path, a list of sizes, an int (constant) or a Trace."""
    if isinstance(source, Trace):
        return source if when_exhausted is None else Trace(source.sizes, when_exhausted, source.source)
    if isinstance(source, (str, os.PathLike)):
        return read_csv_trace(Path(source), when_exhausted or "error")
    if isinstance(source, (int, np.integer)) and not isinstance(source, bool):
        size = positive_int(source, "trace batch size")
        return Trace([size], when_exhausted or "repeat_last", source=f"constant {size}")
    if isinstance(source, (Sequence, np.ndarray)) and not isinstance(source, (bytes, str)):
        return Trace(source, when_exhausted or "error")
    raise TypeError(f"a trace is a CSV path, a list of batch sizes or an int, got {type(source).__name__}")


def multiple_problems(trace: Trace, multiple: int, what: str) -> list[str]:
    """One line per trace entry that is not a multiple of ``multiple``, with nearby valid sizes."""
    bad = np.flatnonzero(trace.sizes % multiple)
    problems = []
    for row in bad.tolist():
        size = int(trace.sizes[row])
        below, above = (size // multiple) * multiple, math.ceil(size / multiple) * multiple
        nearest = f"{below} or {above}" if below else f"{above}"
        problems.append(
            f"row {row} (step {row}): batch size {size} is not a multiple of {what} {multiple}; use {nearest}"
        )
    return problems


def _rounded(sizes: np.ndarray, multiple: int) -> Trace:
    return Trace(np.maximum(multiple, np.round(sizes / multiple) * multiple).astype(np.int64), source="generated")


def constant(batch_size: int, steps: int) -> Trace:
    """The same global batch for ``steps`` steps."""
    return Trace([positive_int(batch_size, "batch_size")] * positive_int(steps, "steps"), source="constant")


def linear_ramp(start: int, end: int, steps: int, ramp_steps: int | None = None, multiple_of: int = 1) -> Trace:
    """Batch size rising linearly from ``start`` to ``end`` over ``ramp_steps`` (default all)
    steps, then held, each size rounded to a multiple of ``multiple_of``."""
    start, end, steps = (positive_int(v, n) for v, n in ((start, "start"), (end, "end"), (steps, "steps")))
    ramp = positive_int(ramp_steps if ramp_steps is not None else steps, "ramp_steps")
    progress = np.minimum(np.arange(steps) / max(ramp - 1, 1), 1.0)
    return _rounded(start + (end - start) * progress, positive_int(multiple_of, "multiple_of"))


def step_increase(
    initial: int, factor: float, every: int, steps: int, maximum: int | None = None, multiple_of: int = 1
) -> Trace:
    """Multiply the batch by ``factor`` every ``every`` steps, up to ``maximum``: "don't decay
    the learning rate, increase the batch size" (Smith et al., 2018)."""
    initial, every, steps = (positive_int(v, n) for v, n in ((initial, "initial"), (every, "every"), (steps, "steps")))
    if not factor > 0:
        raise ValueError(f"factor must be positive, got {factor!r}")
    sizes = initial * float(factor) ** (np.arange(steps) // every)
    if maximum is not None:
        sizes = np.minimum(sizes, positive_int(maximum, "maximum"))
    return _rounded(sizes, positive_int(multiple_of, "multiple_of"))
