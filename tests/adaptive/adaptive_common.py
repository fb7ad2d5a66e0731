"""Shared pieces of the adaptive-batch tests: a float64 least-squares data set whose targets
carry each sample's index, a deterministic clock, and the training loop every test runs."""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from aikit.elastic.Torch import AdaptiveOptimizer, AdaptiveSampler


def dataset(size: int = 256, features: int = 3, noise: float = 1.0) -> TensorDataset:
    """``y = x·w + noise``; the target's second column is the sample's index."""
    rng = np.random.default_rng(11)
    x = torch.as_tensor(rng.normal(size=(size, features)))
    y = x @ torch.linspace(1.0, -1.0, features, dtype=torch.float64) + noise * torch.as_tensor(rng.normal(size=size))
    return TensorDataset(x, torch.stack([y, torch.arange(size).double()], 1))


def make_model(seed: int = 0, features: int = 3) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(features, 4), nn.Tanh(), nn.Linear(4, 1)).double()


class Clock:
    """Seconds as the training loop says they pass: ``per_sample`` for every sample a micro-step
    trains, ``per_update`` for every update. A larger batch amortises the per-update cost, so
    the controller grows the batch on a schedule the test can repeat exactly."""

    def __init__(self, per_sample: float = 1e-4, per_update: float = 0.05) -> None:
        self.now, self.per_sample, self.per_update = 0.0, per_sample, per_update

    def __call__(self) -> float:
        return self.now


def adaptive_pair(data: TensorDataset, model: nn.Module, rule: str = "linear", clock: Clock | None = None,
                  **sampler_options) -> tuple[AdaptiveSampler, AdaptiveOptimizer]:
    """An AdaptiveSampler (seed 5) and an AdaptiveOptimizer over SGD at LR 0.02, timed by ``clock``."""
    sampler = AdaptiveSampler(data, seed=5, **sampler_options)
    optimizer = AdaptiveOptimizer(torch.optim.SGD(model.parameters(), lr=0.02), sampler, rule, clock=clock or Clock())
    return sampler, optimizer


def recorded_run(build, epochs: int = 3) -> tuple:
    """``(data, start weights, sampler, optimizer, history, samples)`` of a run whose pair
    ``build(data, model, clock=clock)`` makes, trained ``epochs`` epochs."""
    data, model, clock = dataset(), make_model(), Clock()
    start = [p.detach().clone() for p in model.parameters()]
    sampler, optimizer = build(data, model, clock=clock)
    history, samples = train(model, data, epochs, sampler=sampler, optimizer=optimizer, clock=clock)
    return data, start, sampler, optimizer, history, samples


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(model(x), y[:, :1])


def train(model: nn.Module, data: TensorDataset, epochs: int, *, sampler: AdaptiveSampler | None = None,
          optimizer: AdaptiveOptimizer | None = None, clock: Clock | None = None, loader=None,
          after_step=None) -> tuple[list, list]:
    """Train through the sampler and optimizer; returns the parameters after every update and
    ``(epoch, update, indices)`` of every micro-batch trained."""
    history, samples = [], []
    inner = optimizer.optimizer

    def after_update(*_):
        history.append([p.detach().clone() for p in model.parameters()])
        if clock is not None:
            clock.now += clock.per_update

    handle = inner.register_step_post_hook(after_update)
    for epoch in range(optimizer.epoch, epochs):
        sampler.set_epoch(epoch)
        optimizer.set_epoch(epoch)
        for x, y in loader if loader is not None else sampler.loader(data):
            samples.append((epoch, optimizer.epoch_schedule.first_step + optimizer.step_index, y[:, 1].long().tolist()))
            loss_of(model, x, y).backward()
            if clock is not None:
                clock.now += clock.per_sample * len(x)
            optimizer.step()
            if after_step is not None:
                after_step()
    handle.remove()
    return history, samples


def big_batch_history(model: nn.Module, data: TensorDataset, steps: list[tuple[np.ndarray, float]]) -> list:
    """Parameters after plain SGD on each ``(indices, lr)`` step's whole batch at once."""
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    x, y = data.tensors
    history = []
    for index, lr in steps:
        index = torch.as_tensor(index)
        optimizer.param_groups[0]["lr"] = lr
        optimizer.zero_grad()
        loss_of(model, x[index], y[index]).backward()
        optimizer.step()
        history.append([p.detach().clone() for p in model.parameters()])
    return history


def assert_replays(history, model, data, sampler, optimizer, epochs, scheduler=None):
    """Train ``model`` on the trace ``sampler`` replays and check every update's parameters equal
    the adaptive run's ``history``, bit for bit."""
    replayed = []
    optimizer.optimizer.register_step_post_hook(lambda *_: replayed.append([p.detach().clone()
                                                                            for p in model.parameters()]))
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        optimizer.set_epoch(epoch)
        for x, y in torch.utils.data.DataLoader(data, batch_sampler=sampler):
            torch.nn.functional.mse_loss(model(x), y[:, :1]).backward()
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
    assert len(replayed) == len(history)
    for got, want in zip(replayed, history, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def with_weights(model, weights):
    """``model`` with ``weights`` copied in: the adaptive run's start, for its replay."""
    with torch.no_grad():
        for p, w in zip(model.parameters(), weights, strict=True):
            p.copy_(w)
    return model


def assert_big_batch_updates(data, start, sampler, history, base_batch: int, epochs: int, lr: float = 0.02) -> None:
    """Every update of ``history`` equals plain SGD from ``start`` on its whole batch at the linear
    rule's LR (float64, to 1e-9)."""
    steps = []
    for epoch in range(epochs):
        plan = sampler.schedule.epoch(epoch)
        steps += [(plan.step_indices(step), lr * int(plan.batch_sizes[step]) / base_batch) for step in range(len(plan))]
    expected = big_batch_history(with_weights(make_model(), start), data, steps)
    assert len(history) == len(expected) == len(sampler.controller.batches)
    for got, want in zip(history, expected, strict=True):
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
