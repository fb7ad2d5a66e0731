"""aikit.core.gradient_noise: unbiased |G|² and tr(Σ) from part norms, AdaScale's gain, smoothing.

Unbiasedness is proven exactly on tiny populations (every possible draw enumerated), and checked
against a least-squares problem whose |G|² and tr(Σ) are known in closed form."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aikit.core.gradient_noise import NoiseEstimate, NoiseTracker, efficiency, estimate, gain


def estimate_from_parts(grads: np.ndarray, sizes: list[int]) -> NoiseEstimate:
    """The estimator fed as an adapter feeds it: each part's mean gradient, the weighted mean."""
    bounds = np.cumsum([0, *sizes])
    means = [grads[a:b].mean(axis=0) if b > a else np.zeros(grads.shape[1]) for a, b in itertools.pairwise(bounds)]
    total = grads[: bounds[-1]].mean(axis=0)
    return estimate([float(m @ m) for m in means], sizes, float(total @ total))


@settings(max_examples=40, deadline=None)
@given(
    population=st.lists(st.lists(st.integers(-3, 3), min_size=2, max_size=2), min_size=2, max_size=3),
    sizes=st.lists(st.integers(0, 2), min_size=2, max_size=3).filter(lambda s: sum(x > 0 for x in s) >= 2),
)
def test_the_estimates_are_exactly_unbiased_over_every_possible_draw(population, sizes):
    """Draw sum(sizes) per-sample gradients i.i.d. (uniformly, with replacement) from a finite
    population: averaged over all equally likely draws, the estimates equal the population's
    |G|² and tr(Σ) — exactly, ragged and empty parts included."""
    pop = np.array(population, dtype=float)
    mean = pop.mean(axis=0)
    true_grad_sq, true_trace = float(mean @ mean), float(((pop - mean) ** 2).sum(axis=1).mean())
    draws = list(itertools.product(range(len(pop)), repeat=sum(sizes)))
    results = [estimate_from_parts(pop[list(draw)], sizes) for draw in draws]
    assert np.mean([r.grad_sq for r in results]) == pytest.approx(true_grad_sq, abs=1e-9)
    assert np.mean([r.trace for r in results]) == pytest.approx(true_trace, abs=1e-9)


def test_least_squares_with_a_known_covariance():
    """Per-sample loss ½(x·w - y)² with x ~ N(0, I_d), y = x·w* + ε, ε ~ N(0, s²): at w, with
    δ = w - w*, G = δ and tr(Σ) = (d + 1)|δ|² + d s² in closed form."""
    rng = np.random.default_rng(0)
    d, s, parts, b = 5, 0.7, 4, 16
    w_star, w = rng.normal(size=d), rng.normal(size=d)
    delta = w - w_star
    true_grad_sq, true_trace = float(delta @ delta), float((d + 1) * delta @ delta + d * s * s)
    trials = 4000
    x = rng.normal(size=(trials, parts * b, d))
    y = x @ w_star + s * rng.normal(size=(trials, parts * b))
    grads = x * (x @ w - y)[..., None]  # per-sample gradients
    found = [estimate_from_parts(g, [b] * parts) for g in grads]
    grad_sq, trace = np.array([f.grad_sq for f in found]), np.array([f.trace for f in found])
    # within 4 standard errors of the truth
    assert abs(grad_sq.mean() - true_grad_sq) < 4 * grad_sq.std() / math.sqrt(trials)
    assert abs(trace.mean() - true_trace) < 4 * trace.std() / math.sqrt(trials)
    # and a brute-force estimate from many large batches agrees: E|ḡ_B|² = |G|² + tr(Σ)/B
    big = grads.mean(axis=1)
    assert np.mean((big**2).sum(axis=1)) == pytest.approx(true_grad_sq + true_trace / (parts * b), rel=0.03)


def test_no_noise_means_no_trace():
    same = [4.0, 4.0, 4.0]
    found = estimate(same, [3, 5, 8], 4.0)
    assert found.trace == pytest.approx(0) and found.grad_sq == pytest.approx(4.0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (([1.0], [4], 1.0), "at least two parts with samples, got 1"),
        (([1.0, 2.0], [4, 0], 1.0), "at least two parts with samples, got 1"),
        (([1.0, 2.0], [4], 1.0), "part_sq_norms has 2 entries but part_samples has 1"),
        (([1.0, -2.0], [4, 4], 1.0), r"part_sq_norms\[1\] must be a finite squared norm"),
        (([1.0, math.nan], [4, 4], 1.0), r"part_sq_norms\[1\] must be a finite squared norm"),
        (([1.0, 2.0], [4, 2.5], 1.0), r"part_samples\[1\] must be a non-negative integer, got 2.5"),
        (([1.0, 2.0], [4, True], 1.0), r"part_samples\[1\] must be a non-negative integer, got True"),
        (([1.0, 2.0], [4, 4], math.inf), "mean_sq_norm must be a finite squared norm"),
    ],
)
def test_bad_parts_are_refused_by_name(args, message):
    with pytest.raises(ValueError, match=message):
        estimate(*args)


@given(
    trace=st.floats(0, 1e6), grad_sq=st.floats(1e-9, 1e6), base=st.integers(1, 1024), factor=st.integers(1, 64)
)
def test_the_gain_lies_between_one_and_the_scale(trace, grad_sq, base, factor):
    r = gain(trace, grad_sq, base * factor, base)
    assert 1 - 1e-12 <= r <= factor * (1 + 1e-12)
    assert efficiency(trace, grad_sq, base * factor, base) == pytest.approx(r / factor)


def test_the_gain_at_its_limits():
    assert gain(0.0, 2.0, 512, 32) == 1.0  # no noise: a bigger batch is worth one step
    assert gain(5.0, 0.0, 512, 32) == 16.0  # pure noise: worth the scale
    assert gain(-1.0, -1.0, 512, 32) == 1.0  # nothing measured
    assert gain(64.0, 1.0, 64, 32) == pytest.approx((2 + 1) / (1 + 1))
    with pytest.raises(ValueError, match="batch"):
        gain(1.0, 1.0, 0, 32)


def test_the_tracker_is_bias_corrected_and_resumes_exactly():
    tracker = NoiseTracker(decay=0.9)
    first = tracker.update(NoiseEstimate(grad_sq=2.0, trace=8.0))
    assert (first.grad_sq, first.trace) == pytest.approx((2.0, 8.0))  # not pulled towards zero
    tracker.update(NoiseEstimate(grad_sq=4.0, trace=0.0))
    saved = tracker.state_dict()
    again = NoiseTracker(decay=0.5)
    again.load_state_dict(saved)
    assert again.smoothed == tracker.smoothed
    nxt = NoiseEstimate(grad_sq=1.0, trace=1.0)
    assert again.update(nxt) == tracker.update(nxt)
    # the average of a constant is that constant at every step
    steady = NoiseTracker(0.99)
    for _ in range(5):
        assert steady.update(NoiseEstimate(3.0, 6.0)).noise_scale == pytest.approx(2.0)


def test_tracker_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"decay must be a number in \[0, 1\), got 1"):
        NoiseTracker(decay=1)
    with pytest.raises(ValueError, match="call update"):
        NoiseTracker().smoothed  # noqa: B018
    tracker = NoiseTracker()
    with pytest.raises(ValueError, match="not a NoiseTracker state"):
        tracker.load_state_dict({"decay": 0.5})
    with pytest.raises(ValueError):
        tracker.load_state_dict({"decay": 0.5, "updates": "x", "grad_sq": 1.0, "trace": 1.0})
    assert (tracker.decay, tracker.updates) == (0.95, 0)  # a failed load changed nothing
