"""aikit.core.ga: every weighting makes the update the plain mean over the window's samples, or
over its loss terms (tokens).

The reference is numpy's mean over all samples' (terms') gradients of a window; the micro-batch
gradients are means over their own samples (terms), as a mean loss gives them."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aikit.core.ga import (
    accumulated_divisor,
    common_size,
    equal_share,
    mean_scale,
    reduction_name,
    relative_weight,
    sample_share,
    short_window_factor,
    term_count,
)
from aikit.core.plan import make_plan

# a window: per replica, the sizes of its micro-batches (0: the replica sits that step out)
windows = st.integers(1, 4).flatmap(
    lambda replicas: st.lists(st.lists(st.integers(0, 7), min_size=replicas, max_size=replicas),
                              min_size=1, max_size=5)
).filter(lambda steps: sum(map(sum, steps)) > 0)


def gradients(sizes: list[list[int]], seed: int = 0) -> tuple[list[list[np.ndarray | None]], np.ndarray]:
    """Micro-batch mean gradients (None for an empty one) and the mean over all samples."""
    rng = np.random.default_rng(seed)
    per_sample = [[rng.normal(size=(n, 3)) for n in step] for step in sizes]
    means = [[g.mean(0) if len(g) else None for g in step] for step in per_sample]
    return means, np.concatenate([g for step in per_sample for g in step]).mean(0)


@given(windows, st.booleans())
def test_sample_weights_make_the_window_mean_when_summed_or_averaged(sizes, averaged):
    means, expected = gradients(sizes)
    replicas = len(sizes[0])
    total = sum(map(sum, sizes))
    world = replicas if averaged else 1
    per_replica = [
        sum((sample_share(step[r], total, world) * means[s][r] for s, step in enumerate(sizes) if step[r]),
            np.zeros(3))
        for r in range(replicas)
    ]
    reduced = sum(per_replica) / world  # DDP/Horovod average, or a plain sum
    np.testing.assert_allclose(reduced, expected, rtol=1e-12, atol=1e-12)


@given(windows, st.booleans())
def test_term_counts_summed_at_the_update_make_the_mean_over_every_term(counts, averaged):
    """A language model's micro-batches hold different numbers of tokens (0 for an idle replica
    or a sequence whose labels are all ignored): weighing each mean by its count and dividing
    once by the total over every replica gives the mean over all the tokens, whatever the
    split, where the mean of the micro-batch means does not."""
    means, expected = gradients(counts, seed=7)
    replicas = len(counts[0])
    world = replicas if averaged else 1
    per_replica = [sum((n * means[s][r] for s, step in enumerate(counts) if (n := step[r])), np.zeros(3))
                   for r in range(replicas)]
    reduced = sum(per_replica) / world  # DDP/FSDP average, the reduce-at-update optimizer sums
    total = sum(map(sum, counts))
    np.testing.assert_allclose(reduced * mean_scale(total, 1, world), expected, rtol=1e-12, atol=1e-12)


def test_the_mean_of_micro_batch_means_is_not_the_token_mean():
    """torchtune #1875's (x1/n1)+(x2/n2) != (x1+x2)/(n1+n2): the bug weight= exists for."""
    (first, second), expected = gradients([[1], [9]], seed=3)
    assert not np.allclose((first[0] + second[0]) / 2, expected)
    np.testing.assert_allclose((1 * first[0] + 9 * second[0]) * mean_scale(10), expected, rtol=1e-12)


@given(windows)
def test_sample_weights_are_the_weighting_models_case_with_the_total_known_in_advance(sizes):
    total = sum(map(sum, sizes))
    for n in (n for step in sizes for n in step):
        assert sample_share(n, total) == mean_scale(total, n)


@given(windows)
def test_relative_weights_times_one_unit_per_update_make_the_window_mean(sizes):
    means, expected = gradients(sizes)
    total = sum(map(sum, sizes))
    flat = [n for step in sizes for n in step]
    unit = common_size(total, len(flat))
    accumulated = sum(
        ((relative_weight(n, unit) or 1.0) * means[s][r] for s, step in enumerate(sizes)
         for r, n in enumerate(step) if n),
        np.zeros(3),
    )
    np.testing.assert_allclose(accumulated * sample_share(unit, total), expected, rtol=1e-12, atol=1e-12)


@given(windows, st.integers(0, 30))
def test_a_short_window_weighted_against_the_planned_one_is_corrected_to_its_mean(sizes, missing):
    means, expected = gradients(sizes)
    seen = sum(map(sum, sizes))
    planned = seen + missing  # the global batch the weights were computed for
    summed = sum((sample_share(n, planned) * means[s][r] for s, step in enumerate(sizes)
                  for r, n in enumerate(step) if n), np.zeros(3))
    np.testing.assert_allclose(summed * short_window_factor(planned, seen), expected, rtol=1e-12, atol=1e-12)


@given(st.integers(1, 6), st.integers(1, 9))
def test_equal_micro_batches_weigh_one_over_the_micro_steps_accumulated(steps, size):
    means, expected = gradients([[size]] * steps)
    np.testing.assert_allclose(sum(equal_share(steps) * m[0] for m in means), expected, rtol=1e-12)


@given(st.integers(1, 5), st.integers(1, 4), st.integers(1, 7), st.booleans(), st.sampled_from(["mean", "sum"]))
def test_equal_weights_make_the_windows_mean_or_sum_when_replicas_sum_or_average(steps, replicas, size, averaged,
                                                                               reduction):
    """Each replica weighs its own micro-batches; the replicas' results are summed or averaged.
    'mean' gives the mean of a mean loss's big batch; 'sum' (Run:AI's original) the gradient of a
    summed loss over the window: the sum of the micro-batch sums."""
    rng = np.random.default_rng(steps * 100 + replicas * 10 + size)
    per_sample = rng.normal(size=(steps, replicas, size, 3))
    world = replicas if averaged else 1
    weight = equal_share(steps, reduction, replicas, world)
    micro_losses = per_sample.mean(2) if reduction == "mean" else per_sample.sum(2)  # the loss's own reduction
    reduced = sum(weight * micro_losses[s, r] for s in range(steps) for r in range(replicas)) / world
    expected = per_sample.reshape(-1, 3).mean(0) if reduction == "mean" else per_sample.reshape(-1, 3).sum(0)
    np.testing.assert_allclose(reduced, expected, rtol=1e-12, atol=1e-12)
    assert accumulated_divisor(steps, reduction) * equal_share(steps, reduction) == pytest.approx(1.0)


@given(st.integers(1, 600), st.integers(1, 80), st.integers(1, 9))
def test_the_common_size_is_the_size_most_micro_batches_of_a_plan_share(g, m, n):
    plan = make_plan(g, m, n)
    sizes = Counter(size for step in plan.micro_batch_sizes for size in step)
    common = common_size(g, plan.steps * plan.gpus)
    assert sizes[common] == max(sizes.values())
    assert plan.share(0, 0) == plan.micro_batch_sizes[0][0] / g


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: sample_share(-1, 8), "samples must be a non-negative integer, got -1"),
        (lambda: sample_share(3, 0), "window_samples must be positive"),
        (lambda: sample_share(9, 8), "a micro-batch of 9 samples cannot lie in a window of 8"),
        (lambda: sample_share(2.5, 8), "samples must be a non-negative integer, got 2.5"),
        (lambda: equal_share(0), "an update needs at least one micro-step"),
        (lambda: equal_share(2, "avg"), "reduction must be 'mean' or 'sum', got 'avg': 'mean' for a mean loss"),
        (lambda: reduction_name(None), "reduction must be 'mean' or 'sum', got None"),
        (lambda: short_window_factor(8, 0), "an update with no samples has no mean gradient"),
        (lambda: short_window_factor(8, 9), "the update held 9 samples, more than the 8 of its global batch"),
        (lambda: term_count(-2), r"weight must be an integer >= 0, got -2; the number of loss terms whose mean"),
        (lambda: term_count(2.5), r"weight must be an integer >= 0, got 2.5; .*int\(\(labels != -100\).sum\(\)\)"),
        (lambda: term_count(True), r"weight must be an integer >= 0, got True"),
        (lambda: mean_scale(0), r"this update's micro-batches hold 0 loss terms on every replica together, so it "
                                r"has no mean gradient"),
    ],
)
def test_impossible_windows_are_refused_by_name(call, message):
    with pytest.raises(ValueError, match=message):
        call()
