"""``CustomSampler`` and a trace optimizer with the model on the device (the data set on the CPU,
loaded as the guide's loop loads it): every step of a trace of four batch sizes is one update equal
to a real step on that step's whole batch, at the linear rule's LR for its size."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from gpu_case import exact, lrs_of_updates, mlp, regression, tolerance, twin
from torch.utils.data import DataLoader, TensorDataset

from aikit.elastic.Torch import CustomSampler, LinearRuleOptimizer

pytestmark = pytest.mark.cuda

TRACE, MICRO, REF, LR = [16, 32, 8, 24], 8, 16, 0.05


def sgd(params) -> torch.optim.SGD:
    return torch.optim.SGD(params, lr=LR, momentum=0.9, weight_decay=1e-3)


def test_a_trace_optimizer_on_the_device_makes_one_big_batch_step_per_trace_step(device):
    with exact(device) as dtype:
        x, y = regression(sum(TRACE), torch.device("cpu"), dtype)  # one epoch: the trace's four steps
        dataset = TensorDataset(x, y, torch.arange(len(x)))
        sampler = CustomSampler(dataset, TRACE, micro_batch=MICRO)  # replicas from the engine: one
        model = mlp(device, dtype)
        reference = twin(model)
        inner = sgd(model.parameters())
        lrs = lrs_of_updates(inner)
        optimizer = LinearRuleOptimizer(inner, sampler, ref_batch_size=REF)
        sampler.set_epoch(0)
        optimizer.set_epoch(0)
        steps, step = [], []
        for xb, yb, index in DataLoader(dataset, batch_sampler=sampler):
            F.mse_loss(model(xb.to(device)), yb.to(device)).backward()
            step.append(index)
            if optimizer.step():
                steps.append(torch.cat(step))
                step = []
        big = sgd(reference.parameters())
        for indices in steps:  # each step's whole batch at the linear rule's LR for it
            big.param_groups[0]["lr"] = LR * len(indices) / REF
            big.zero_grad()
            F.mse_loss(reference(x[indices].to(device)), y[indices].to(device)).backward()
            big.step()
    assert [len(indices) for indices in steps] == TRACE
    assert sorted(torch.cat(steps).tolist()) == list(range(sum(TRACE)))  # every sample once
    assert lrs == pytest.approx([LR * batch / REF for batch in TRACE], rel=1e-12)
    assert optimizer.updates == len(TRACE)
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want, **tolerance(dtype))
