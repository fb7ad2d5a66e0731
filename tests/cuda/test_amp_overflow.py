"""fp16 autocast with a ``GradScaler`` and a forced overflow (a micro-batch's loss times inf): the
update the scaler skips changes no weight, lowers the scale once, and advances nothing that counts
updates (the wrapped optimizer's step count, ``applied``, an ``UpdateScheduler``'s LR); the next
update trains as usual. For the GA wrapper over AdamW and fused AdamW, and for a trace optimizer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from gpu_case import mlp, regression

from aikit.elastic.Torch import CustomSampler, LinearRuleOptimizer
from aikit.ga.Torch.optim import Optimizer, UpdateScheduler

pytestmark = pytest.mark.cuda

SCALE = 2.0**10


def inner_steps(inner: torch.optim.Optimizer) -> set[int]:
    """The wrapped optimizer's step count (AdamW keeps one per parameter)."""
    return {int(state["step"]) for state in inner.state.values()}


def snapshot(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def micro_step(model, scaler, x, y, device, overflow=False) -> None:
    with torch.autocast(device.type, torch.float16):
        loss = F.mse_loss(model(x), y)
    if overflow:
        loss = loss * float("inf")  # every gradient inf or NaN: the scaler must skip the update
    scaler.scale(loss).backward()


@pytest.mark.parametrize("fused", [False, True], ids=["AdamW", "fused AdamW"])
def test_an_update_amp_skips_changes_no_weight_and_advances_no_count(device, fused):
    model = mlp(device)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, fused=fused)
    scaler = torch.amp.GradScaler(device.type, init_scale=SCALE)
    optimizer = Optimizer(inner, 2, scaler=scaler)
    scheduler = UpdateScheduler(torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5))
    x, y = regression(48, device)

    def update(first: int, overflow: bool = False) -> None:
        for i in (first, first + 1):
            micro_step(model, scaler, x[8 * i:8 * i + 8], y[8 * i:8 * i + 8], device, overflow and i == first + 1)
            optimizer.step()
            scheduler.step()

    update(0)
    assert optimizer.updated and inner_steps(inner) == {1}
    weights, lr = snapshot(model), inner.param_groups[0]["lr"]
    update(2, overflow=True)
    assert not optimizer.updated
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), weights, strict=True))  # no weight moved
    assert inner_steps(inner) == {1}  # AdamW's step count (its bias correction) did not advance
    assert optimizer.applied == 1 and scheduler.last_epoch == 1 and inner.param_groups[0]["lr"] == lr
    assert scaler.get_scale() == SCALE / 2  # the skip counted once
    assert optimizer.micro_step == 0 and all(p.grad is None for p in model.parameters())  # the window is spent
    update(4)  # and training goes on
    assert optimizer.updated and inner_steps(inner) == {2} and optimizer.applied == 2
    assert scheduler.last_epoch == 2 and inner.param_groups[0]["lr"] == lr / 2
    assert not any(torch.equal(a, b) for a, b in zip(model.parameters(), weights, strict=True))


def trace_run(device: torch.device):
    """A LinearRuleOptimizer under AMP through a trace of three steps of 16 (two micro-batches of
    8), the second step's last micro-batch overflowing; returns what each step left."""
    model = mlp(device)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler(device.type, init_scale=SCALE)
    sampler = CustomSampler(48, [16, 16, 16], micro_batch=8)  # one epoch of three steps
    optimizer = LinearRuleOptimizer(inner, sampler, ref_batch_size=16, scaler=scaler)
    scheduler = UpdateScheduler(torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5))
    x, y = regression(48, device)
    sampler.set_epoch(0)
    optimizer.set_epoch(0)
    after = []
    for index, indices in enumerate(sampler):
        micro_step(model, scaler, x[indices], y[indices], device, overflow=index == 3)
        if optimizer.step():
            scheduler.step()
            after.append({"updated": optimizer.updated, "weights": snapshot(model), "steps": inner_steps(inner),
                          "applied": optimizer.applied, "scheduled": scheduler.last_epoch,
                          "lr": inner.param_groups[0]["lr"], "scale": scaler.get_scale(),
                          "step": optimizer.step_index, "updates": optimizer.updates})
    return after


def test_a_trace_optimizer_update_amp_skips_changes_no_weight_and_advances_no_count(device):
    first, skipped, last = trace_run(device)
    assert [first["updated"], skipped["updated"], last["updated"]] == [True, False, True]
    assert all(torch.equal(a, b) for a, b in zip(skipped["weights"], first["weights"], strict=True))
    assert skipped["steps"] == first["steps"] == {1} and last["steps"] == {2}
    assert (skipped["applied"], skipped["scheduled"], skipped["lr"]) == (1, 1, first["lr"])
    assert skipped["scale"] == SCALE / 2
    assert (last["applied"], last["scheduled"]) == (2, 2)
    # the trace goes on: the skipped step's samples were trained on (and lost), as the GA
    # wrapper's window is; the next micro-batch belongs to the next step
    assert [first["step"], skipped["step"], last["step"]] == [1, 2, 3]


def test_a_trace_optimizer_update_amp_skips_does_not_advance_its_warmup_clock(device):
    """``updates`` counts the updates applied (warmup reads it), as UpdateScheduler and the wrapped
    optimizer's step count do (it counted AMP's skips too, before issue 40)."""
    first, skipped, last = trace_run(device)
    assert skipped["updates"] == first["updates"] == 1 and last["updates"] == 2
