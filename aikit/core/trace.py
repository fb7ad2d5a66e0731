"""Batch-size traces: the global batch size of every training step.

A trace comes from a CSV file with columns ``step,batchsize`` (the seeds' ``" 0, 1024"``
spacing is fine), from a list of sizes, from a single int (a constant batch size), or from a
batch-size schedule in samples or tokens (:mod:`aikit.core.ramp`: Megatron's
``--step-batch-size-schedule``, NeMo's ``rampup_batch_size``, linear and staged ramps, Seesaw;
:func:`schedule_trace`). Every size must be a positive integer written in ASCII digits; anything
else is refused with the row and the value.

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

import codecs
import csv
import decimal
import io
import math
import os
import re
import stat
import warnings
from collections.abc import Sequence
from numbers import Integral, Real
from pathlib import Path

import numpy as np
import pandas as pd

from aikit.core.batch_schedule import MAX_TRACE_STEPS, trace_steps
from aikit.core.errors import AikitError, InvalidType, InvalidValue, TraceFileError
from aikit.core.ramp import (
    BatchSchedule,
    linear_schedule,
    rampup,
    seesaw_schedule,
    staged_schedule,
    threshold_schedule,
)
from aikit.core.validate import positive_int, writable_file

__all__ = ["EXHAUSTION_POLICIES", "MAX_TRACE_STEPS", "BatchSchedule", "Trace", "TraceExhaustedError",
           "TraceStepWarning", "TraceTooShortError", "constant", "linear_ramp", "linear_schedule", "load_trace",
           "multiple_problems", "rampup", "read_csv_trace", "schedule_trace", "seesaw_schedule", "staged_schedule",
           "step_increase", "threshold_schedule"]

EXHAUSTION_POLICIES = ("error", "stop", "repeat_last", "cycle")
MAX_BATCH_SIZE = np.iinfo(np.int64).max  # sizes are int64 from here on
_EXACT_FLOAT = 2**53  # every integer up to here is exactly a float64
# a number as a CSV cell may write it: ASCII digits only (Decimal and int() also read "6_4" and
# Arabic-Indic digits as 64), with an optional fraction and exponent ("64.0", "6.4e1")
_CONTROL_BYTE = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # in no text file (UTF-8 uses none in a character)
_ASCII_TEXT = bytes(range(0x20, 0x7f)) + b"\t\n\r"
_ASCII_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


def row_name(source: str, row: int, line: int | None = None) -> str:
    """How an error points at one trace entry: its row, and its line when it came from a file."""
    return f"trace {source}: row {row} (step {row}{'' if line is None else f', line {line}'})"


class TraceExhaustedError(AikitError, RuntimeError):
    """A step past the end of a trace whose policy is ``"error"`` or ``"stop"`` was asked for."""


class TraceTooShortError(TraceExhaustedError, InvalidValue):
    """A trace that cannot make even the first epoch of its data set: bad input to the sampler
    or schedule given it (a ``ValueError``) as much as a run past the trace's end."""


def exact_size(value: object, where: str) -> int:
    """``value`` as an exact positive int64 batch size, or an aikit error naming ``where``:
    no float round trip (``9007199254740993`` stays itself, ``1e30`` is refused)."""
    rule = f"every batch size must be a positive integer of at most {MAX_BATCH_SIZE}"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (Real, decimal.Decimal)):
        raise InvalidType(f"{where} has batch size {value!r:.60}, a {type(value).__name__}; {rule}")
    number = exact_int(value)
    if number is None or not 0 < number <= MAX_BATCH_SIZE:
        shown = f"{value:g}" if number is None and isinstance(value, float) else number if number is not None else value
        raise InvalidValue(f"{where} has batch size {shown}; {rule}")
    return number


def exact_int(value: Real | decimal.Decimal) -> int | None:
    """The integer ``value`` is exactly; None for fractions, NaN, infinities and floats above
    2**53 (where a float no longer tells neighbouring integers apart)."""
    if isinstance(value, Integral):
        return int(value)
    if isinstance(value, decimal.Decimal):
        exact = value.is_finite() and abs(value) <= 10**100 and value == value.to_integral_value()
        return int(value) if exact else None
    value = float(value)
    return int(value) if math.isfinite(value) and value.is_integer() and abs(value) <= _EXACT_FLOAT else None


class TraceStepWarning(UserWarning):
    """A CSV trace whose step column restarts or skips: its sizes are read in file order anyway
    (as eth-easl's variable batch size reads them; real traces are often runs concatenated)."""


class Trace:
    """A validated sequence of global batch sizes, one per step, and an end-of-trace policy."""

    def __init__(self, sizes: Sequence[int] | np.ndarray, when_exhausted: str = "error", source: str = "list"):
        if when_exhausted not in EXHAUSTION_POLICIES:
            raise InvalidValue(f"when_exhausted must be one of {EXHAUSTION_POLICIES}, got {when_exhausted!r}")
        if isinstance(sizes, (str, bytes)) or not isinstance(sizes, (Sequence, np.ndarray)):
            raise InvalidType(f"trace {source}: batch sizes must be a list of integers, got {sizes!r:.200}")
        array = np.asarray(sizes) if isinstance(sizes, np.ndarray) else None
        if array is not None and array.ndim != 1:
            raise InvalidValue(f"trace {source}: batch sizes must be one-dimensional, got shape {array.shape}")
        if len(sizes) == 0:
            raise InvalidValue(f"trace {source}: a trace needs at least one batch size, got {sizes!r:.200}")
        if array is not None and array.dtype.kind in "iu" and len(array):
            bad = np.flatnonzero((array <= 0) | (array > MAX_BATCH_SIZE))
            if bad.size:
                exact_size(array[bad[0]], row_name(source, int(bad[0])))
            values = array.astype(np.int64)
        else:
            values = np.array([exact_size(v, row_name(source, row)) for row, v in enumerate(sizes)], dtype=np.int64)
        self.sizes = values
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

    def samples_before(self, step: int) -> int:
        """Samples the steps before ``step`` train (an LR decay over samples reads it)."""
        step = int(step)
        if step < 0:
            raise InvalidValue(f"step must be >= 0, got {step}")
        if not hasattr(self, "_cumulative"):
            self._cumulative = np.concatenate(([0], np.cumsum(self.sizes.astype(object))))
        if step <= len(self):
            return int(self._cumulative[step])
        if self.is_finite:
            self.window(step - 1, step)  # raises TraceExhaustedError naming the step
        total, extra = int(self._cumulative[-1]), step - len(self)
        if self.when_exhausted == "repeat_last":
            return total + extra * int(self.sizes[-1])
        cycles, rest = divmod(step, len(self))
        return cycles * total + int(self._cumulative[rest])

    def to_csv(self, path: str | os.PathLike) -> None:
        """Write the trace as ``step,batchsize`` CSV."""
        path = writable_file(path, "give a file name, e.g. trace.csv")
        pd.DataFrame({"step": np.arange(len(self)), "batchsize": self.sizes}).to_csv(path, index=False)


def _text(path: Path) -> str:
    """The file's text, or an error naming the file (and the line of a byte that is not UTF-8).
    What is not a regular file is refused before it is opened: reading a FIFO (or a terminal)
    would wait for a writer for ever."""
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(path)
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
            raise TraceFileError(f"trace {path} is {kind}, not a regular file: reading it could wait for ever; "
                                 "write the trace to a 'step,batchsize' CSV file and give its path")
        raw = path.read_bytes()
    except FileNotFoundError:
        raise TraceFileError(_missing(path)) from None
    except IsADirectoryError:
        raise TraceFileError(f"trace {path} is a directory: give the path of a 'step,batchsize' CSV file") from None
    except TraceFileError:
        raise
    except OSError as error:
        raise TraceFileError(f"trace {path} cannot be read: {error.strerror or error}") from None
    except ValueError:  # the operating system takes no NUL in a path
        raise TraceFileError(f"trace path {str(path)!r:.100} holds a NUL character: give the path of a "
                             "'step,batchsize' CSV file") from None
    if _utf16(raw):
        raise TraceFileError(f"trace {path} is UTF-16 text: save it as UTF-8 (plain 'step,batchsize' CSV)")
    control = _CONTROL_BYTE.search(raw)
    if control:
        line, byte = raw[: control.start()].count(b"\n") + 1, raw[control.start()]
        what = "a NUL byte" if byte == 0 else f"control byte {byte:#04x}"
        raise TraceFileError(f"trace {path}, line {line}: {what}, which no text holds: a trace is plain "
                             "'step,batchsize' CSV text, not binary data (is this the right file?)")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise TraceFileError(f"trace {path}, line {line}: byte {raw[error.start]:#04x} is not UTF-8 text: save it as "
                             "UTF-8 (plain 'step,batchsize' CSV)") from None
    if not text.strip():
        raise TraceFileError(f"trace {path} is empty: write a 'step,batchsize' header, then one row per step")
    return text


def _missing(path: Path) -> str:
    """The words for a trace that is not there: where a relative ``path`` was looked for, and why
    that may not be where the user wrote it."""
    if path.is_absolute():
        return f"trace {path} does not exist: give the path of a 'step,batchsize' CSV file"
    return (f"trace {path} does not exist in the working directory {os.getcwd()}: a relative path is read from the "
            "process's working directory, and Ray Train runs each worker in a directory of its own, not the "
            f"driver's; give an absolute path, resolved where the file is (str(Path({str(path)!r}).resolve()) on the "
            "driver)")


def _utf16(raw: bytes) -> bool:
    """UTF-16 text: its byte order mark, or ASCII text (a CSV's) with every other byte zero. Not
    just a zero among the first bytes: most binary data has one there."""
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return True
    if len(raw) < 2 or len(raw) % 2:
        return False
    return any(zeros.count(0) == len(zeros) and not chars.translate(None, _ASCII_TEXT)
               for chars, zeros in ((raw[0::2], raw[1::2]), (raw[1::2], raw[0::2])))


def _integer_cell(text: str) -> int | None:
    """A cell's exact integer value (``'64'``, ``' 64.0'``, ``'6.4e1'``), or None if it is none
    (``'6_4'`` and digits other than ASCII's included)."""
    if not _ASCII_NUMBER.fullmatch(text.strip()):
        return None
    try:
        return exact_int(decimal.Decimal(text.strip()))
    except (decimal.InvalidOperation, ValueError):
        return None


def read_csv_trace(path: str | os.PathLike, when_exhausted: str = "error", *, strict_steps: bool = False) -> Trace:
    """Load a ``step,batchsize`` CSV, naming the file, row, line and value of anything malformed.
    Blank lines are skipped (and counted in line numbers); sizes are read as exact integers.

    The batch sizes are taken in file order, as eth-easl's variable batch size takes them: where
    the step column restarts or skips (runs concatenated into one trace), a
    :class:`TraceStepWarning` names those rows. ``strict_steps=True`` refuses such a file."""
    path = Path(path)
    reader = csv.reader(io.StringIO(_text(path)), skipinitialspace=True, strict=True)
    header, columns, sizes, slow = None, (0, 0), [], {}  # slow: row -> (step, line) off the fast path
    try:
        for cells in reader:
            if header is not None and len(cells) == len(header):  # the common case, kept fast
                step, size = cells[columns[0]].strip(), cells[columns[1]].strip()
                if step.isascii() and step.isdigit() and size.isascii() and size.isdigit() \
                        and int(step) == len(sizes) and 0 < int(size) <= MAX_BATCH_SIZE:
                    sizes.append(int(size))
                    continue
            if not any(cell.strip() for cell in cells):
                continue  # a blank line
            if header is None:
                header = [cell.strip().lower() for cell in cells]
                missing = {"step", "batchsize"} - set(header)
                if missing:
                    raise TraceFileError(f"trace {path}, line {reader.line_num}: columns must be 'step,batchsize', "
                                         f"found {header!r:.200} (missing {sorted(missing)})")
                columns = header.index("step"), header.index("batchsize")
                continue
            row = len(sizes)
            where = row_name(str(path), row, reader.line_num)
            size, step = _checked_row(cells, header, columns, row, where, strict_steps)
            sizes.append(size)
            slow[row] = step, reader.line_num
    except csv.Error as error:
        raise TraceFileError(f"trace {path}, line {reader.line_num}: not CSV ({error})") from None
    if not sizes:
        raise TraceFileError(f"trace {path} has no rows: write one 'step,batchsize' line per step after the header")
    jumps = _step_jumps(slow, len(sizes))
    if jumps:
        shown = "; ".join(jumps[:5]) + (f"; and {len(jumps) - 5} more" if len(jumps) > 5 else "")
        warnings.warn(
            f"trace {path}: the step column restarts or skips at {len(jumps)} row(s) ({shown}); the batch sizes are "
            "read in file order, as eth-easl's variable batch size reads them (pass strict_steps=True to refuse)",
            TraceStepWarning, stacklevel=3)
    return Trace(np.array(sizes, dtype=np.int64), when_exhausted, source=str(path))


def _checked_row(cells: list[str], header: list[str], columns: tuple[int, int], row: int, where: str,
                 strict_steps: bool) -> tuple[int, int]:
    """The batch size and step of a row the fast path did not take, or the error that names
    what is wrong. With ``strict_steps`` the step must be the row's index."""
    step_at, size_at = columns
    if len(cells) != len(header):
        raise TraceFileError(f"{where} has {len(cells)} fields, the header has {len(header)} "
                             f"({','.join(header)!r:.100}): write one 'step,batchsize' pair per line")
    step = _integer_cell(cells[step_at])
    if step is None or step < 0:
        raise TraceFileError(f"{where} has step {cells[step_at]!r:.60}; it must be a non-negative integer")
    if strict_steps and step != row:
        raise TraceFileError(f"{where} has step {cells[step_at]!r:.60}, expected {row}: "
                             "steps must be 0, 1, 2, ... in order (strict_steps)")
    size = _integer_cell(cells[size_at])
    if size is None:
        raise TraceFileError(f"{where} has batch size {cells[size_at]!r:.60}; it must be a positive integer")
    try:
        return exact_size(size, where), step
    except InvalidValue as error:
        raise TraceFileError(str(error)) from None


def _step_jumps(slow: dict[int, tuple[int, int]], rows: int) -> list[str]:
    """Where the step column does not go on by one from the row before (a run appended after
    another restarts it). Rows read on the fast path have step == row; only rows off it, and
    the row after each, can be a jump."""
    def step_of(row: int) -> int:
        return slow[row][0] if row in slow else row

    jumps = []
    for row in sorted(set(slow) | {r + 1 for r in slow if r + 1 < rows}):
        if step_of(row) != (step_of(row - 1) + 1 if row else 0):
            line = f", line {slow[row][1]}" if row in slow else ""
            jumps.append(f"row {row}{line}: step {step_of(row)}")
    return jumps


def load_trace(source: Trace | str | os.PathLike | Sequence[int] | np.ndarray | int, when_exhausted: str | None = None,
               *, strict_steps: bool = False) -> Trace:
    """A :class:`Trace` from a CSV path, a list of sizes, an int (constant), a Trace, or a
    :class:`~aikit.core.ramp.BatchSchedule` (its steps up to its last entry, whose batch then
    repeats: :func:`schedule_trace`). ``strict_steps`` applies to CSV files (see :func:`read_csv_trace`)."""
    if isinstance(source, Trace):
        return source if when_exhausted is None else Trace(source.sizes, when_exhausted, source.source)
    if isinstance(source, BatchSchedule):
        return schedule_trace(source, when_exhausted=when_exhausted or "repeat_last")
    if isinstance(source, (str, os.PathLike)):
        return read_csv_trace(Path(source), when_exhausted or "error", strict_steps=strict_steps)
    if isinstance(source, (int, np.integer)) and not isinstance(source, bool):
        size = positive_int(source, "trace batch size")
        return Trace([size], when_exhausted or "repeat_last", source=f"constant {size}")
    if isinstance(source, (Sequence, np.ndarray)) and not isinstance(source, (bytes, str)):
        return Trace(source, when_exhausted or "error")
    raise InvalidType(f"a trace is a CSV path, a list of batch sizes, an int or a batch schedule, got "
                      f"{type(source).__name__}")


def schedule_trace(schedule: BatchSchedule, *, steps: int | None = None, samples: int | None = None,
                   tokens: int | None = None, when_exhausted: str | None = None) -> Trace:
    """The batch of every step of ``schedule`` (:meth:`~aikit.core.ramp.BatchSchedule.sizes`):
    ``steps`` steps, or enough for ``samples`` samples or ``tokens`` tokens (the policy then
    defaults to ``"stop"``: training ends with the budget); with no length, its steps up to its
    last entry, whose batch then repeats (``"repeat_last"``)."""
    if not isinstance(schedule, BatchSchedule):
        raise InvalidType(f"schedule must be an aikit.core.ramp.BatchSchedule, got {type(schedule).__name__}")
    sizes = schedule.sizes(steps=steps, samples=samples, tokens=tokens)
    bounded = steps is not None or samples is not None or tokens is not None
    return Trace(sizes, when_exhausted or ("stop" if bounded else "repeat_last"), source=schedule.source)


def multiple_problems(trace: Trace, multiple: int, what: str) -> list[str]:
    """One line per trace entry that is not a multiple of ``multiple``, with nearby valid sizes."""
    bad = np.flatnonzero(trace.sizes % multiple) if multiple <= MAX_BATCH_SIZE else np.arange(len(trace))
    problems = []
    for row in bad.tolist():
        size = int(trace.sizes[row])
        below, above = (size // multiple) * multiple, -(-size // multiple) * multiple
        nearest = f"{below} or {above}" if below else f"{above}"
        problems.append(
            f"row {row} (step {row}): batch size {size} is not a multiple of {what} {multiple}; use {nearest}"
        )
    return problems


def _rounded(sizes: np.ndarray, multiple: int, low: float, high: float) -> Trace:
    """``sizes`` rounded to multiples of ``multiple``, kept within the multiples in ``low..high``
    where there are any (rounding 112 to multiples of 32 gives 128, past an end of 112)."""
    first = max(multiple, -(-int(low) // multiple) * multiple)
    last = int(high) // multiple * multiple if math.isfinite(high) else MAX_BATCH_SIZE
    rounded = np.round(sizes / multiple) * multiple
    return Trace(np.clip(rounded, first, max(first, last)).astype(np.int64), source="generated")


def constant(batch_size: int, steps: int) -> Trace:
    """The same global batch for ``steps`` steps."""
    return Trace([positive_int(batch_size, "batch_size")] * trace_steps(steps), source="constant")


def linear_ramp(start: int, end: int, steps: int, ramp_steps: int | None = None, multiple_of: int = 1) -> Trace:
    """Batch size rising linearly from ``start`` to ``end`` over ``ramp_steps`` (default all)
    steps, then held, each size rounded to a multiple of ``multiple_of``."""
    start, end, steps = positive_int(start, "start"), positive_int(end, "end"), trace_steps(steps)
    ramp = positive_int(ramp_steps if ramp_steps is not None else steps, "ramp_steps")
    progress = np.minimum(np.arange(steps) / max(ramp - 1, 1), 1.0)
    return _rounded(start + (end - start) * progress, positive_int(multiple_of, "multiple_of"), min(start, end),
                    max(start, end))


def step_increase(
    initial: int, factor: float, every: int, steps: int, maximum: int | None = None, multiple_of: int = 1
) -> Trace:
    """Multiply the batch by ``factor`` every ``every`` steps, up to ``maximum``: "don't decay
    the learning rate, increase the batch size" (Smith et al., 2018)."""
    initial, every, steps = positive_int(initial, "initial"), positive_int(every, "every"), trace_steps(steps)
    if not factor > 0:
        raise InvalidValue(f"factor must be positive, got {factor!r}")
    if not math.isfinite(factor):  # inf: the first multiple gives an int64 overflow, or the maximum for ever
        raise InvalidValue(f"factor must be finite, got {factor!r}: the batch is multiplied by it every `every` "
                           "steps (up to `maximum`), e.g. 2")
    sizes = initial * float(factor) ** (np.arange(steps) // every)
    if maximum is not None:
        sizes = np.minimum(sizes, positive_int(maximum, "maximum"))
    return _rounded(sizes, positive_int(multiple_of, "multiple_of"), 1, np.inf if maximum is None else maximum)
