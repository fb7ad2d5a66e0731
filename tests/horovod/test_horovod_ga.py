"""2 Horovod ranks x GA equal one process taking big-batch steps (float64), short windows included."""

from __future__ import annotations

import pytest
import torch
from hvd_case import CASES, reference

from aikit.core.plan import make_plan

pytestmark = [pytest.mark.horovod, pytest.mark.slow]


@pytest.fixture(scope="module")
def ranks(horovodrun, tmp_path_factory):
    out = tmp_path_factory.mktemp("hvd_ga")
    horovodrun("tests/horovod/ga_worker.py", out)
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_two_ranks_with_ga_equal_the_big_batch_step(ranks, case):
    expected = reference(case)
    for rank in ranks:
        for got, want in zip(rank[case.name]["params"], expected, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


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


def test_the_wrapped_optimizer_steps_once_per_window(ranks):
    case = next(c for c in CASES if c.optimizer == "adamw")
    assert [r[case.name]["inner_steps"] for r in ranks] == [len(case.windows)] * 2
