"""Two real replicas of an adaptive run, under torchrun (gloo) and under horovodrun: the ranks
choose the same batches from all-reduced numbers although each times its updates differently,
every update equals the single-process big-batch step across the plan changes, every sample of
an epoch is trained once, each update makes exactly one all-reduce, and the noise estimate built
from both replicas' micro-batch norms equals the one computed in one process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from adaptive_common import big_batch_history, dataset, make_model
from adaptive_worker import BASE, EPOCHS, MICRO

from aikit.core.gradient_noise import estimate
from aikit.core.schedule import Schedule
from aikit.core.trace import Trace

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module", params=["gloo", "horovod"])
def ranks(request, torchrun, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    if request.param == "gloo":
        torchrun(HERE / "adaptive_worker.py", out)
    else:
        request.getfixturevalue("horovodrun")(HERE / "adaptive_worker.py", out, "horovod")
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


def epochs(batches):
    data = dataset()
    schedule = Schedule(Trace(batches, "stop"), len(data), 1, MICRO, 5)
    return [schedule.epoch(e) for e in range(EPOCHS)]


def test_the_replicas_decide_the_same_batches_from_all_reduced_numbers(ranks):
    assert ranks[0]["changes"] and len(set(ranks[0]["batches"])) > 2
    assert ranks[0]["batches"] == ranks[1]["batches"]
    assert ranks[0]["changes"] == ranks[1]["changes"]


def test_every_update_equals_the_big_batch_step_across_plan_changes(ranks):
    plans = epochs(ranks[0]["batches"])
    steps = [(plan.step_indices(s), 0.02 * int(plan.batch_sizes[s]) / BASE) for plan in plans for s in range(len(plan))]
    expected = big_batch_history(make_model(seed=0), dataset(), steps)
    for rank in ranks:
        assert len(rank["history"]) == len(expected)
        for got, want in zip(rank["history"], expected, strict=True):
            for a, b in zip(got, want, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_every_sample_of_an_epoch_is_trained_once_and_each_update_all_reduces_once(ranks):
    for epoch in range(EPOCHS):
        seen = [i for rank in ranks for e, _, ids in rank["samples"] if e == epoch for i in ids]
        assert sorted(seen) == list(range(len(dataset())))
    for rank in ranks:
        # norms and times rode along with the gradients; the one more is the first set_epoch's
        # broadcast of rank 0's weights, an all-reduce that also carries the settings the replicas compare
        assert rank["reductions"] == len(rank["batches"]) + 1


def test_the_noise_estimate_uses_both_replicas_micro_batches(ranks):
    data, model = dataset(), make_model(seed=0)
    x, y = data.tensors
    params = [list(make_model(seed=0).parameters())] + ranks[0]["history"]
    for update in (0, 5, len(ranks[0]["batches"]) - 2):
        with torch.no_grad():
            for p, value in zip(model.parameters(), params[update], strict=True):
                p.copy_(value)
        parts = [ids for rank in ranks for _, u, ids in rank["samples"] if u == update]

        def grad(ids):
            model.zero_grad()
            index = torch.tensor(ids)
            torch.nn.functional.mse_loss(model(x[index]), y[index, :1]).backward()
            return torch.cat([p.grad.flatten() for p in model.parameters()])

        norms = [float(grad(ids).square().sum()) for ids in parts]
        mean = float(grad([i for ids in parts for i in ids]).square().sum())
        want = estimate(norms, [len(ids) for ids in parts], mean)
        for rank in ranks:
            grad_sq, trace = rank["noise"][update]
            assert grad_sq == pytest.approx(want.grad_sq, rel=1e-9, abs=1e-12)
            assert trace == pytest.approx(want.trace, rel=1e-9, abs=1e-12)
