"""aikit.autolrs.Torch.AutoLRS on real torch training: exact restores, the LR in force, digits."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from aikit.autolrs.Torch import AutoLRS, ReplaySchedule
from aikit.core.autolrs import read_schedule
from aikit.core.errors import InvalidType, InvalidValue
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
        step = step + 1 if autolrs.controller.phase != "trial" else 5  # ...as every trial reuses batch 5
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
    optimizer = torch.optim.SGD(model.parameters(), lr=0.003)
    autolrs = AutoLRS(model, optimizer, lambda: 0.0, 1e-4, 1e-1, **OPTIONS, keep_winner=False)
    assert autolrs.lr == 0.003  # the original AutoLRS's step 0: the optimizer's own LR
    restores = 0
    for step in range(5 + 3 * 3 + 5):
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
    options = {"tau": 100, "tau_max": 200, "trials": 5, "trial_ratio": 5, "val_points": 5, "seed": 2, "design": 0}
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


def test_the_original_autolrs_call_works_unchanged(data, caplog):
    # AutoLRS's cifar10_example.py: AutoLRS(net, optimizer, val_fn) with the callback's keywords;
    # its server took the LR range on the command line: here a range test sets it.
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.004, momentum=0.9)
    with caplog.at_level("INFO", logger="aikit.autolrs"):
        autolrs = AutoLRS(model, optimizer, lambda: val_loss(model, data), listening_host="localhost",
                          listening_port=12315, warmup_steps=3, warmup_lr=0.1, summary_steps=1)
        lrs = []
        for step in range(4 + 100 + 1):
            lrs.append(optimizer.param_groups[0]["lr"])
            autolrs.on_train_batch_end(train_step(model, optimizer, *batch(data, step)).item())
    # The original sets warmup_lr / n * (k + 1) after step k: step 0 keeps the optimizer's LR.
    assert lrs[:4] == pytest.approx([0.004, 0.1 / 3, 0.2 / 3, 0.1])
    assert lrs[4] == pytest.approx(1e-6) and lrs[103] == pytest.approx(10.0)  # the range test's sweep
    assert "no min_lr/max_lr given; running an LR range test of 100 steps" in caplog.text
    assert "listening_host='localhost' and listening_port=12315 are not used" in caplog.text
    assert 0 < autolrs.controller.min_lr < autolrs.controller.max_lr <= 10.0
    positional = AutoLRS(mlp(), torch.optim.SGD(mlp().parameters(), lr=0.1), lambda: 0.0, "localhost", 12315)
    assert positional.controller.min_lr is None and positional.controller.phase == "range"


def run_with_autolrs(data, steps, autolrs_state=None, start=0, model_state=None, optimizer_state=None, **options):
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    options = {"total_steps": 300, "tau": 30, "trials": 3, "trial_ratio": 5, "range_steps": 20, "val_tau": 80,
               "val_points": 4, "seed": 1, **options}
    autolrs = AutoLRS(model, optimizer, lambda: val_loss(model, data), **options)
    if autolrs_state is not None:
        model.load_state_dict(model_state)
        optimizer.load_state_dict(optimizer_state)
        autolrs.load_state_dict(autolrs_state)
    for step in range(start, steps):
        autolrs.on_train_batch_end(train_step(model, optimizer, *batch(data, step)))
    return model, optimizer, autolrs


@pytest.mark.parametrize("preempted_at", [10, 57, 150])
def test_a_preempted_search_resumes_where_it_was(data, tmp_path, preempted_at):
    whole_model, _, whole = run_with_autolrs(data, 300)
    model, optimizer, autolrs = run_with_autolrs(data, preempted_at)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "autolrs": autolrs.state_dict()},
               tmp_path / "checkpoint.pt")
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)  # loading is not executing
    model, _, resumed = run_with_autolrs(data, 300, saved["autolrs"], preempted_at, saved["model"], saved["optimizer"])
    assert resumed.controller.history == whole.controller.history
    assert resumed.controller.schedule() == whole.controller.schedule()
    for name, value in whole_model.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name


def test_a_state_saved_before_the_hook_saved_kept_still_resumes(data):
    model, _, autolrs = run_with_autolrs(data, 57)  # in a trial: kept is False
    state = autolrs.state_dict()
    assert state["kept"] is False
    del state["kept"]  # as the hook saved it before
    _, _, resumed = run_with_autolrs(data, 57, state, 57, model.state_dict(), autolrs.optimizer.state_dict())
    assert resumed.controller.history == autolrs.controller.history and resumed.action == autolrs.action


def test_the_found_schedule_replays_without_search(data, tmp_path):
    _, _, autolrs = run_with_autolrs(data, 300, range_steps=30)  # (20 steps of SGD find an LR that is rolled back)
    autolrs.export_schedule(tmp_path / "schedule.csv")
    kept = [lr for _, lr in autolrs.controller.schedule()]
    assert read_schedule(tmp_path / "schedule.csv") == kept
    assert autolrs.controller.rollbacks == 0
    assert len(kept) == 300 - sum(len(s.trials) * s.trial_steps for s in autolrs.controller.stages) - 30 + sum(
        s.trial_steps for s in autolrs.controller.stages if s.kept is not None)  # 30: the range test
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)
    replay = ReplaySchedule(optimizer, tmp_path / "schedule.csv")
    used = []
    for step in range(len(kept) + 5):
        used.append(optimizer.param_groups[0]["lr"])
        train_step(model, optimizer, *batch(data, step))
        replay.step()
    assert used == kept + [kept[-1]] * 5


def test_the_plot_uses_a_log_loss_axis_and_marks_diverged_steps(tmp_path):
    from aikit.core.autolrs import Controller

    c = Controller(1e-3, 1.0, tau=30, tau_max=30, trials=3, val_tau=10**6)
    action = c.begin()
    for step in range(60):
        blown = c.phase == "trial" and len(c.stages[0].trials) == 2
        action = c.step(8e18 if blown else 2.0 / (1 + step / 10))
        del action
    from aikit.runtime.plots import plot_progress

    figure = plot_progress(c, tmp_path / "plot.png")
    ax_loss = figure.axes[1]
    assert ax_loss.get_yscale() == "log"
    plotted = np.concatenate([collection.get_offsets()[:, 1] for collection in ax_loss.collections])
    assert plotted.max() < 10  # the 8e18 is marked, not plotted
    assert any("diverged" in text.get_text() for text in ax_loss.get_legend().get_texts())


@pytest.mark.parametrize(("loss", "error", "got"), [
    ("0.3", InvalidType, "got '0.3'"),
    (None, InvalidType, "got None"),
    (torch.ones(2), InvalidValue, "got a Tensor of shape (2,)"),
])
def test_a_loss_that_is_no_number_is_refused_as_val_fns_answer_is(data, loss, error, got):
    """on_train_batch_end("0.3") recorded 0.3; val_fn returning "0.5" was refused: both are now."""
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    autolrs = AutoLRS(model, optimizer, lambda: 1.0, **OPTIONS)
    autolrs.on_train_batch_end(train_step(model, optimizer, *batch(data, 0)))
    with pytest.raises(error) as refused:
        autolrs.on_train_batch_end(loss)
    assert str(refused.value) == ("AutoLRS.on_train_batch_end's loss must be the step's training loss as one number "
                                  f"(a float, or a tensor with one element), {got}")
    assert autolrs.controller.steps == 1 and len(autolrs.controller.history) == 1  # nothing recorded
    autolrs.on_train_batch_end(0.3)  # a float and a one-element tensor are taken
    autolrs.on_train_batch_end(torch.tensor([0.3]))
    assert autolrs.controller.steps == 3
