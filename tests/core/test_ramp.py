"""Batch-size schedules in samples or tokens: Megatron's and NeMo's own arithmetic, nanochat's
stages, Seesaw, the per-step batches they become, and every refusal with its entry and fix."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aikit.core import ramp
from aikit.core.ramp import (
    fitting_worlds,
    linear_schedule,
    parse_amount,
    rampup,
    seesaw_schedule,
    staged_schedule,
    threshold_schedule,
)
from aikit.core.scaling import cosine_decay, scaled_lr, step_decay
from aikit.core.trace import Trace, TraceExhaustedError, load_trace, schedule_trace


# --- the originals' arithmetic, written out from their source (Megatron-LM core/num_microbatches_calculator.py)
def megatron_parse(value: str) -> int:
    """StepBatchsizeNumMicroBatchesCalculator._parse_numeric_value."""
    value = value.strip().upper()
    multiplier = 1
    for suffix, factor in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if value.endswith(suffix):
            multiplier, value = factor, value[:-1]
            break
    return int(float(value) * multiplier)


def megatron_batches(schedule: str, seq_length: int | None, steps: int) -> list[int]:
    """Megatron's loop: before every step, the batch of the last threshold at or below the
    samples consumed (``update(consumed_samples)``), thresholds in tokens // seq_length."""
    entries = []
    for entry in schedule.strip().replace(",", " ").split():
        threshold, batch = entry.split(":", 1)
        threshold = megatron_parse(threshold)
        if seq_length is not None:
            threshold //= seq_length
        entries.append((threshold, megatron_parse(batch)))
    entries.sort(key=lambda e: e[0])
    consumed, batches = 0, []
    for _ in range(steps):
        batch = entries[0][1]
        for threshold, size in entries:
            if consumed >= threshold:
                batch = size
            else:
                break
        batches.append(batch)
        consumed += batch
    return batches


def nemo_batches(start: int, increment: int, ramp_samples: int, global_batch: int, steps: int) -> list[int]:
    """Megatron's RampupBatchsizeNumMicroBatchesCalculator (NeMo's rampup_batch_size)."""
    per_increment = ramp_samples / ((global_batch - start) // increment)
    consumed, batches = 0, []
    for _ in range(steps):
        batch = global_batch if consumed > ramp_samples else start + int(consumed / per_increment) * increment
        batches.append(batch)
        consumed += batch
    return batches


def test_megatrons_example_in_tokens():
    schedule = threshold_schedule("0:768 250B:1536 500B:3072 750B:6144", seq_length=4096)
    assert schedule.unit == "tokens" and schedule.thresholds.tolist() == [0, 61035156, 122070312, 183105468]
    sizes = schedule.sizes(tokens=10**12)
    assert sizes.tolist() == megatron_batches("0:768 250B:1536 500B:3072 750B:6144", 4096, len(sizes))
    assert int(sizes.sum()) * 4096 >= 10**12 > int(sizes[:-1].sum()) * 4096  # stops once 1T tokens are trained
    assert str(schedule) == "0:768 250B:1536 500B:3072 750B:6144"


@given(
    batches=st.lists(st.integers(1, 64), min_size=1, max_size=5),
    gaps=st.lists(st.integers(1, 400), min_size=4, max_size=4),
    seq_length=st.one_of(st.none(), st.integers(1, 9)),
    steps=st.integers(1, 120),
)
def test_every_step_takes_megatrons_batch(batches, gaps, seq_length, steps):
    thresholds = [0, *np.cumsum(gaps[: len(batches) - 1]).tolist()]
    if seq_length:
        thresholds = [t * seq_length for t in thresholds]  # whole samples apart, in tokens
    spec = ", ".join(f"{t}:{b}" for t, b in zip(thresholds, batches, strict=True))
    mine = threshold_schedule(spec, seq_length=seq_length).sizes(steps=steps)
    assert mine.tolist() == megatron_batches(spec, seq_length, steps)


@given(
    start=st.integers(1, 40),
    increment=st.integers(1, 16),
    increments=st.integers(1, 12),
    per_increment=st.integers(1, 300),
    steps=st.integers(1, 200),
)
def test_nemo_rampup_is_megatrons_rampup(start, increment, increments, per_increment, steps):
    """With a ramp that is a whole number of samples per increment, Megatron's floating-point
    division is exact, and the two agree step for step."""
    samples, end = increments * per_increment, start + increments * increment
    mine = rampup([start, increment, samples], end).sizes(steps=steps)
    assert mine.tolist() == nemo_batches(start, increment, samples, end, steps)


def test_nemos_readme_example_and_linear_schedule():
    """NeMo's [16, 8, 300000] with global batch 1024: 126 increments of about 2,380 samples."""
    schedule = rampup([16, 8, 300_000], 1024)
    assert len(schedule.entries) == 127 and schedule.batches[-1] == 1024
    assert schedule.thresholds[1] == 2381 and schedule.thresholds[-1] == 300_000  # ceil(300000 / 126)
    sizes = schedule.sizes(samples=400_000)
    assert sizes[0] == 16 and sizes[-1] == 1024 and (np.diff(sizes) >= 0).all()
    same = linear_schedule(16, 1024, 300_000, increment=8)
    assert same.thresholds.tolist() == schedule.thresholds.tolist()
    assert same.batches.tolist() == schedule.batches.tolist()
    assert rampup([64, 32, 1000], 64).sizes(steps=3).tolist() == [64, 64, 64]  # no increments: Megatron divides by 0


def test_nanochat_stages_a_quarter_then_half_over_the_first_ten_percent_of_tokens():
    schedule = staged_schedule(1024, "1B", seq_length=1000, unit="tokens")
    assert schedule.batches.tolist() == [256, 512, 1024]
    assert schedule.thresholds.tolist() == [0, 30_000, 100_000]  # 3 % and 10 % of 1B tokens, in samples
    sizes = schedule.sizes(tokens=10**9)
    before = np.concatenate(([0], np.cumsum(sizes)))[:-1]
    assert (sizes[before < 30_000] == 256).all() and (sizes[(before >= 30_000) & (before < 100_000)] == 512).all()
    assert (sizes[before >= 100_000] == 1024).all()
    custom = staged_schedule(96, 1000, [("1/3", 0.1), ("2/3", "20%")])
    assert custom.batches.tolist() == [32, 64, 96] and custom.thresholds.tolist() == [0, 100, 300]


def test_seesaw_doubles_the_batch_where_a_step_decay_halves_the_lr():
    decay = step_decay([1000, 2000, 3000])
    schedule = seesaw_schedule(64, decay, max_batch=256)
    assert str(schedule) == "0:64 1K:128 2K:256"  # capped at 256: the third halving stays in the LR
    sizes = schedule.sizes(samples=4000)
    before = np.concatenate(([0], np.cumsum(sizes)))[:-1]
    lrs = [scaled_lr(0.1, int(b), 64, "seesaw", decay=decay(int(s))) for b, s in zip(sizes, before, strict=True)]
    plain = [0.1 * decay(int(s)) for s in before]  # step decay at batch 64
    for lr, batch, s, base in zip(lrs, sizes, before, plain, strict=True):
        halvings = sum(s >= m for m in (1000, 2000, 3000))
        doublings = int(math.log2(batch // 64))
        # the halvings the batch took over are x 1/sqrt(2) each
        assert lr == pytest.approx(0.1 * 2.0 ** -(halvings - doublings) * 2.0 ** (-doublings / 2))
        assert lr / math.sqrt(batch / 64) == pytest.approx(base)  # lr / sqrt(B / B0) follows the step decay


def test_seesaw_over_a_cosine_keeps_lr_over_sqrt_batch_on_the_cosine():
    decay = cosine_decay(100_000)
    schedule = seesaw_schedule(32, decay, max_batch=512)
    assert schedule.batches.tolist() == [32, 64, 128, 256, 512]
    for threshold, level in zip(schedule.thresholds[1:], (0.5, 0.25, 0.125, 0.0625), strict=True):
        assert decay(threshold) <= level < decay(threshold - 1)  # the first sample where the cosine is at the level
    sizes = schedule.sizes(samples=100_000)
    before = np.concatenate(([0], np.cumsum(sizes)))[:-1]
    for batch, s in zip(sizes.tolist(), before.tolist(), strict=True):
        lr = scaled_lr(0.2, batch, 32, "seesaw", decay=decay(s))
        assert lr / math.sqrt(batch / 32) == pytest.approx(0.2 * decay(s))
    assert len(sizes) < len(Trace([32]).sizes) * 100_000 // 32  # fewer steps than the cosine's at batch 32


def test_a_decay_that_falls_by_several_factors_at_once_grows_the_batch_at_once():
    schedule = seesaw_schedule(16, step_decay([500], gamma=0.1), max_batch=1024)
    assert str(schedule) == "0:16 500:128"  # 0.1 <= 1/8: three doublings at once; the rest (0.8) stays in the LR


def test_lengths_and_the_open_ended_trace():
    schedule = threshold_schedule("0:8 100:16 130:32")
    assert schedule.sizes(steps=3).tolist() == [8, 8, 8]
    assert schedule.sizes(samples=150).tolist() == [8] * 13 + [16] * 2 + [32]  # 104 then 120, 136 then 168
    assert schedule.sizes().tolist() == [8] * 13 + [16] * 2 + [32]
    trace = load_trace(schedule)
    assert trace.when_exhausted == "repeat_last" and trace[1000] == 32
    bounded = schedule_trace(schedule, samples=150)
    assert bounded.when_exhausted == "stop" and bounded.samples_before(len(bounded)) == 168
    lines = threshold_schedule("0:8 4:16 6:32").stages()
    assert lines[1] == "entry 2 ('4:16'): from 4 samples: batch 16, skipped: step 0 went past it (to 8 samples)"


def test_samples_before_each_step_for_every_policy():
    assert [Trace([2, 3]).samples_before(s) for s in range(3)] == [0, 2, 5]
    assert Trace([2, 3], "repeat_last").samples_before(5) == 2 + 3 * 4
    assert Trace([2, 3], "cycle").samples_before(5) == 2 * 5 + 2
    with pytest.raises(TraceExhaustedError, match="step 3 was asked for"):
        Trace([2, 3]).samples_before(4)


def test_amounts_are_exact_ascii_numbers():
    assert parse_amount("250B", "threshold", "here") == (250 * 10**9, None)
    assert parse_amount("1.5m", "threshold", "here") == (1_500_000, None)
    assert parse_amount("61035156samples", "threshold", "here") == (61035156, "samples")
    assert parse_amount("2Ttok", "threshold", "here") == (2 * 10**12, "tokens")
    assert parse_amount("300tokens", "threshold", "here") == (300, "tokens")  # 't' of tokens is not a suffix


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: threshold_schedule("0:768 500B:1536 250B:3072", seq_length=4096),
         r"entry 3 \('250B:3072'\) is at 250,000,000,000 tokens, not after entry 2 \('500B:1536'\) at "
         r"500,000,000,000: thresholds must increase; put the entries in the order training reaches them"),
        (lambda: threshold_schedule("10M:768 250B:1536", seq_length=4096),
         r"entry 1 \('10M:768'\) starts at 10000000 tokens: the first threshold must be 0, the batch from the start "
         r"of training \(e.g. '0:768'\)"),
        (lambda: threshold_schedule("0:768 250Btokens:1536 61Msamples:3072", seq_length=4096),
         r"'250Btokens:1536' counts tokens but '61Msamples:3072' counts samples: one schedule counts one unit; "
         r"write every threshold in tokens"),
        (lambda: threshold_schedule("0:768 250Btokens:1536", unit="samples", seq_length=4096),
         r"'250Btokens:1536' counts tokens but the schedule's unit is 'samples'"),
        (lambda: threshold_schedule("0:768 250Btokens:1536"),
         r"counts tokens: give seq_length, the tokens per sample"),
        (lambda: threshold_schedule("0:768 250B:1000", seq_length=4096, micro_batch=4, world=8),
         r"entry 2 \('250B:1000'\): batch 1000 is not a multiple of micro_batch x world = 4 x 8 = 32 \(whole "
         r"micro-batches on every replica\); use 992 or 1024"),
        (lambda: threshold_schedule("0:6 100:10", micro_batch=4),
         r"entry 1 \('0:6'\): batch 6 is not a multiple of micro_batch 4 .*; use 4 or 8\n  entry 2 \('100:10'\): "
         r"batch 10 is not a multiple of micro_batch 4 .*; use 8 or 12"),
        (lambda: threshold_schedule("0:768 2\u0665" "0B:1536"), r"entry 2 .*threshold '2\u06650B' is not a number: "
         r"write ASCII digits"),
        (lambda: threshold_schedule("0:6_4"), r"entry 1 \('0:6_4'\): batch '6_4' is not a number"),
        (lambda: threshold_schedule("0:\u0666\u0664"), r"batch '\u0666\u0664' is not a number"),
        (lambda: threshold_schedule("0:64 1.2345K:128"), r"threshold '1.2345K' is 1234.5, not a whole number"),
        (lambda: threshold_schedule("0:64 1e9:128"), r"threshold '1e9' is not a number"),
        (lambda: threshold_schedule("0:64 100"), r"entry 2 \('100'\) is not 'threshold:batch'"),
        (lambda: threshold_schedule("0:64 100:0"), r"entry 2 \('100:0'\) has batch 0: a batch is a positive number"),
        (lambda: threshold_schedule("0:64 100:128samples"), r"the batch '128samples' is a number of samples"),
        (lambda: threshold_schedule("0:64 8192:128 8193:256", seq_length=4096),
         r"entries 2 \('8192:128'\) and 3 \('8193:256'\) fall on the same sample \(2\) at seq_length 4096: "
         r"thresholds must be a sample \(4096 tokens\) apart or more"),
        (lambda: threshold_schedule(""), r"has no entries"),
        (lambda: rampup([16, 8, 300_000], 1001),
         r"global_batch_size 1001 must be start 16 plus a whole number of increments of 8; use global_batch_size "
         r"1000 or 1008"),
        (lambda: rampup([16, 10, 300_000], 1000), r"use global_batch_size 996 or 1006"),
        (lambda: rampup([16, 8], 1024), r"must be \[start, increment, samples\]"),
        (lambda: rampup([16, 8, 5], 1024), r"5 ramp-up samples cannot hold 126 increments"),
        (lambda: staged_schedule(1000, 10**6, [("1/3", "3%")]), r"stage 1: 1/3 of batch 1000 is 333.333 samples"),
        (lambda: staged_schedule(1024, 10**6, [("1/4", "60%"), ("1/2", "40%")]), r"the stages take 100% of the budget"),
        (lambda: staged_schedule(1024, 10**6, [("1/4", "3%%")]), r"budget fraction '3%%' is not a fraction"),
        (lambda: seesaw_schedule(64, step_decay([10]), max_batch=32), r"max_batch 32 is below ref_batch_size 64"),
        (lambda: seesaw_schedule(64, 0.5, max_batch=128), r"decay must be an LR decay over samples"),
        (lambda: step_decay([200, 100]), r"milestones must increase, got \[200, 100\]"),
        (lambda: threshold_schedule("0:8").sizes(steps=1, samples=8), r"give the length of .* once"),
        (lambda: threshold_schedule("0:8").sizes(tokens=8), r"has no seq_length"),
    ],
)
def test_bad_schedules_are_refused_naming_the_entry_and_the_fix(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_the_world_sizes_that_fit():
    assert fitting_worlds([768, 1536, 3072], 4) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 192]
    assert fitting_worlds([768, 1536], 4, limit=8) == [1, 2, 3, 4, 6, 8]
    assert fitting_worlds([6], 4) == []
    assert ramp.world_fit_problem([8, 12], 4, 2, "the rest") == (
        "2 replicas cannot each take whole micro-batches of 4 of the rest: batch 12 is 3 micro-batches; world sizes "
        "that fit: 1")
    assert ramp.world_fit_problem([8, 16], 4, 2, "the rest") is None
