"""A batch-size schedule: the global batch as a function of the samples trained so far.

:class:`BatchSchedule` holds ``threshold:batch`` entries, thresholds in samples or tokens (a
token threshold ``T`` is ``T // seq_length`` samples, as Megatron converts it), and answers the
batch of every step; :func:`parse_amount` reads the amounts users write (``250B``, ``1.5M``),
ASCII digits only. The schedules users write (Megatron's, NeMo's, nanochat's, Seesaw) are made
by :mod:`aikit.core.ramp`; :func:`world_fit_problem` says which world sizes every batch of a
schedule or trace fits (whole micro-batches on every replica: Megatron's condition).
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

import numpy as np

from aikit.core.errors import InvalidType, InvalidValue
from aikit.core.plan import divisors_of
from aikit.core.validate import checked_choice, positive_int

UNITS = ("samples", "tokens")
SUFFIXES = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}  # Megatron's, decimal
MAX_AMOUNT = 10**30  # beyond any budget: larger numbers are typos
# A trace holds one row per step. The longest runs trained take a few million updates (10**6 to
# 10**7); 10**8 steps is ten times more, 800 MB of int64 sizes and about 1.7 GB of CSV: a larger
# count is a typo, refused before anything is allocated. A longer run repeats its trace
# (when_exhausted="repeat_last" or "cycle").
MAX_TRACE_STEPS = 10**8
_UNIT_WORDS = {"tok": "tokens", "token": "tokens", "tokens": "tokens",
               "smp": "samples", "sample": "samples", "samples": "samples"}
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?", re.ASCII)
_WORLD_SIZES_SHOWN = 12


def parse_amount(text: object, what: str, where: str) -> tuple[int, str | None]:
    """``text`` (``"250B"``, ``"1.5M"``, ``"61035156"``, ``"250Btokens"``) as an exact integer
    and the unit it names (None where it names none), or an :class:`InvalidValue` naming
    ``where``. ASCII digits only; a suffix multiplies by 10^3, 10^6, 10^9 or 10^12; a decimal
    point is taken where the result is whole. ``what`` is the amount's role, for the message."""
    if isinstance(text, bool) or not isinstance(text, (str, int, np.integer)):
        raise InvalidType(f"{where}: {what} {text!r:.60} must be a whole number such as 768 or '250B'")
    if not isinstance(text, str):
        number, unit = int(text), None
    else:
        number, unit = _amount(text, what, where)
    if not 0 <= number <= MAX_AMOUNT:
        raise InvalidValue(f"{where}: {what} {text!r:.60} must be between 0 and 10^30")
    return number, unit


def _amount(text: str, what: str, where: str) -> tuple[int, str | None]:
    """The number and unit of ``text``: ASCII digits, then a suffix and a unit word, each optional."""
    stripped = text.strip()
    match = _NUMBER.match(stripped)
    rest = stripped[match.end():].strip().lower() if match else ""
    suffix = ""
    if rest and rest[0] in "kmbt" and (len(rest) == 1 or rest[1:].strip() in _UNIT_WORDS):
        suffix, rest = rest[0].upper(), rest[1:].strip()
    if match is None or (rest and rest not in _UNIT_WORDS):
        raise InvalidValue(
            f"{where}: {what} {text!r:.60} is not a number: write ASCII digits with an optional K, M, B or T "
            "(thousand, million, billion, trillion) and an optional unit, tokens or samples (e.g. 250B or "
            "61035156samples)")
    exact = Decimal(match.group()) * SUFFIXES.get(suffix, 1)
    if exact != exact.to_integral_value():
        raise InvalidValue(f"{where}: {what} {text!r:.60} is {exact.normalize():f}, not a whole number: write a whole "
                           "number of samples or tokens")
    return int(exact), _UNIT_WORDS.get(rest) if rest else None


@dataclass(frozen=True)
class Entry:
    """One ``threshold:batch`` entry as the user wrote it."""

    threshold: int  # in the schedule's unit
    batch: int
    text: str  # for messages: how the user wrote it


class BatchSchedule:
    """The global batch as a function of the samples trained so far.

    ``entries`` are ``(threshold, batch)``: from ``threshold`` (in ``unit``: samples, or tokens
    with ``seq_length`` tokens per sample) on, each step takes ``batch`` samples. Thresholds start
    at 0 and increase. ``micro_batch`` and ``world``: every batch must be whole micro-batches on
    every replica (a multiple of ``micro_batch x world``). ``source`` names the schedule in
    messages."""

    def __init__(self, entries: Sequence[Entry], *, unit: str = "samples", seq_length: int | None = None,
                 micro_batch: int = 1, world: int = 1, source: str = "schedule") -> None:
        self.unit = checked_choice(unit, "unit", UNITS)
        self.seq_length = None if seq_length is None else positive_int(seq_length, "seq_length")
        if self.unit == "tokens" and self.seq_length is None:
            raise InvalidValue(f"{source} counts tokens: give seq_length, the tokens per sample (a sequence length), "
                               "to turn its thresholds into samples")
        self.micro_batch, self.world = positive_int(micro_batch, "micro_batch"), positive_int(world, "world")
        self.source = source
        self.entries = tuple(entries)
        if not self.entries:
            raise InvalidValue(f"{source} has no entries: write at least one 'threshold:batch' pair, e.g. '0:768'")
        self._check_entries()
        per = self.seq_length if self.unit == "tokens" else 1
        self._thresholds = [e.threshold // per for e in self.entries]  # in samples, exact
        self.thresholds = np.array(self._thresholds, dtype=object)
        self.batches = np.array([e.batch for e in self.entries], dtype=np.int64)
        self._check_collisions()
        problems = self.problems(self.micro_batch, self.world)
        if problems:
            raise InvalidValue(f"{source} cannot run:\n  " + "\n  ".join(problems))

    # --- checks -----------------------------------------------------------------------------------
    def _check_entries(self) -> None:
        first = self.entries[0]
        if first.threshold != 0:
            raise InvalidValue(
                f"{self.source}: entry 1 ({first.text!r}) starts at {first.threshold} {self.unit}: the first threshold "
                f"must be 0, the batch from the start of training (e.g. '0:{first.batch}')")
        for number, (before, entry) in enumerate(zip(self.entries, self.entries[1:], strict=False), start=2):
            if entry.threshold <= before.threshold:
                raise InvalidValue(
                    f"{self.source}: entry {number} ({entry.text!r}) is at {entry.threshold:,} {self.unit}, not after "
                    f"entry {number - 1} ({before.text!r}) at {before.threshold:,}: thresholds must increase; put the "
                    "entries in the order training reaches them")
        for number, entry in enumerate(self.entries, start=1):
            if entry.batch < 1 or entry.batch > np.iinfo(np.int64).max:
                raise InvalidValue(f"{self.source}: entry {number} ({entry.text!r}) has batch {entry.batch}: a batch "
                                   "is a positive number of samples")

    def _check_collisions(self) -> None:
        """Two token thresholds within one sample of each other name the same step."""
        for number in range(1, len(self.entries)):
            if self.thresholds[number] == self.thresholds[number - 1]:
                before, entry = self.entries[number - 1], self.entries[number]
                raise InvalidValue(
                    f"{self.source}: entries {number} ({before.text!r}) and {number + 1} ({entry.text!r}) fall on the "
                    f"same sample ({self.thresholds[number]:,}) at seq_length {self.seq_length}: thresholds must be a "
                    f"sample ({self.seq_length} tokens) apart or more")

    def problems(self, micro_batch: int, world: int = 1, *, from_entry: int = 0) -> list[str]:
        """One line per entry (from ``from_entry`` on) whose batch is not a multiple of
        ``micro_batch x world``, with the nearest batches that are."""
        unit = micro_batch * world
        what = f"micro_batch x world = {micro_batch} x {world} = {unit}" if world > 1 else f"micro_batch {micro_batch}"
        problems = []
        for number in range(from_entry, len(self.entries)):
            entry = self.entries[number]
            if entry.batch % unit:
                below, above = entry.batch // unit * unit, -(-entry.batch // unit) * unit
                use = f"{below} or {above}" if below else f"{above}"
                problems.append(f"entry {number + 1} ({entry.text!r}): batch {entry.batch} is not a multiple of "
                                f"{what} (whole micro-batches on every replica); use {use}")
        return problems

    # --- reading ----------------------------------------------------------------------------------
    def batch_at(self, samples: int) -> int:
        """The batch of a step taken after ``samples`` samples were trained."""
        return int(self.batches[self.entry_at(samples)])

    def entry_at(self, samples: int) -> int:
        """Index of the entry in force after ``samples`` samples."""
        return bisect.bisect_right(self._thresholds, samples) - 1

    def sizes(self, *, steps: int | None = None, samples: int | None = None, tokens: int | None = None
              ) -> np.ndarray:
        """The batch of every step: ``steps`` of them, or as many as train ``samples`` samples
        (``tokens`` tokens: ``ceil(tokens / seq_length)`` samples), the last step taking the total to
        or past it, as a training loop that stops once it has trained that much. With no length: the
        steps up to the last entry, and one step of its batch (a trace that repeats its last batch
        then follows the schedule for ever)."""
        given = [name for name, value in (("steps", steps), ("samples", samples), ("tokens", tokens))
                 if value is not None]
        if len(given) > 1:
            raise InvalidValue(f"give the length of {self.source} once, as steps, samples or tokens; got {given}")
        if tokens is not None:
            if self.seq_length is None:
                raise InvalidValue(f"{self.source} has no seq_length: give its length in samples or steps, or give "
                                   "seq_length (tokens per sample)")
            samples = -(-positive_int(tokens, "tokens") // self.seq_length)
        steps = None if steps is None else trace_steps(steps)
        samples = None if samples is None else positive_int(samples, "samples")
        open_ended = steps is None and samples is None
        parts, consumed, count, last = [], 0, 0, len(self.entries) - 1
        for number, batch in enumerate(self.batches.tolist()):
            end = int(self.thresholds[number + 1]) if number < last else None
            if end is not None and consumed >= end:
                continue  # the step before went past this entry's stretch
            if open_ended and end is None:
                take = 1
            else:
                limits = [(end - consumed + batch - 1) // batch] if end is not None else []
                if samples is not None:
                    limits.append((samples - consumed + batch - 1) // batch)
                if steps is not None:
                    limits.append(steps - count)
                take = max(min(limits), 0)
            if count + take > MAX_TRACE_STEPS:  # refused before it is allocated
                length = ("up to its last entry" if open_ended else
                          f"over {samples:,} samples" if samples is not None else f"over {steps:,} steps")
                raise InvalidValue(f"{self.source} {length} makes at least {count + take:,} steps, more than "
                                   f"{MAX_TRACE_STEPS:,} (10**8): {_WHY_SHORTER}")
            parts.append(np.full(take, batch, dtype=np.int64))
            consumed, count = consumed + take * batch, count + take
            if (steps is not None and count >= steps) or (samples is not None and consumed >= samples):
                break
        return np.concatenate(parts)

    def stages(self, sizes: np.ndarray | None = None) -> list[str]:
        """One line per entry: where it starts (step and samples, with tokens) and its batch, over
        the steps ``sizes`` (default: :meth:`sizes` with no length)."""
        sizes = self.sizes() if sizes is None else np.asarray(sizes, dtype=np.int64)
        before = [0, *itertools.accumulate(sizes.tolist())]  # samples before each step, and after the last
        in_force = [self.entry_at(samples) for samples in before[:-1]]
        lines = []
        for number, entry in enumerate(self.entries):
            where = f"{self.thresholds[number]:,} samples"
            if self.unit == "tokens":
                where = f"{entry.threshold:,} tokens = {where}"
            first = bisect.bisect_left(in_force, number)
            last = bisect.bisect_right(in_force, number) - 1
            if last < first:
                why = "not reached in these steps" if first == len(in_force) else \
                    f"skipped: step {first - 1} went past it (to {before[first]:,} samples)"
                lines.append(f"entry {number + 1} ({entry.text!r}): from {where}: batch {entry.batch}, {why}")
                continue
            lines.append(f"entry {number + 1} ({entry.text!r}): from {where}: batch {entry.batch}, steps "
                         f"{first}..{last} ({last - first + 1} steps, samples {before[first]:,}..{before[last + 1]:,})")
        return lines

    def __str__(self) -> str:
        """Megatron's ``--step-batch-size-schedule`` string of this schedule, in its own unit."""
        return " ".join(f"{_short(e.threshold)}:{e.batch}" for e in self.entries)

    def __repr__(self) -> str:
        per = f", seq_length={self.seq_length}" if self.seq_length else ""
        return f"BatchSchedule({str(self)!r}, unit={self.unit!r}{per})"


def trace_steps(steps: object, name: str = "steps") -> int:
    """``steps`` as the length of a trace: a positive int of at most :data:`MAX_TRACE_STEPS`,
    refused (by ``name``) before a list of that many is made."""
    steps = positive_int(steps, name)
    if steps > MAX_TRACE_STEPS:
        raise InvalidValue(f"{name} must be at most {MAX_TRACE_STEPS:,} (10**8), got {steps:,}: {_WHY_SHORTER}")
    return steps


_WHY_SHORTER = ("a trace holds one row per step, and 10**8 is ten times the longest runs trained; give fewer steps, "
                "or a shorter trace that repeats (when_exhausted='repeat_last' or 'cycle')")


def _short(number: int) -> str:
    """``number`` with Megatron's largest suffix that writes it whole (250000000000 -> 250B)."""
    for suffix, value in sorted(SUFFIXES.items(), key=lambda item: -item[1]):
        if number and number % value == 0:
            return f"{number // value}{suffix}"
    return str(number)


def fitting_worlds(batches: Sequence[int] | np.ndarray, micro_batch: int, limit: int | None = None) -> list[int]:
    """The world sizes (replicas) over which every batch of ``batches`` is whole micro-batches of
    ``micro_batch`` on every replica: the divisors of the greatest common divisor of the batches
    in micro-batches (empty where some batch is not whole micro-batches), up to ``limit``."""
    counts = [int(b) // micro_batch for b in batches if int(b) % micro_batch == 0]
    if len(counts) != len(batches) or not counts:
        return []
    common = math.gcd(*counts)
    return [d for d in divisors_of(common) if limit is None or d <= limit]


def world_fit_problem(batches: Sequence[int] | np.ndarray, micro_batch: int, world: int, what: str) -> str | None:
    """Why ``world`` replicas cannot each take whole micro-batches of every batch of ``batches``
    (``what`` names them in the message), with the world sizes that can; None when it can
    (Megatron #3913: checked after a checkpoint is loaded on another number of replicas)."""
    sizes = np.asarray(batches, dtype=np.int64)
    bad = np.flatnonzero(sizes % (micro_batch * world))
    if not bad.size:
        return None
    fits = fitting_worlds(sizes, micro_batch)
    shown = ", ".join(map(str, fits[:_WORLD_SIZES_SHOWN])) + (", ..." if len(fits) > _WORLD_SIZES_SHOWN else "")
    size = int(sizes[bad[0]])
    shown = shown or "none (a batch is not whole micro-batches)"
    return (f"{world} replicas cannot each take whole micro-batches of {micro_batch} of {what}: batch {size} is "
            f"{size / micro_batch:g} micro-batches; world sizes that fit: {shown}")
