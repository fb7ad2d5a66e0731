"""aikit.autolrs.Torch.AutoLRS on real torch training: exact restores, the LR in force, digits."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from aikit.autolrs.Torch import AutoLRS
from aikit.datasets import digits

OPTIONS = {"tau": 30, "tau_max": 30, "trials": 3, "val_tau": 10**6, "warmup_steps": 4, "warmup_lr": 0.01}


def mlp(dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 10))


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run fastest on one thread (and do not fight other tests for the cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data():
    x, y, xv, yv = digits()
    return torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(xv), torch.from_numpy(yv)


def batch(data, step: int, size: int = 32):
    x, y = data[0], data[1]
    start = (step * size) % (len(y) - size)
    return x[start:start + size], y[start:start + size]


def train_step(model, optimizer, xb, yb) -> torch.Tensor:
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(xb), yb)
    loss.backward()
    optimizer.step()
    return loss.detach()


def snapshot(model, optimizer) -> dict:
    state = optimizer.state_dict()["state"]
    return {
        "params": {k: v.clone() for k, v in model.state_dict().items()},
        "optimizer": {i: {k: v.clone() for k, v in s.items()} for i, s in state.items()},
        "rng": torch.get_rng_state().clone(),
    }


def assert_same(a: dict, b: dict) -> None:
    for k in a["params"]:
        assert torch.equal(a["params"][k], b["params"][k]), k
    assert a["optimizer"].keys() == b["optimizer"].keys()
    for i in a["optimizer"]:
        for k in a["optimizer"][i]:
            assert torch.equal(a["optimizer"][i][k], b["optimizer"][i][k]), (i, k)
    assert torch.equal(a["rng"], b["rng"])


def test_restore_returns_bit_exactly_to_the_checkpoint(data):
    model = mlp(dropout=0.3)
    optimizer = torch.optim.Adam(model.parameters())
    autolrs = AutoLRS(model, optimizer, lambda: 0.0, 1e-4, 1e-1, **OPTIONS)
    step, trial_start, first_losses = 0, None, []
    while len(autolrs.controller.stages) == 0 or autolrs.controller.phase == "trial":
        if autolrs.controller.phase == "trial" and trial_start is None:
            trial_start = snapshot(model, optimizer)  # Adam has state: the warmup stepped it
            assert trial_start["optimizer"]
        loss = train_step(model, optimizer, *batch(data, step))
        if autolrs.controller.phase == "trial" and autolrs.controller._in_phase == 0:
            first_losses.append(loss.item())  # first step of each trial, all on the same batch...
        step = step + 1 if autolrs.controller.phase != "trial" else 4  # ...as every trial reuses batches 4..
        before = autolrs.controller.stages[-1].trials[-1] if autolrs.controller.stages else None
        autolrs.on_train_batch_end(loss)
        after = autolrs.controller.stages[-1].trials[-1] if autolrs.controller.stages else None
        if before is not None and after is not before:  # a trial ended: we are back at the checkpoint
            assert_same(trial_start, snapshot(model, optimizer))
    # Same parameters, optimizer state and dropout masks: the first loss of every trial is equal.
    assert len(first_losses) == 3 and len(set(first_losses)) == 1


def test_the_new_lr_is_in_force_from_the_first_step_after_a_restore(data):
    model = mlp().double()
    data = tuple(t.double() if t.is_floating_point() else t for t in data)
    optimizer = torch.optim.SGD(model.parameters(), lr=123.0)
    autolrs = AutoLRS(model, optimizer, lambda: 0.0, 1e-4, 1e-1, **OPTIONS)
    assert optimizer.param_groups[0]["lr"] == 0.01 / 4  # set on construction, not the 123 given
    restores = 0
    for step in range(4 + 3 * 3 + 5):
        before = [p.detach().clone() for p in model.parameters()]
        expected_lr = autolrs.lr
        loss = train_step(model, optimizer, *batch(data, step))
        for p, p0 in zip(model.parameters(), before, strict=True):
            # The step used the promised LR (float64: any other LR would be far off).
            torch.testing.assert_close(p.detach(), p0 - expected_lr * p.grad, rtol=0, atol=1e-15)
        in_trial = autolrs.controller.phase == "trial"
        autolrs.on_train_batch_end(loss)
        if in_trial and autolrs.controller._in_phase == 0:
            restores += 1
            assert optimizer.param_groups[0]["lr"] == autolrs.lr
    assert restores == 3
    assert autolrs.lr == autolrs.controller.stages[0].lr  # the stage trains at the chosen LR


def val_loss(model, data) -> float:
    model.eval()
    with torch.no_grad():
        loss = nn.functional.cross_entropy(model(data[2]), data[3]).item()
    model.train()
    return loss


def run_digits(data, lr_or_options, steps: int = 600) -> tuple[float, AutoLRS | None]:
    """Plain SGD on digits for ``steps`` steps at a constant LR, or under AutoLRS."""
    model = mlp()
    lr = lr_or_options if isinstance(lr_or_options, float) else 0.1
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    autolrs = None
    if isinstance(lr_or_options, dict):
        autolrs = AutoLRS(model, optimizer, lambda: val_loss(model, data), 1e-3, 10.0, **lr_or_options)
    for step in range(steps):
        loss = train_step(model, optimizer, *batch(data, step))
        if autolrs is not None:
            autolrs.on_train_batch_end(loss)
    return val_loss(model, data), autolrs


def test_short_digits_run_beats_its_first_trial_lr_held_constant(data, tmp_path):
    # Two stages of 100 and 200 steps (the second scored on validation losses), 5 trials of
    # 20 and 40 steps each: 600 steps in all, search included. Seed 2 draws 0.011 as the first
    # trial LR, a slow one; the search has to find better LRs, and pay for the search.
    options = {"tau": 100, "tau_max": 200, "trials": 5, "trial_ratio": 5, "val_points": 5, "seed": 2}
    tuned, autolrs = run_digits(data, options)
    stages = autolrs.controller.stages
    assert [s.val_every for s in stages[:2]] == [None, 8]  # both scoring modes ran
    assert autolrs.controller.steps == 600 and stages[1].lr is not None
    first_lr = stages[0].trials[0].lr
    constant, _ = run_digits(data, first_lr)
    assert math.isfinite(tuned)
    assert tuned < constant, (tuned, constant, first_lr, [s.lr for s in stages])
    figure = autolrs.plot(tmp_path / "autolrs.png")
    assert (tmp_path / "autolrs.png").stat().st_size > 10_000
    assert figure.axes[0].get_yscale() == "log"
