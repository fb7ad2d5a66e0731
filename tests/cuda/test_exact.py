"""GA is a real big-batch step on the device: the update's gradient and the weights after three
updates equal one step per update on the concatenated batch (float64 on the CPU; float32 with
TF32 off on CUDA), for the seed's recipe and for ragged micro-batches; bf16 autocast micro-batches
accumulate in float32, within bf16's precision of the float32 big batch."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from gpu_case import (
    big_batch_run,
    exact,
    first_update_gradient,
    gradient_tolerance,
    mlp,
    regression,
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

SIZES = {"step()": [8, 8, 8, 8], "accumulate(samples=)": [9, 8, 8, 7]}
OPTIMIZERS = {
    "SGD": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-2),
    "AdamW": lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1),
}
UPDATES = 3


def windows(x: torch.Tensor, y: torch.Tensor, sizes: list[int]) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """``UPDATES`` updates of micro-batches of ``sizes`` samples, in order."""
    bounds = torch.tensor([0, *sizes] * UPDATES).cumsum(0).tolist()
    pieces = [(x[a:b], y[a:b]) for a, b in itertools.pairwise(bounds) if b > a]
    return [pieces[i:i + len(sizes)] for i in range(0, len(pieces), len(sizes))]


@pytest.mark.parametrize("name", OPTIMIZERS)
@pytest.mark.parametrize("recipe", SIZES)
def test_ga_equals_a_real_big_batch_step(device, recipe, name):
    sizes = SIZES[recipe]
    with exact(device) as dtype:
        updates = windows(*regression(UPDATES * sum(sizes), device, dtype), sizes)
        model = mlp(device, dtype)
        reference = twin(model)
        inner = OPTIMIZERS[name](model.parameters())
        first = first_update_gradient(inner)
        optimizer = Optimizer(inner, len(sizes), global_batch_size=sum(sizes))
        for micro_batches in updates:
            for x, y in micro_batches:
                if recipe == "step()":  # the seed's recipe: backward and step() on every micro-batch
                    F.mse_loss(model(x), y).backward()
                else:
                    with optimizer.accumulate(model, samples=len(x)):
                        F.mse_loss(model(x), y).backward()
                optimizer.step()
            assert optimizer.updated
        expected = big_batch_run(reference, OPTIMIZERS[name](reference.parameters()), updates, F.mse_loss)
    assert relative_error(first, expected) < gradient_tolerance(dtype)
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want, **tolerance(dtype))
    assert optimizer.applied == UPDATES
    assert all(int(state.get("step", UPDATES)) == UPDATES for state in inner.state.values())  # once per update


def test_bf16_micro_batches_accumulate_in_float32_within_bf16_precision(device):
    batches = token_batches(device)
    with exact(device):  # the float32 reference without TF32
        model = token_model(device)
        reference, probe = twin(model), twin(model)
        inner = torch.optim.SGD(model.parameters(), lr=0.1)
        first = first_update_gradient(inner)
        optimizer = Optimizer(inner, len(batches))
        for x, labels in batches:
            with optimizer.accumulate(model, weight=tokens(labels)):
                with torch.autocast(device.type, torch.bfloat16):
                    logits = model(x)
                assert logits.dtype == torch.bfloat16
                token_loss(logits, labels).backward()
            optimizer.step()
        expected = big_batch_run(reference, torch.optim.SGD(reference.parameters(), lr=0.1), [batches], token_loss)
        for x, labels in batches:  # what the tolerance rules out: the mean of the micro-batch means
            (token_loss(probe(x), labels) / len(batches)).backward()
    assert optimizer.updated and {g.dtype for g in first} == {torch.float32}  # accumulated in float32
    assert relative_error(first, expected) < 1e-2
    assert relative_error([p.grad for p in probe.parameters()], expected) > 0.1
