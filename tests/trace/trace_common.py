"""Shared pieces of the trace tests: a tiny float64 data set, model and random trace, and the
single-process big-batch training every trace run must reproduce."""

import copy

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

MINIBATCH = 4


def dataset(size: int = 150) -> TensorDataset:
    """Inputs and a target; the target's second column is the sample's index, so a run can
    report exactly which samples it trained on."""
    rng = np.random.default_rng(7)
    x = torch.as_tensor(rng.normal(size=(size, 3)))
    y = torch.stack([x @ torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64), torch.arange(size).double()], 1)
    return TensorDataset(x, y)


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 1)).double()


def random_trace(seed: int, dataset_size: int, steps: int = 30) -> list[int]:
    """Global batches of 1..6 micro-batches: with 2 replicas, some steps leave one out."""
    rng = np.random.default_rng(seed)
    return (rng.integers(1, 7, size=steps) * MINIBATCH).tolist()


def big_batch_history(model: nn.Module, epochs: list, data: TensorDataset, base_lr: float, ref: int,
                      rule=lambda batch, ref: batch / ref, **sgd) -> list[list[torch.Tensor]]:
    """Parameters after every step of plain SGD on each step's whole global batch."""
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=base_lr, **sgd)
    x, y = data.tensors
    history = []
    for plan in epochs:
        for step in range(len(plan)):
            index = torch.as_tensor(plan.step_indices(step))
            for group in optimizer.param_groups:
                group["lr"] = base_lr * rule(len(index), ref)
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x[index]), y[index, :1]).backward()
            optimizer.step()
            history.append([p.detach().clone() for p in model.parameters()])
    return history
