"""DDP with GA on 2 real gloo processes (torchrun) equals one single-process big-batch step,
and all-reduces exactly once per update."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("ddp_worker.py")
spec = importlib.util.spec_from_file_location("ddp_worker", WORKER)
worker = importlib.util.module_from_spec(spec)
spec.loader.exec_module(worker)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ranks(torchrun, tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("ddp")
    torchrun(WORKER, out)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def big_batch_params(name: str) -> list[torch.Tensor]:
    global_batch, _, opt_name, _, reduction = worker.SCENARIOS[name]
    net = worker.make_model()
    opt = worker.make_optimizer(opt_name, net.parameters())
    for x, y in worker.make_data(global_batch):
        opt.zero_grad()
        worker.loss_fn(net, x, y, reduction).backward()
        opt.step()
    return [p.detach() for p in net.parameters()]


@pytest.mark.parametrize("name", list(worker.SCENARIOS))
def test_ddp_with_ga_on_two_ranks_equals_a_big_batch_step(ranks, name):
    expected = big_batch_params(name)
    for result in ranks:
        got = [torch.tensor(p, dtype=torch.float64) for p in result[name]["params"]]
        for p, q in zip(got, expected, strict=True):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-9)


def test_plan_is_split_over_both_ranks(ranks):
    assert [r["even"]["master"] for r in ranks] == [True, False]
    assert [r["even"]["gpus"] for r in ranks] == [2, 2]
    assert [r["ragged"]["local_sizes"] for r in ranks] == [[3, 3], [3, 2]]  # 11 samples, none lost
    assert sum(sum(r["ragged"]["local_sizes"]) for r in ranks) == 11
    assert [r["empty"]["local_sizes"] for r in ranks] == [[1, 1], [1, 0]]


@pytest.mark.parametrize("name", ["even", "ragged", "empty"])
def test_accumulate_all_reduces_exactly_once_per_update(ranks, name):
    for result in ranks:
        assert result[name]["allreduce_rounds"] == worker.UPDATES
        assert result[name]["bucket_calls"] == worker.UPDATES  # the tiny model is one bucket


def test_plain_recipe_is_exact_but_all_reduces_every_micro_step(ranks):
    """Why accumulate() exists: without no_sync DDP reduces after every backward."""
    plain = ranks[0]["plain"]
    assert plain["allreduce_rounds"] == worker.UPDATES * plain["steps"] == 6
