"""The fixed-batch frontier and the cost of an update (aikit.core.frontier): what judges a batch schedule."""

import math

import numpy as np
import pytest

from aikit.core.errors import InvalidValue
from aikit.core.frontier import Frontier, UpdateCost, fit_frontier, fit_update_cost


def test_the_frontier_through_exact_runs_is_found_and_they_sit_on_it():
    truth = Frontier(min_updates=200.0, min_samples=60_000.0)  # B_crit = 300
    batches = [32, 64, 128, 256, 512]
    frontier = fit_frontier(batches, [truth.updates(b) for b in batches])
    assert frontier.min_updates == pytest.approx(200.0) and frontier.min_samples == pytest.approx(60_000.0)
    assert frontier.critical_batch == pytest.approx(300.0)
    for b in (48, 300, 1000):  # any fixed batch on the frontier sits at an excess of 1
        assert frontier.excess(truth.updates(b), b * truth.updates(b)) == pytest.approx(1.0)


def test_a_run_beating_every_fixed_batch_sits_below_one_and_an_unreached_one_at_inf():
    frontier = Frontier(200.0, 60_000.0)
    fixed_300 = (frontier.updates(300), 300 * frontier.updates(300))
    assert frontier.excess(0.9 * fixed_300[0], 0.9 * fixed_300[1]) < 1
    assert frontier.excess(1.1 * fixed_300[0], fixed_300[1]) > 1
    assert frontier.excess(math.inf, math.inf) == math.inf


def test_the_time_optimal_fixed_batch_is_where_the_frontier_costs_least():
    frontier, cost = Frontier(200.0, 60_000.0), UpdateCost(per_update=4.5e-3, per_sample=13.6e-6)
    batches = np.arange(8, 4000)
    times = [cost.per_update * frontier.updates(b) + cost.per_sample * b * frontier.updates(b) for b in batches]
    assert frontier.best_batch(cost) == pytest.approx(batches[int(np.argmin(times))], abs=1)
    assert frontier.best_batch(cost) == pytest.approx(math.sqrt(4.5e-3 * 300 / 13.6e-6))


def test_an_update_cost_is_fitted_from_two_sizes_and_one_size_is_refused():
    cost = UpdateCost(per_update=2e-3, per_sample=1e-5)
    rng = np.random.default_rng(0)
    batches = [32] * 5 + [128] * 5
    seconds = [cost.seconds(b) * (1 + 0.01 * rng.standard_normal()) for b in batches]
    fitted = fit_update_cost(batches, seconds)
    assert fitted.per_update == pytest.approx(2e-3, rel=0.05) and fitted.per_sample == pytest.approx(1e-5, rel=0.05)
    with pytest.raises(InvalidValue, match=r"one batch size only \(64\).*two or more batch sizes"):
        fit_update_cost([64, 64, 64], [0.01, 0.011, 0.012])
    with pytest.raises(InvalidValue, match="2 batches and 3 times"):
        fit_update_cost([32, 64], [0.1, 0.2, 0.3])


def test_a_fixed_cost_up_to_saturation_charges_only_what_lies_above_it():
    accelerator = UpdateCost(per_update=1.0, per_sample=0.01, saturation=512)
    assert accelerator.seconds(256) == accelerator.seconds(512) == 1.0
    assert accelerator.seconds([512, 1024]) == pytest.approx(1.0 + 1.0 + 0.01 * 512)
    with pytest.raises(InvalidValue, match="affine cost"):
        Frontier(200.0, 60_000.0).best_batch(accelerator)


def test_runs_the_model_cannot_describe_are_refused_by_name():
    with pytest.raises(InvalidValue, match=r"two or more batch sizes that reached the target, got 1 of 3"):
        fit_frontier([32, 64, 128], [900.0, math.inf, math.inf])
    with pytest.raises(InvalidValue, match="off McCandlish's model"):
        fit_frontier([32, 64, 128], [100.0, 200.0, 400.0])  # more updates at larger batches
    with pytest.raises(InvalidValue, match="cannot cost nothing"):
        UpdateCost(0.0, 0.0)
