"""AutoLRS when the user's val_fn or loss misbehaves (issue 27's probe findings): a failing
val_fn is logged and skipped and the search stays usable, a val_fn result that is no number is
refused by name, a loss or validation that never turns finite ends with a named error within
the budget, every replica raises where the chief does, and ReplaySchedule holds a list to the
CSV's rule."""

from __future__ import annotations

import logging
import math
import random

import numpy as np
import pytest
import torch
from test_autolrs_torch import one_thread  # noqa: F401 (autouse: tiny models on one thread)
from torch import nn

from aikit.autolrs.Torch import AutoLRS, ReplaySchedule
from aikit.core.autolrs import MAX_ROLLBACKS, Controller, Driver, schedule_lrs
from aikit.core.errors import InvalidType, InvalidValue, TrainingFailed

# validation-scored stages from the first (val_tau=1): 2 trials of 12 steps, 4 validations each
VALIDATED = {"min_lr": 1e-3, "max_lr": 0.3, "tau": 60, "tau_max": 60, "trials": 2, "val_tau": 1, "val_points": 4,
             "trial_ratio": 5}


class Run:
    """A tiny regression trained step by step under AutoLRS, with a val_fn the test scripts."""

    def __init__(self, answers=None, loss_fn=None, **options):
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(256, 4, generator=g)
        self.y = self.x.sum(1, keepdim=True).sin()
        self.answers = answers or (lambda call, loss: loss)  # val_fn's answer at its call-th call
        self.loss_fn = loss_fn or nn.functional.mse_loss
        self.calls = 0
        self.steps = 0
        self.autolrs = AutoLRS(self.model, self.optimizer, self.val_fn, **options)

    def val_fn(self):
        self.calls += 1
        with torch.no_grad():
            return self.answers(self.calls, nn.functional.mse_loss(self.model(self.x[:64]), self.y[:64]).item())

    def step(self) -> None:
        start = (self.steps * 16) % 240
        self.optimizer.zero_grad()
        loss = self.loss_fn(self.model(self.x[start:start + 16]), self.y[start:start + 16])
        loss.backward()
        self.optimizer.step()
        self.steps += 1
        self.autolrs.on_train_batch_end(loss)


def raise_at(*calls):
    def answers(call, loss):
        if call in calls:
            raise ZeroDivisionError(f"val_fn's bug at call {call}")
        return loss
    return answers


def test_a_val_fn_that_raises_is_logged_and_that_evaluation_skipped_and_the_search_goes_on(caplog):
    run = Run(raise_at(2), **VALIDATED)
    with caplog.at_level(logging.WARNING, logger="aikit.autolrs"):
        for _ in range(2 * 12 + 30):
            run.step()
    warned = [r for r in caplog.records if "val_fn raised" in r.getMessage()]
    assert len(warned) == 1
    assert "ZeroDivisionError: val_fn's bug at call 2 at step 6; that evaluation is skipped" in warned[0].getMessage()
    assert warned[0].exc_info is not None  # its traceback is logged
    first, second = run.autolrs.controller.stages[0].trials
    assert (first.missed, first.steps, second.missed, second.steps) == (1, [3, 9, 12], 0, [3, 6, 9, 12])
    assert not first.failed and not second.failed  # 3 validations are enough to forecast
    assert run.calls == 8 and run.autolrs.controller.phase == "train"


def test_a_val_fn_that_raises_at_every_call_ends_with_a_named_error_naming_it():
    run = Run(raise_at(*range(1, 100)), **VALIDATED)
    with pytest.raises(TrainingFailed, match=r"every trial of AutoLRS stage 0 failed on its validation loss \("
                                             r"lr=.*: val_fn failed at 4 of its 4 evaluations \(last: "
                                             r"ZeroDivisionError: val_fn's bug at call 8\)"):
        for _ in range(2 * 12 + 1):
            run.step()
    assert run.steps == 2 * 12


def test_a_val_fn_that_always_returns_nan_ends_with_a_named_error_not_lower_min_lr():
    run = Run(lambda call, loss: math.nan, **VALIDATED)
    with pytest.raises(TrainingFailed, match=r"lr=.*: val_fn returned nan; lr=.*: val_fn returned nan\): val_fn "
                                             "must return the validation loss as a finite number"):
        for _ in range(100):
            run.step()
    assert run.steps == 2 * 3  # each trial failed at its first validation


@pytest.mark.parametrize(("answer", "error", "got"), [
    ("abc", InvalidType, "got 'abc'"),
    (None, InvalidType, "got None"),
    ("0.5", InvalidType, "got '0.5'"),
    (True, InvalidType, "got True"),
    (torch.ones(2), InvalidValue, "got a Tensor of shape (2,)"),
    (np.zeros((1, 2)), InvalidValue, "got a ndarray of shape (1, 2)"),
    (torch.tensor(True), InvalidType, "got Tensor tensor(True)"),
])
def test_a_val_fn_result_that_is_no_number_is_refused_by_name_and_the_search_stays_usable(answer, error, got):
    bad = {"now": True}
    run = Run(lambda call, loss: answer if bad["now"] else loss, **VALIDATED)
    with pytest.raises(error, match="^val_fn must return the validation loss as one number "
                                    r"\(a float, or a tensor with one element\), " + got.replace("(", r"\(")
                                    .replace(")", r"\)")):
        for _ in range(4):
            run.step()
    assert run.steps == 3 and run.calls == 1
    trial = run.autolrs.controller.stages[0].trials[0]
    assert trial.missed == 1 and trial.losses == []  # that evaluation was skipped, nothing pending
    bad["now"] = False
    for _ in range(2 * 12 - 3 + 5):  # the rest of the search, then the stage
        run.step()
    assert run.autolrs.controller.phase == "train" and run.calls == 8


@pytest.mark.parametrize("answer", [torch.tensor(0.5), torch.tensor([0.5]), np.float32(0.5), np.array(0.5), 0.5, 1])
def test_a_val_fn_result_of_one_number_in_any_form_is_taken(answer):
    run = Run(lambda call, loss: answer, **VALIDATED)
    for _ in range(3):
        run.step()
    assert run.autolrs.controller.stages[0].trials[0].losses == [float(answer)]


@pytest.mark.parametrize("options", [
    {"total_steps": 200},  # the range test meets it
    {"min_lr": 1e-3, "max_lr": 0.3, "total_steps": 200},  # every trial, then the stage's rollbacks
    {"min_lr": 1e-3, "max_lr": 0.3, "tau": 30, "trials": 3},  # no budget at all
], ids=["range test", "budget", "no budget"])
def test_a_loss_that_is_nan_at_every_step_ends_with_a_named_error_within_the_budget(options, caplog):
    run = Run(loss_fn=lambda out, y: (out - y).pow(2).mean() * math.nan, **options)
    with caplog.at_level(logging.WARNING, logger="aikit.autolrs"), pytest.raises(TrainingFailed) as refused:
        for _ in range(300):
            run.step()
    if "min_lr" in options:
        assert f"AutoLRS rolled back {MAX_ROLLBACKS} times in a row" in str(refused.value)
        assert "no step has had a finite loss: that comes from the model, the data or the loss function" in str(
            refused.value)
        assert run.steps == 3 + MAX_ROLLBACKS + 1  # 3 trials failed at their first step, then the rollbacks
    else:
        assert str(refused.value).startswith("the LR range test stopped at its first LRs [1e-06] with losses [nan]")
        assert run.steps == 1
    assert len(caplog.records) <= MAX_ROLLBACKS + 1  # not one warning per step for ever


def test_a_loss_that_blows_up_at_any_lr_ends_with_a_named_error_within_the_budget():
    # finite losses, but every stage step past the first doubles the loss: no LR rescues it
    calls = []

    def loss_fn(out, y):
        calls.append(1)
        return (out - y).pow(2).mean() * 0 + 2.0 ** min(len(calls), 900)
    run = Run(loss_fn=loss_fn, min_lr=1e-3, max_lr=0.3, tau=30, trials=3, total_steps=300)
    with pytest.raises(TrainingFailed, match="the loss blows up however low the LR"):
        for _ in range(300):
            run.step()
    assert run.steps < 300


def test_a_search_saved_before_it_counted_rollbacks_in_a_row_still_resumes():
    controller = Controller(1e-3, 0.3, tau=30, trials=3)
    controller.begin()
    for _ in range(5):
        controller.step(1.0)
    state = controller.state_dict()
    for added in ("_rollbacks_in_row", "_last_val_error"):
        del state[added]
    resumed = Controller(1e-3, 0.3, tau=30, trials=3)
    resumed.load_state_dict(state)
    assert resumed.step(1.0) == controller.step(1.0)


class Replica:
    """Two drivers of one search over a scripted channel, as two replicas see it: the chief
    decides and records what its agree() sends; the other replica gets exactly those numbers."""

    def __init__(self, chief: bool, sent: list, val_fn):
        self.chief, self.sent, self.val_fn, self.read = chief, sent, val_fn, 0
        self.lr, self.w = 0.0, 5.0

    def agree(self, decide):
        if self.chief:
            self.sent.append(list(decide()))
            return self.sent[-1]
        self.read += 1
        return self.sent[self.read - 1]

    def validation_loss(self):
        return self.val_fn()

    def snapshot(self):
        return self.w

    def restore(self, snapshot):
        self.w = snapshot

    def set_lr(self, lr):
        self.lr = lr


@pytest.mark.parametrize(("chief_answer", "error", "raised_on_chief"), [
    ("abc", InvalidType, "val_fn must return the validation loss as one number"),
    (math.nan, TrainingFailed, "every trial of AutoLRS stage 0 failed on its validation loss"),
])
def test_the_chiefs_refusal_travels_with_the_decision_and_every_replica_raises_at_the_same_step(
        chief_answer, error, raised_on_chief):
    sent = []
    options = {"tau": 40, "tau_max": 40, "trials": 2, "val_points": 4, "val_tau": 1, "seed": 0}
    chief = Driver(Controller(1e-3, 0.5, **options), Replica(True, sent, lambda: chief_answer))
    other = Driver(Controller(1e-3, 0.5, **{**options, "seed": 1}), Replica(False, sent, lambda: 0.25))
    raised = []
    for driver in (chief, other):  # the chief's whole run first, then the other replica on its numbers
        driver.begin(0.1)
        rng = random.Random(0)
        try:
            for step in range(40):  # noqa: B007 (the step it raised at is asserted)
                driver.step(1.0 + rng.random())
        except (error, TrainingFailed) as refusal:
            raised.append((step, type(refusal), str(refusal)))
    (chief_step, _, chief_message), (other_step, other_error, other_message) = raised
    assert chief_step == other_step and raised_on_chief in chief_message
    assert other_error is TrainingFailed and "AutoLRS raised an error on the chief (rank 0, worker 0)" in other_message
    assert chief.training.lr == other.training.lr and chief.training.w == other.training.w


def test_replay_schedule_refuses_a_list_with_a_non_finite_or_negative_lr_as_the_csv_path_does():
    optimizer = torch.optim.SGD(nn.Linear(2, 1).parameters(), lr=0.5)
    with pytest.raises(InvalidValue, match=r"^schedule\[1\] must be a finite number >= 0 \(an LR\), got nan"):
        ReplaySchedule(optimizer, [0.1, math.nan, -1.0])
    with pytest.raises(InvalidValue, match=r"^schedule\[2\] must be a finite number >= 0 \(an LR\), got -1.0"):
        ReplaySchedule(optimizer, [0.1, 0.2, -1.0])
    with pytest.raises(InvalidType, match=r"^schedule\[0\] must be a finite number >= 0 \(an LR\), got '0.5'"):
        ReplaySchedule(optimizer, ["0.5"])
    assert optimizer.param_groups[0]["lr"] == 0.5  # refused before the scheduler touched the optimizer
    assert schedule_lrs(torch.tensor([0.5, 0.25])) == [0.5, 0.25] == schedule_lrs(np.array([0.5, 0.25]))
    scheduler = ReplaySchedule(optimizer, [0.3, 0.0])
    assert optimizer.param_groups[0]["lr"] == 0.3
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == 0.0
