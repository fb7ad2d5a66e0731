"""The two runs of issue 12 on two real replicas (torchrun + gloo): a trace whose first step
leaves a replica idle restores from an empty directory without a hang, and a run resumed where a
replica is idle ends at the same bits as the uninterrupted run, whatever order the objects are
given to ElasticState. Both end at single-process big-batch SGD's weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from order_worker import IDLE_STEPS, MINIBATCH, REF, START_SMALL, N, data, net

from aikit.core.schedule import Schedule
from aikit.core.trace import Trace

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def ranks(torchrun, tmp_path_factory):
    out = tmp_path_factory.mktemp("order")
    torchrun(HERE / "order_worker.py", out, timeout=180)
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


def big_batch(trace: list[int], halve_every: int | None = None) -> list[torch.Tensor]:
    """Plain SGD, one step per global batch on all its samples, at the linear rule's LR (halved
    every ``halve_every`` updates: a StepLR). The samples come from a 1-replica schedule: only
    which samples form each step is taken from it."""
    x, y = data()
    model = net(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    epoch = Schedule(Trace(trace, "cycle"), N, 1, MINIBATCH, seed=1).epoch(0)
    for step in range(len(epoch)):
        index = torch.as_tensor(epoch.step_indices(step))
        decay = 0.5 ** (step // halve_every) if halve_every else 1.0
        opt.param_groups[0]["lr"] = 0.1 * decay * len(index) / REF
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[index]), y[index]).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


def test_a_first_step_with_an_idle_replica_restores_and_trains_the_big_batch_steps_at_the_schedules_lr(ranks):
    for rank in ranks:
        for got, want in zip(rank["start_small"], big_batch(START_SMALL, halve_every=2), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


def test_resuming_at_any_commit_in_any_object_order_is_bit_equal_to_the_uninterrupted_run(ranks):
    resumed = [key for key in ranks[0] if key.startswith("resume_")]
    assert len(resumed) == (len(IDLE_STEPS) - 1) * 6
    for rank in ranks:
        for got, want in zip(rank["uninterrupted"], big_batch(IDLE_STEPS), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
        for key in resumed:
            for got, want in zip(rank[key], rank["uninterrupted"], strict=True):
                assert torch.equal(got, want), f"{key}: differs by {float((got - want).abs().max())}"
    for key in ["uninterrupted", *resumed]:  # the replicas agree
        assert all(torch.equal(a, b) for a, b in zip(ranks[0][key], ranks[1][key], strict=True)), key
