"""2 Horovod ranks x GA equal one process taking big-batch steps (float64), short windows included."""

from __future__ import annotations

import pytest
import torch
from hvd_case import (  # the checks both engines must pass, written once
    CASES,
    test_a_nan_gradient_on_one_rank_skips_the_update_on_every_rank,  # noqa: F401
    test_a_second_backward_after_the_buckets_started_is_summed_and_said,  # noqa: F401
    test_buckets_start_their_all_reduce_during_the_last_backward,  # noqa: F401
    test_the_overlapped_all_reduce_gives_the_bits_of_one_all_reduce_after_the_backward,  # noqa: F401
    test_the_wrapped_optimizer_steps_once_per_window,  # noqa: F401
    test_two_ranks_with_ga_equal_the_big_batch_step,  # noqa: F401
)

from aikit.core.plan import make_plan

pytestmark = [pytest.mark.horovod, pytest.mark.slow]


@pytest.fixture(scope="module")
def ranks(horovodrun, tmp_path_factory):
    out = tmp_path_factory.mktemp("hvd_ga")
    horovodrun("tests/horovod/ga_worker.py", out)
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_init_takes_the_world_from_horovod(ranks, case):
    plan = make_plan(case.G, case.M, 2)
    for rank, result in enumerate(ranks):
        assert result[case.name]["plan"] == {
            "steps": plan.steps,
            "batch_size": plan.batch_size,
            "global_batch_size": case.G,
            "gpus": 2,
            "master": rank == 0,
        }
