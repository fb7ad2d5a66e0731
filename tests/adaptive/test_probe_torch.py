"""The critical-batch probe in PyTorch (``TorchBranches`` under ``aikit.core.critical_batch``):
every branch rolled back bit for bit (weights, Adam's state, gradients, the RNG of dropout), a
probed run replayed from its trace and LR column, and resumed through ``ElasticState`` to the
same bits."""

from __future__ import annotations

import logging

import pytest
import torch
from adaptive_common import dataset, with_weights
from torch import nn

from aikit.autolrs.Torch import ReplaySchedule
from aikit.core.critical_batch import PROBED_NOISE_EVERY, CriticalBatchProbe, ProbePolicy
from aikit.elastic.Torch import (
    AdaptiveOptimizer,
    AdaptiveSampler,
    ConstantOptimizer,
    CustomSampler,
    ElasticState,
    TorchBranches,
)
from aikit.ga.Torch.scheduler import UpdateScheduler

BASE, MAX = 8, 64


def per_sample(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((model(x) - y[:, :1]) ** 2).mean(1)


def make_model(seed: int = 0, dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Dropout(dropout), nn.Linear(16, 1)).double()


def probed(data, model, adam: bool = False, first: int = 64, epsilon: float = 0.5, rules=("sqrt", "linear"),
           shrink: bool = False):
    policy = ProbePolicy(CriticalBatchProbe(64, epsilon=epsilon, rules=rules, z=0.0), first=first, shrink=shrink)
    sampler = AdaptiveSampler(data, ref_batch_size=BASE, max_batch=MAX, max_device_batch=MAX, seed=5,
                              batch_policy=policy)
    inner = torch.optim.Adam(model.parameters(), lr=0.01) if adam else torch.optim.SGD(model.parameters(), lr=0.02)
    optimizer = AdaptiveOptimizer(inner, sampler)
    held = data.tensors
    sampler.controller.attach(TorchBranches(model, optimizer, per_sample, data, held))
    return sampler, optimizer


def train(model, data, epochs, sampler, optimizer, first_epoch=0, after_update=lambda: None, scheduler=None,
          on_batch=lambda y: None):
    """Every update's weights, in order (``on_batch(y)`` sees each micro-batch's targets)."""
    weights = []
    for epoch in range(first_epoch, epochs):
        sampler.set_epoch(epoch)
        optimizer.set_epoch(epoch)
        for x, y in torch.utils.data.DataLoader(data, batch_sampler=sampler):
            on_batch(y)
            per_sample(model, x, y).mean().backward()
            if optimizer.step():
                weights.append([p.detach().clone() for p in model.parameters()])
                after_update()
            if scheduler is not None:
                scheduler.step()
    return weights


def everything(model, optimizer) -> list[torch.Tensor]:
    state = optimizer.optimizer.state_dict()["state"]
    moments = [t for s in state.values() for t in s.values() if torch.is_tensor(t)]
    grads = [p.grad if p.grad is not None else torch.zeros(0) for p in model.parameters()]
    return [*(t.clone() for t in model.state_dict().values()), *(t.clone() for t in moments),
            *(g.clone() for g in grads), torch.get_rng_state()]


def test_every_branch_is_rolled_back_bit_for_bit():
    data, model = dataset(noise=0.1), make_model(dropout=0.1)
    sampler, optimizer = probed(data, model, adam=True, first=10**9)
    sampler.set_epoch(0)
    optimizer.set_epoch(0)
    for x, y in torch.utils.data.DataLoader(data, batch_sampler=sampler):  # a few updates: Adam has state
        per_sample(model, x, y).mean().backward()
        if optimizer.step() and optimizer.updates == 3:
            break
    per_sample(model, *data.tensors).mean().backward()  # gradients in flight are state too
    before = everything(model, optimizer)
    result = CriticalBatchProbe(64, rules=("sqrt", "linear"), z=0.0).run(
        sampler.controller.branches, BASE, max_batch=MAX, dataset_size=len(data))
    after = everything(model, optimizer)
    assert result.samples >= 3 * 64 and len(result.losses) >= 2
    assert len(before) == len(after) and all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


@pytest.mark.parametrize("shrink", [False, True])
def test_a_probed_run_replays_from_its_trace_and_lr_column(tmp_path, caplog, shrink):
    data, model = dataset(noise=0.1), make_model()
    start = [p.detach().clone() for p in model.parameters()]
    sampler, optimizer = probed(data, model, shrink=shrink)
    with caplog.at_level(logging.INFO, logger="aikit.adaptive"):
        history = train(model, data, 3 if shrink else 2, sampler, optimizer)
    policy = sampler.controller.batch_policy
    assert policy.rows and max(sampler.trace) > BASE  # a probe grew the batch
    grown = next(row for row in policy.rows if row["critical_batch"] > row["batch"])
    assert f"the probe's critical batch {grown['critical_batch']} (growth factor x" in caplog.text
    assert "goodput" not in caplog.text  # a probe's growth is not the goodput model's prediction
    moved = [row for row in policy.rows if row["critical_batch"] != row["batch"]]
    assert {row["lr"] for row in optimizer.history} == {0.02, *(0.02 * row["lr_scale"] for row in moved)}
    if shrink:  # grown 8 -> 64 (x8 at the linear rule's LR), then back down to 16 at 16's: LR x 2/8
        assert [(row["batch"], row["critical_batch"]) for row in moved] == [(BASE, 64), (64, 16)]
        assert sampler.trace[-1] == 16 and policy.lr_scale == 2.0 and "(shrink factor x0.25" in caplog.text
    sampler.write_trace(tmp_path / "trace.csv")
    optimizer.write_lr_schedule(tmp_path / "lr.csv")
    model = with_weights(make_model(), start)
    replay = CustomSampler(data, str(tmp_path / "trace.csv"), max_device_batch=MAX, noise_every=PROBED_NOISE_EVERY,
                           seed=5)
    replay_opt = ConstantOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), replay)
    scheduler = UpdateScheduler(ReplaySchedule(replay_opt, tmp_path / "lr.csv"))
    replayed = train(model, data, 3 if shrink else 2, replay, replay_opt, scheduler=scheduler)
    assert len(replayed) == len(history)
    for got, want in zip(replayed, history, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("shrink", [False, True])
def test_a_probed_run_resumes_through_elastic_state_to_the_same_bits(tmp_path, shrink):
    data, model = dataset(noise=0.1), make_model()
    sampler, optimizer = probed(data, model, shrink=shrink)
    full = train(model, data, 3, sampler, optimizer)
    rows = sampler.controller.batch_policy.rows
    model = make_model()
    sampler, optimizer = probed(data, model, shrink=shrink)
    state = ElasticState(tmp_path, model=model, optimizer=optimizer, verbose=False)
    stop = len(full) // 2

    def commit_at():  # with shrink: after the growth (at 64 samples), before the shrink (at 512)
        due = sum(sampler.controller.batches) >= 256 if shrink else len(sampler.controller.batches) == stop
        if due and not state.commits:
            state.commit()

    train(model, data, 3, sampler, optimizer, after_update=commit_at)
    model = make_model(seed=9)
    sampler, optimizer = probed(data, model, shrink=shrink)
    state = ElasticState(tmp_path, model=model, optimizer=optimizer, verbose=False)
    assert state.restore()
    if shrink:  # resumed after the growth, before the shrink: the resumed run looks down by the restored growth
        assert sampler.controller.batch == 64 and sampler.controller.batch_policy.down_factor(64) == 8
        assert [row["critical_batch"] for row in rows][-1] == 16
    rest = train(model, data, 3, sampler, optimizer, first_epoch=sampler.epoch)
    untimed = [{**row, "probe_seconds": 0} for row in rows]
    assert [{**row, "probe_seconds": 0} for row in sampler.controller.batch_policy.rows] == untimed
    for got, want in zip(rest, full[-len(rest):], strict=True):
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_a_probed_run_measures_the_noise_rarely_and_still_logs_it():
    # the noise is a diagnostic there: every 64th update in two parts, not every 4th (the goodput
    # controller's, which decides from it)
    data, model = dataset(noise=0.1), make_model()
    sampler, optimizer = probed(data, model, first=10**9)
    train(model, data, 3, sampler, optimizer)  # 96 updates of 8, each one micro-batch but the measured
    split = [row["step"] for row in optimizer.history if row["ga_steps"] == 2]
    assert split == [0, 64] and len(optimizer.history) == 96
    assert all(row["noise_scale"] == row["noise_scale"] for row in optimizer.history)  # logged from the first on
    goodput = AdaptiveSampler(data, ref_batch_size=BASE, max_batch=MAX, max_device_batch=MAX, seed=5)
    assert goodput.controller.split.noise_every == 4
