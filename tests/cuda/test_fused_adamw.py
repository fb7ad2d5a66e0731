"""Fused AdamW (``AdamW(fused=True)``, one kernel per update) under the GA wrapper, with clipping,
equals fused AdamW on the clipped big batch, with and without a ``GradScaler`` (whose fused path hands
the optimizer the inf flag; the wrapper unscales before it clips), and its step count advances once
per update."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from gpu_case import exact, mlp, no_host_sync, regression, tolerance, twin

from aikit.core.errors import NonFiniteGradientWarning
from aikit.ga.Torch.optim import Optimizer

pytestmark = pytest.mark.cuda

STEPS, MICRO, UPDATES, CLIP = 4, 8, 3, 0.5


def fused_adamw(params) -> torch.optim.AdamW:
    # eps near the gradients' size: a gradient left scaled (AMP) or weighed wrong changes the update
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, eps=1e-2, fused=True)


@pytest.mark.parametrize("scaled", [False, True], ids=["fused AdamW", "fused AdamW + GradScaler"])
def test_fused_adamw_under_ga_equals_fused_adamw_on_the_big_batch(device, scaled):
    with exact(device) as dtype:
        x, y = regression(STEPS * MICRO * UPDATES, device, dtype)
        updates = [[(x[i:i + MICRO], y[i:i + MICRO]) for i in range(start, start + STEPS * MICRO, MICRO)]
                   for start in range(0, len(x), STEPS * MICRO)]
        model = mlp(device, dtype)
        reference = twin(model)
        inner = fused_adamw(model.parameters())
        scaler = torch.amp.GradScaler(device.type, init_scale=2.0**12) if scaled else None
        optimizer = Optimizer(inner, STEPS, scaler=scaler, max_grad_norm=CLIP)
        for micro_batches in updates:
            for xb, yb in micro_batches:
                loss = F.mse_loss(model(xb), yb)
                (scaler.scale(loss) if scaled else loss).backward()
                optimizer.step()
            assert optimizer.updated
        big = fused_adamw(reference.parameters())
        for micro_batches in updates:
            big.zero_grad()
            F.mse_loss(reference(torch.cat([xb for xb, _ in micro_batches])),
                       torch.cat([yb for _, yb in micro_batches])).backward()
            assert torch.nn.utils.clip_grad_norm_(reference.parameters(), CLIP) > CLIP  # clipping matters
            big.step()
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want, **tolerance(dtype))
    assert {int(state["step"]) for state in inner.state.values()} == {UPDATES}
    if scaled:
        assert scaler.get_scale() == 2.0**12  # no overflow, no skip


def test_fused_adamw_without_clipping_skips_a_nan_update_in_its_kernel_and_waits_for_nothing(device):
    """No GradScaler, no clipping (float32): aikit's finiteness flag, made in the pass that applies
    the GA mean, goes to the fused kernel, so after the first update (which makes the state) no
    update waits for the GPU, a NaN one included; its skip is read when asked, and the updates
    applied equal fused AdamW on the big batches that were not NaN."""
    x, y = regression(STEPS * MICRO * UPDATES, device, torch.float32)
    updates = [[(x[i:i + MICRO], y[i:i + MICRO]) for i in range(start, start + STEPS * MICRO, MICRO)]
               for start in range(0, len(x), STEPS * MICRO)]
    model = mlp(device, torch.float32)
    reference = twin(model)
    inner = fused_adamw(model.parameters())
    optimizer = Optimizer(inner, STEPS)
    poisoned = 1  # the second update's gradient is NaN
    for update, micro_batches in enumerate(updates):
        with no_host_sync(device) if update else contextlib.nullcontext():
            for step, (xb, yb) in enumerate(micro_batches):
                nan = update == poisoned and step == STEPS - 1
                (F.mse_loss(model(xb), yb) * (torch.nan if nan else 1.0)).backward()
                optimizer.step()
    with pytest.warns(NonFiniteGradientWarning, match="found on the device"):
        assert optimizer.skipped == 1 and optimizer.applied == UPDATES - 1
    big = fused_adamw(reference.parameters())
    for update, micro_batches in enumerate(updates):
        if update != poisoned:
            big.zero_grad()
            F.mse_loss(reference(torch.cat([xb for xb, _ in micro_batches])),
                       torch.cat([yb for _, yb in micro_batches])).backward()
            big.step()
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want, **tolerance(torch.float32))
    assert {int(state["step"]) for state in inner.state.values()} == {UPDATES - 1}
