"""Batch-size schedules in the units users write: thresholds in samples or tokens.

Who grows the batch during training writes it as a function of what was trained so far:

* Megatron-LM's ``--step-batch-size-schedule "0:768 250B:1536 500B:3072"`` (PR #3779, relanded in
  #4411): ``THRESHOLD:BATCH`` pairs, thresholds with ``K``/``M``/``B``/``T`` suffixes (10^3 to
  10^12), counted in tokens where a sequence length is given and in samples otherwise
  (:func:`threshold_schedule`);
* NeMo's ``rampup_batch_size: [start, increment, samples]`` beside its ``global_batch_size``
  (:func:`rampup`): the batch grows from ``start`` by ``increment`` in equal shares of ``samples``;
* a linear ramp over samples or tokens (:func:`linear_schedule`), and nanochat's staged ramp, 1/4
  then 1/2 of the batch over the first 3 % and the next 7 % of the budget (:func:`staged_schedule`);
* Seesaw (:func:`seesaw_schedule`, arXiv 2510.14717): the batch doubles wherever an LR decay would
  halve the LR (the LR is then multiplied by 1/sqrt(2) there: the ``"seesaw"`` rule of
  :mod:`aikit.core.scaling`).

Each is a :class:`BatchSchedule`: thresholds in samples (a token threshold ``T`` is ``T //
seq_length`` samples, as Megatron converts it) and the batch from each on. A step's batch is the
batch of the last threshold at or below the samples trained before that step, as Megatron's
calculator reads its schedule before every step; :meth:`BatchSchedule.sizes` writes out the batch
of every step, the trace the samplers and Keras' ``fit_trace`` replay
(:func:`aikit.core.trace.load_trace` takes a schedule). So a run resumed in the middle of a stage
continues exactly: its next batch is a function of its step.

**Tokens per sample are a fixed** ``seq_length``. Packed pre-training (Megatron, nanochat,
Levanter) trains sequences of one length, and a batch that is a function of the step can be
checked before training, replayed and resumed. A count of tokens per sample would make every
batch depend on the data order (the seed and the epoch); a loss over a variable number of tokens
is weighted by tokens within each step (the GA engine's token weights) whatever its batch.

Bad input is refused naming the entry and the fix: thresholds that do not increase or do not
start at 0, units mixed in one schedule, anything but ASCII digits (Python's ``int()`` reads
``6_4`` and Arabic-Indic digits as 64), and a batch that is not a multiple of ``micro_batch x
world`` (every replica the same number of whole micro-batches: Megatron's condition).
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Protocol

import numpy as np

from aikit.core.errors import InvalidType, InvalidValue
from aikit.core.plan import divisors_of
from aikit.core.validate import checked_choice, positive_int

__all__ = ["NANOCHAT_STAGES", "SUFFIXES", "UNITS", "BatchSchedule", "fitting_worlds", "linear_schedule",
           "parse_amount", "rampup", "seesaw_schedule", "staged_schedule", "threshold_schedule"]

UNITS = ("samples", "tokens")
SUFFIXES = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}  # Megatron's, decimal
MAX_AMOUNT = 10**30  # beyond any budget: larger numbers are typos
NANOCHAT_STAGES = (("1/4", "3%"), ("1/2", "7%"))  # nanochat #851: a quarter, then half, of the batch
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
        steps = None if steps is None else positive_int(steps, "steps")
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


# --- the schedules -------------------------------------------------------------------------------
def _unit_of(entries_units: list[tuple[str, str | None]], unit: str | None, seq_length: int | None,
             source: str) -> str:
    """The schedule's unit: the one its entries name (all the same), else ``unit``, else Megatron's
    rule (tokens with a sequence length, samples without)."""
    named = [(text, u) for text, u in entries_units if u is not None]
    for (text_a, unit_a), (text_b, unit_b) in itertools.pairwise(named):
        if unit_a != unit_b:
            raise InvalidValue(
                f"{source}: {text_a!r} counts {unit_a} but {text_b!r} counts {unit_b}: one schedule counts one unit; "
                f"write every threshold in {unit_a} (a sample is seq_length tokens)")
    if named and unit is not None and named[0][1] != unit:
        raise InvalidValue(f"{source}: {named[0][0]!r} counts {named[0][1]} but the schedule's unit is {unit!r}: "
                           f"write its thresholds in {unit}, or give unit={named[0][1]!r}")
    if named:
        return named[0][1]
    if unit is not None:
        return checked_choice(unit, "unit", UNITS)
    return "tokens" if seq_length is not None else "samples"


def threshold_schedule(spec: str | Sequence[tuple[object, object]], *, seq_length: int | None = None,
                       unit: str | None = None, micro_batch: int = 1, world: int = 1) -> BatchSchedule:
    """Megatron-LM's ``--step-batch-size-schedule``: ``"0:768 250B:1536 500B:3072"`` (entries
    separated by spaces or commas), or pairs ``[(0, 768), ("250B", 1536)]``. Thresholds count
    tokens where ``seq_length`` is given and samples otherwise (Megatron's rule), unless ``unit``
    or the entries say (``"250Btokens"``, ``"61Msamples"``). Unlike Megatron, entries out of order
    are refused, not sorted, and a threshold must be a whole number."""
    if isinstance(spec, str):
        source = f"schedule {spec.strip()!r:.80}"
        pieces = spec.replace(",", " ").split()
        pairs = []
        for number, piece in enumerate(pieces, start=1):
            if piece.count(":") != 1:
                raise InvalidValue(f"{source}: entry {number} ({piece!r:.40}) is not 'threshold:batch' "
                                   "(e.g. '250B:1536')")
            pairs.append((*piece.split(":"), piece))
    elif isinstance(spec, Sequence) and not isinstance(spec, bytes):
        source = "schedule"
        pairs = []
        for number, pair in enumerate(spec, start=1):
            if isinstance(pair, str) or not isinstance(pair, Sequence) or len(pair) != 2:
                raise InvalidType(f"{source}: entry {number} ({pair!r:.40}) must be a (threshold, batch) pair")
            pairs.append((pair[0], pair[1], f"{pair[0]}:{pair[1]}"))
    else:
        raise InvalidType(f"a threshold schedule is a string such as '0:768 250B:1536' or a list of (threshold, batch) "
                          f"pairs, got {type(spec).__name__}")
    parsed = []
    for number, (threshold, batch, text) in enumerate(pairs, start=1):
        where = f"{source}: entry {number} ({text!r:.40})"
        at, at_unit = parse_amount(threshold, "threshold", where)
        size, size_unit = parse_amount(batch, "batch", where)
        if size_unit is not None:
            raise InvalidValue(f"{where}: the batch {batch!r} is a number of samples: write it without a unit")
        parsed.append((Entry(at, size, text), at_unit))
    chosen = _unit_of([(e.text, u) for e, u in parsed], unit, seq_length, source)
    return BatchSchedule([e for e, _ in parsed], unit=chosen, seq_length=seq_length, micro_batch=micro_batch,
                         world=world, source=source)


def rampup(rampup_batch_size: Sequence[int], global_batch_size: int, *, micro_batch: int = 1,
           world: int = 1) -> BatchSchedule:
    """NeMo's ``rampup_batch_size: [start, increment, samples]`` with its ``global_batch_size``
    (Megatron's former ``--rampup-batch-size``): the batch starts at ``start`` and grows by
    ``increment`` after each of the ``(global - start) / increment`` equal shares of ``samples``,
    reaching ``global_batch_size`` after ``samples``. Megatron computes the step ``floor(consumed /
    (samples / n))`` in floating point; here it is exact: increment ``k`` from ``ceil(k samples / n)``."""
    source = f"rampup_batch_size {rampup_batch_size!r:.60}"
    if isinstance(rampup_batch_size, str) or not isinstance(rampup_batch_size, Sequence) or len(rampup_batch_size) != 3:
        raise InvalidType(f"{source} must be [start, increment, samples] (NeMo's list of three), e.g. [16, 8, 300000]")
    start, increment, samples = (parse_amount(v, name, source)[0] for v, name in
                                 zip(rampup_batch_size, ("start", "increment", "samples"), strict=True))
    end = positive_int(global_batch_size, "global_batch_size")
    for value, name in ((start, "start"), (increment, "increment")):
        if value < 1:
            raise InvalidValue(f"{source}: {name} must be a positive number of samples, got {value}")
    if end < start or (end - start) % increment:
        raise InvalidValue(
            f"{source}: global_batch_size {end} must be start {start} plus a whole number of increments of {increment}"
            f"; use global_batch_size {start + max(0, (end - start) // increment) * increment} or "
            f"{start + max(1, -(-(end - start) // increment)) * increment}")
    count = (end - start) // increment
    if count and samples < count:
        raise InvalidValue(f"{source}: {samples} ramp-up samples cannot hold {count} increments: give samples >= "
                           f"{count}")
    entries = [Entry(0, start, f"start {start}")]
    entries += [Entry(-(-k * samples // count), start + k * increment, f"increment {k}") for k in range(1, count + 1)]
    return BatchSchedule(entries, micro_batch=micro_batch, world=world, source=source)


def linear_schedule(start: int, end: int, over: object, *, increment: int | None = None, unit: str = "samples",
                    seq_length: int | None = None, micro_batch: int = 1, world: int = 1) -> BatchSchedule:
    """The batch from ``start`` to ``end`` in steps of ``increment`` (default ``micro_batch x
    world``) spread evenly over the first ``over`` samples or tokens (``unit``): NeMo's ramp, written
    with its ends."""
    over_amount, over_unit = parse_amount(over, "ramp length", "linear schedule")
    unit = _unit_of([(str(over), over_unit)], unit, seq_length, "linear schedule")
    step = micro_batch * world if increment is None else positive_int(increment, "increment")
    start, end = positive_int(start, "start"), positive_int(end, "end")
    if end < start or (end - start) % step:
        raise InvalidValue(f"linear schedule: end {end} must be start {start} plus a whole number of increments of "
                           f"{step}; use end {start + max(0, (end - start) // step) * step} or "
                           f"{start + max(1, -(-(end - start) // step)) * step}")
    count = (end - start) // step
    if count and over_amount < count:
        raise InvalidValue(f"linear schedule: a ramp over {over_amount} {unit} cannot hold {count} increments")
    entries = [Entry(0, start, f"start {start}")]
    entries += [Entry(-(-k * over_amount // count), start + k * step, f"increment {k}") for k in range(1, count + 1)]
    return BatchSchedule(entries, unit=unit, seq_length=seq_length, micro_batch=micro_batch, world=world,
                         source=f"linear schedule {start}..{end} over {over}")


def _fraction(value: object, what: str, where: str) -> Fraction:
    """``value`` (``0.25``, ``"1/4"``, ``"3%"``, a ``Fraction``) as an exact fraction in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float, Fraction)):
        raise InvalidType(f"{where}: {what} {value!r:.40} must be a fraction such as 0.25, '1/4' or '3%'")
    text = value if isinstance(value, str) else repr(value) if isinstance(value, float) else value
    try:
        if isinstance(text, str):
            if not re.fullmatch(r"\s*[0-9]+(\.[0-9]+)?\s*(%|/\s*[0-9]+)?\s*", text, re.ASCII):
                raise InvalidValue(text)  # caught below, with the entry named
            fraction = Fraction(text.strip().rstrip("%").replace(" ", "")) / (100 if text.strip().endswith("%") else 1)
        else:
            fraction = Fraction(text)
    except (ValueError, ZeroDivisionError):
        raise InvalidValue(f"{where}: {what} {value!r:.40} is not a fraction such as 0.25, '1/4' or '3%'") from None
    if not 0 < fraction <= 1:
        raise InvalidValue(f"{where}: {what} {value!r:.40} must be above 0 and at most 1 (100%)")
    return fraction


def staged_schedule(batch: int, total: object, stages: Sequence[tuple[object, object]] = NANOCHAT_STAGES, *,
                    unit: str = "samples", seq_length: int | None = None, micro_batch: int = 1,
                    world: int = 1) -> BatchSchedule:
    """nanochat's batch ramp (#851): each stage ``(fraction of the batch, fraction of the
    budget)`` in turn, then the whole ``batch``; by default a quarter of it over the first 3 % of
    ``total`` (samples or tokens: ``unit``) and half over the next 7 %. nanochat scales the LR by
    the square root of each stage's batch (the ``"sqrt"`` rule, with ``batch`` as reference)."""
    full = positive_int(batch, "batch")
    amount, amount_unit = parse_amount(total, "budget", "staged schedule")
    unit = _unit_of([(str(total), amount_unit)], unit, seq_length, "staged schedule")
    entries, at = [], Fraction(0)
    for number, stage in enumerate(stages, start=1):
        where = f"staged schedule: stage {number}"
        if isinstance(stage, str) or not isinstance(stage, Sequence) or len(stage) != 2:
            raise InvalidType(f"{where} ({stage!r:.40}) must be (fraction of the batch, fraction of the budget)")
        share, length = _fraction(stage[0], "batch fraction", where), _fraction(stage[1], "budget fraction", where)
        size = full * share
        if size.denominator != 1:
            raise InvalidValue(f"{where}: {stage[0]} of batch {full} is {float(size):g} samples, not a whole number: "
                               "use a batch the fractions divide")
        entries.append(Entry(math.floor(at * amount), int(size), f"stage {number}: {stage[0]} for {stage[1]}"))
        at += length
    if at >= 1:
        raise InvalidValue(f"staged schedule: the stages take {float(at):.0%} of the budget; leave some of it to the "
                           "whole batch")
    entries.append(Entry(math.floor(at * amount), full, f"batch {full} from {float(at):.0%}"))
    return BatchSchedule(entries, unit=unit, seq_length=seq_length, micro_batch=micro_batch, world=world,
                         source=f"staged schedule of batch {full}")


class LRDecay(Protocol):
    """An LR decay over the samples trained (:func:`aikit.core.scaling.cosine_decay`,
    :func:`~aikit.core.scaling.step_decay`): the base LR's multiplier after ``samples``, and the
    first sample count at which it is ``level`` or less (None if never)."""

    def __call__(self, samples: int) -> float: ...

    def first_at_or_below(self, level: float) -> int | None: ...


def seesaw_schedule(base_batch: int, decay: LRDecay, *, max_batch: int, factor: int = 2, micro_batch: int = 1,
                    world: int = 1) -> BatchSchedule:
    """Seesaw (Meterez et al., 2025, arXiv 2510.14717): wherever ``decay`` (an LR decay over
    samples, e.g. :func:`aikit.core.scaling.step_decay` or ``cosine_decay``) falls by another
    ``factor``, the batch grows by ``factor`` instead (up to ``max_batch``). Train it with the
    ``"seesaw"`` LR rule (the base LR times ``decay`` times ``sqrt(batch / base_batch)``: where a
    step decay halves the LR, Seesaw's LR falls by ``1/sqrt(2)``)."""
    base, cap = positive_int(base_batch, "base_batch"), positive_int(max_batch, "max_batch")
    factor = positive_int(factor, "factor")
    if factor < 2:
        raise InvalidValue(f"factor must be 2 or more (the batch grows by it where the LR would fall by it), got "
                           f"{factor}")
    if cap < base:
        raise InvalidValue(f"max_batch {cap} is below base_batch {base}: Seesaw only grows the batch")
    if not callable(decay) or not callable(getattr(decay, "first_at_or_below", None)):
        raise InvalidType(f"decay must be an LR decay over samples (aikit.core.scaling.cosine_decay or step_decay), "
                          f"got {decay!r:.60}")
    entries, batch, level = [Entry(0, base, f"base batch {base}")], base, 1
    while batch * factor <= cap:
        level += 1
        at = decay.first_at_or_below(float(factor) ** -(level - 1))
        if at is None:
            break
        batch *= factor
        if at <= entries[-1].threshold:  # a decay that fell by several factors at once (e.g. 0.1 at a milestone)
            entries[-1] = Entry(entries[-1].threshold, batch, f"batch {batch} from {at}")
        else:
            entries.append(Entry(at, batch, f"batch {batch} from {at}"))
    return BatchSchedule(entries, micro_batch=micro_batch, world=world, source=f"Seesaw schedule from {base}")
