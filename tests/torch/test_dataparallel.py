"""Seed 002's DataParallel recipe as written: one process, the loader yields every GA step's
batch for all devices (``batch_size * gpus``; DataParallel scatters it), and every update sees
exactly ``global_batch_size`` samples and equals a big-batch step.

Without GPUs DataParallel runs the module itself; with them it scatters the same batch and
gathers the outputs before the loss, so the gradient is the same. ``init`` plans only the
devices it finds, so these CPU tests give aikit's detection the machine's GPU count.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import aikit.elastic.Torch
from aikit.core.plan import micro_batch_slices
from aikit.ga.Torch.optim import Optimizer
from aikit.runtime.Torch import distributed

UPDATES = 3


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


def gpus_found(monkeypatch, count: int) -> None:
    """A one-process machine with ``count`` GPUs, as aikit's detection sees it."""
    monkeypatch.setattr(distributed, "device_count", lambda: count)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3)).double()


def dataset(size: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(size, 5, generator=gen, dtype=torch.float64),
                         torch.randint(0, 3, (size,), generator=gen))


def optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.01)


def big_batch_reference(ds: TensorDataset, global_batch: int) -> torch.nn.Module:
    net = model()
    opt = optimizer(net.parameters())
    for x, y in DataLoader(ds, batch_size=global_batch):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return net


def train(loader, weighted: bool) -> tuple[torch.nn.Module, list[int]]:
    """The seed's loop; returns the model and the samples each update saw."""
    net = model()
    opt = Optimizer(optimizer(net.parameters()), aikit.elastic.Torch.steps)
    parallel = torch.nn.DataParallel(net)
    per_update, seen = [], 0
    for x, y in loader:
        with opt.accumulate(parallel, samples=len(x) if weighted else None):
            torch.nn.functional.cross_entropy(parallel(x), y).backward()
        opt.step()
        seen += len(x)
        if opt.updated:
            per_update.append(seen)
            seen = 0
    return net, per_update


@pytest.mark.parametrize("gpus", [None, 2, 4])
def test_seed_recipe_loader_batch_is_batch_size_times_gpus(monkeypatch, gpus):
    gpus_found(monkeypatch, gpus or 1)
    plan = aikit.elastic.Torch.init(32, 8, gpus=gpus)
    assert plan.is_even
    ds = dataset(32 * UPDATES)
    loader = DataLoader(ds, batch_size=aikit.elastic.Torch.batch_size * aikit.elastic.Torch.gpus)
    net, per_update = train(loader, weighted=False)
    assert per_update == [32] * UPDATES
    for p, q in zip(net.parameters(), big_batch_reference(ds, 32).parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-9)


def test_ragged_plan_loader_yields_the_plans_step_batches(monkeypatch):
    """3 devices, G=32, at most 8 each: steps of [6, 6, 5] and [5, 5, 5] samples, i.e. the
    loader yields 17 then 15 per update (``plan.step_batch_sizes``)."""
    gpus_found(monkeypatch, 3)
    plan = aikit.elastic.Torch.init(32, 8, gpus=3)
    assert plan.step_batch_sizes == (17, 15)
    ds = dataset(32 * UPDATES)
    windows = [list(range(u * 32, (u + 1) * 32)) for u in range(UPDATES)]
    batches = [w[s] for w in windows for s in micro_batch_slices(plan)]
    net, per_update = train(DataLoader(ds, batch_sampler=batches), weighted=True)
    assert per_update == [32] * UPDATES
    for p, q in zip(net.parameters(), big_batch_reference(ds, 32).parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-9)
