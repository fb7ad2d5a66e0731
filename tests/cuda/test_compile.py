"""A ``torch.compile``d model under GA: token weights applied at the compiled module's outputs
(aikit's forward hook runs around the compiled forward) give the eager big batch's update."""

from __future__ import annotations

import pytest
import torch
from gpu_case import (
    big_batch_run,
    exact,
    first_update_gradient,
    gradient_tolerance,
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


def test_a_compiled_model_under_ga_equals_the_eager_big_batch(device):
    torch.compiler.reset()  # this test compiles from nothing, whatever ran before
    with exact(device) as dtype:
        updates = [token_batches(device, dtype, seed=seed) for seed in range(2)]  # one shape: one compile
        model = token_model(device, dtype)
        reference = twin(model)
        compiled = torch.compile(model)
        inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
        first = first_update_gradient(inner)
        optimizer = Optimizer(inner, 4)
        for batches in updates:
            for x, labels in batches:
                with optimizer.accumulate(compiled, weight=tokens(labels)):
                    token_loss(compiled(x), labels).backward()
                optimizer.step()
            assert optimizer.updated
        expected = big_batch_run(reference, torch.optim.AdamW(reference.parameters(), lr=1e-2), updates, token_loss)
    assert relative_error(first, expected) < gradient_tolerance(dtype)
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want, **tolerance(dtype))
