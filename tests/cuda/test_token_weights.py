"""Token counts given as tensors on the device (``accumulate(model, weight=(labels != -100).sum())``):
the update is the big batch's mean over every token, and on CUDA nothing waits for the GPU before
the update (``torch.cuda.set_sync_debug_mode("error")`` around every micro-step), and at it (the
syncs of each update counted, with AdamW and clipping) one read: whether the gradient is finite,
read from the total norm clipping computes (an inf/NaN update is skipped, issue 40), and none
with ``skip_nonfinite=False``."""

from __future__ import annotations

import pytest
import torch
from gpu_case import (
    big_batch_run,
    counted_host_syncs,
    exact,
    first_update_gradient,
    gradient_tolerance,
    no_host_sync,
    relative_error,
    token_batches,
    token_loss,
    token_model,
    tokens,
    tolerance,
    twin,
)

from aikit.ga.Torch.optim import Optimizer

pytestmark = pytest.mark.cuda

UPDATES = 3


def run(device: torch.device, dtype: torch.dtype, count_syncs: bool, skip_nonfinite: bool = True):
    """Three updates of 4 micro-batches weighed by their token counts (tensors on ``device``),
    against the big batch; returns the two models, the first update's two gradients and, with
    ``count_syncs``, the host syncs of each update."""
    updates = [token_batches(device, dtype, seed=seed) for seed in range(UPDATES)]
    counts = [[tokens(labels) for _, labels in batches] for batches in updates]  # on the device, made before
    model = token_model(device, dtype)
    reference = twin(model)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    first = first_update_gradient(inner)
    optimizer = Optimizer(inner, 4, max_grad_norm=1.0, skip_nonfinite=skip_nonfinite)
    syncs = []
    if device.type == "cuda":
        torch.cuda.synchronize()  # the data on the device before the first micro-step
    for batches, weights in zip(updates, counts, strict=True):
        for index, ((x, labels), weight) in enumerate(zip(batches, weights, strict=True)):
            with no_host_sync(device):  # raises at the first operation that waits for the GPU
                with optimizer.accumulate(model, weight=weight):
                    token_loss(model(x), labels).backward()
                if index < len(batches) - 1:
                    optimizer.step()
            if index == len(batches) - 1:
                if count_syncs:
                    with counted_host_syncs() as found:
                        optimizer.step()
                    syncs.append(found)
                else:
                    optimizer.step()
        assert optimizer.updated
    expected = big_batch_run(reference, torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.1),
                             updates, token_loss, max_grad_norm=1.0)
    return model, reference, first, expected, syncs


def assert_big_batch(dtype, model, reference, first, expected) -> None:
    assert relative_error(first, expected) < gradient_tolerance(dtype)
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want, **tolerance(dtype))


def test_token_weights_as_device_tensors_give_the_mean_over_every_token(device):
    with exact(device) as dtype:
        *result, _ = run(device, dtype, count_syncs=False)
    assert_big_batch(dtype, *result)


@pytest.mark.parametrize("skip_nonfinite", [True, False], ids=["finiteness read", "skip_nonfinite=False"])
def test_token_weights_on_cuda_make_no_host_sync_before_the_update_and_one_read_at_it(cuda_device, skip_nonfinite):
    with exact(cuda_device) as dtype:
        *result, syncs = run(cuda_device, dtype, count_syncs=True, skip_nonfinite=skip_nonfinite)
    print(f"host syncs at each update: {[len(found) for found in syncs]}")
    if skip_nonfinite:  # the one read: the total norm's, in aikit.runtime.Torch.grads.read_norm
        assert all(len(found) == 1 and "aikit/runtime/Torch/grads.py:" in found[0] for found in syncs), (
            f"host syncs at the updates (file:line): {syncs}")
    else:
        assert syncs == [[]] * UPDATES, f"host syncs at the updates (file:line): {syncs}"
    assert_big_batch(dtype, *result)
