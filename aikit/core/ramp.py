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

import itertools
import math
import re
from collections.abc import Sequence
from fractions import Fraction
from typing import Protocol

from aikit.core.batch_schedule import (
    SUFFIXES,
    UNITS,
    BatchSchedule,
    Entry,
    fitting_worlds,
    parse_amount,
    world_fit_problem,
)
from aikit.core.errors import InvalidType, InvalidValue
from aikit.core.validate import checked_choice, positive_int

__all__ = ["NANOCHAT_STAGES", "SUFFIXES", "UNITS", "BatchSchedule", "fitting_worlds", "linear_schedule",
           "parse_amount", "rampup", "seesaw_schedule", "staged_schedule", "threshold_schedule",
           "world_fit_problem"]

NANOCHAT_STAGES = (("1/4", "3%"), ("1/2", "7%"))  # nanochat #851: a quarter, then half, of the batch


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


def seesaw_schedule(ref_batch_size: int, decay: LRDecay, *, max_batch: int, factor: int = 2, micro_batch: int = 1,
                    world: int = 1) -> BatchSchedule:
    """Seesaw (Meterez et al., 2025, arXiv 2510.14717): wherever ``decay`` (an LR decay over
    samples, e.g. :func:`aikit.core.scaling.step_decay` or ``cosine_decay``) falls by another
    ``factor``, the batch grows by ``factor`` instead (up to ``max_batch``). Train it with the
    ``"seesaw"`` LR rule (the base LR times ``decay`` times ``sqrt(batch / ref_batch_size)``: where
    a step decay halves the LR, Seesaw's LR falls by ``1/sqrt(2)``); the schedule starts at
    ``ref_batch_size``, the global batch the base LR was tuned for."""
    base, cap = positive_int(ref_batch_size, "ref_batch_size"), positive_int(max_batch, "max_batch")
    factor = positive_int(factor, "factor")
    if factor < 2:
        raise InvalidValue(f"factor must be 2 or more (the batch grows by it where the LR would fall by it), got "
                           f"{factor}")
    if cap < base:
        raise InvalidValue(f"max_batch {cap} is below ref_batch_size {base}: Seesaw only grows the batch")
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
