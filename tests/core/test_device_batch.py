"""The candidates of an auto search and the search itself (aikit.core.device_batch): each candidate
a plan of the same global batch, the largest that fits found in few tries, the replicas' agreement."""

from __future__ import annotations

import pytest

from aikit.core.device_batch import agreed, device_batches, largest_fitting, smaller_plan
from aikit.core.plan import make_plan


def test_every_candidate_is_a_plan_of_the_global_batch_largest_first():
    sizes = device_batches(256, 2)
    assert sizes[:6] == [128, 64, 43, 32, 26, 22] and sizes[-1] == 1 and sizes == sorted(set(sizes), reverse=True)
    assert all(make_plan(256, s, 2).samples_per_update == 256 for s in sizes)


def test_a_smaller_plan_has_more_ga_steps_and_the_same_global_batch():
    plan = make_plan(48, 16, 1, policy="error")
    smaller = smaller_plan(plan)
    assert (smaller.global_batch_size, smaller.steps, smaller.device_batch) == (48, 4, 12)
    assert smaller_plan(make_plan(48, 1, 1)) is None


@pytest.mark.parametrize("largest", [0, 1, 5, 17, 30, 31])
def test_the_search_finds_the_largest_that_fits_in_few_tries(largest):
    sizes = list(range(32, 0, -1))  # index i holds 32 - i
    search = largest_fitting(sizes, lambda size: size <= sizes[largest])
    assert search.found == sizes[largest] and len(search.tries) <= 2 * 5 + 1
    assert largest_fitting(sizes, lambda size: False).found is None


def test_the_replicas_run_the_smallest_any_found():
    assert agreed([24, 16, 32]) == 16 and agreed([24, None]) is None
