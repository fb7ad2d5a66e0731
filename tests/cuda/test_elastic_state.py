"""``ElasticState`` commits and restores a run that lives on the device: the model, AdamW's moments,
a GradScaler, an ``UpdateScheduler`` and the device's random stream (dropout draws from it); a run
resumed from the commit in new objects ends at the uninterrupted run's weights, to the bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from gpu_case import mlp, regression

from aikit.elastic.Torch import ElasticState
from aikit.ga.Torch.optim import Optimizer, UpdateScheduler

pytestmark = pytest.mark.cuda

STEPS, MICRO, COMMIT_AT, UPDATES = 2, 8, 2, 4


class Run:
    """Every object of one run, made anew (as a restarted process makes them)."""

    def __init__(self, device: torch.device, directory, seed: int):
        self.device = device
        self.model = mlp(device, seed=seed, dropout=0.25)  # another seed: the restore must replace the weights
        self.inner = torch.optim.AdamW(self.model.parameters(), lr=1e-2, weight_decay=0.1)
        self.scaler = torch.amp.GradScaler(device.type, init_scale=2.0**8)
        self.optimizer = Optimizer(self.inner, STEPS, scaler=self.scaler)
        self.scheduler = UpdateScheduler(torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=1, gamma=0.9))
        self.state = ElasticState(directory, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
                                  scaler=self.scaler, updates=0, verbose=False)
        self.x, self.y = regression(UPDATES * STEPS * MICRO, device)

    def train(self, until: int) -> None:
        while self.state.updates < until:
            for micro in range(STEPS):
                start = (self.state.updates * STEPS + micro) * MICRO
                loss = F.mse_loss(self.model(self.x[start:start + MICRO]), self.y[start:start + MICRO])
                self.scaler.scale(loss).backward()
                self.optimizer.step()
                self.scheduler.step()
            assert self.optimizer.updated
            self.state.updates += 1
            if self.state.updates == COMMIT_AT:
                self.state.commit()


def test_a_run_on_the_device_resumes_from_its_commit_to_the_same_bits(device, tmp_path):
    torch.manual_seed(1)
    first = Run(device, tmp_path / "run", seed=0)
    assert not first.state.restore()  # a fresh start
    first.train(UPDATES)  # commits after update 2, trains on to 4
    resumed = Run(device, tmp_path / "run", seed=1)  # the random streams have moved on since the commit
    assert resumed.state.restore()
    assert resumed.state.updates == COMMIT_AT and resumed.optimizer.micro_step == 0
    moments = [resumed.inner.state[p]["exp_avg"] for p in resumed.model.parameters()]
    assert {t.device for t in [*moments, *resumed.model.parameters()]} == {device}  # on the device, not the CPU
    resumed.train(UPDATES)
    for got, want in zip(resumed.model.parameters(), first.model.parameters(), strict=True):
        assert torch.equal(got, want), f"largest difference {(got - want).abs().max().item():.3g}"
    for p, q in zip(resumed.model.parameters(), first.model.parameters(), strict=True):
        assert torch.equal(resumed.inner.state[p]["exp_avg_sq"], first.inner.state[q]["exp_avg_sq"])
    assert resumed.inner.param_groups[0]["lr"] == first.inner.param_groups[0]["lr"]
    assert resumed.scaler.get_scale() == first.scaler.get_scale()


def test_a_plain_tensor_value_comes_back_on_its_device(device, tmp_path):
    best = torch.tensor([1.5, -2.0], device=device)
    state = ElasticState(tmp_path / "run", best=best, verbose=False)
    state.restore()
    state.commit()
    resumed = ElasticState(tmp_path / "run", best=torch.zeros(2, device=device), verbose=False)
    assert resumed.restore()
    assert torch.equal(resumed.best.cpu(), best.cpu())
    assert resumed.best.device == device
