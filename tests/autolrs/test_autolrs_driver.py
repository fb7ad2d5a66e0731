"""The AutoLRS driver with no framework: the order both adapters rely on, on a training written
in plain Python (one weight on a noisy quadratic, an optimizer LR that a restore brings back,
as torch's optimizer ``state_dict`` does, and a random stream)."""

from __future__ import annotations

import random

import pytest

from aikit.core.autolrs import Controller, Driver, pack, unpack


class Quadratic:
    """A training the driver runs: ``loss = (w - 1)^2 + noise``, one SGD step per call."""

    def __init__(self):
        self.w, self.lr, self.rng = 5.0, 0.0, random.Random(0)
        self.validations = 0

    def train_step(self) -> float:
        loss = (self.w - 1.0) ** 2 + self.rng.gauss(0.0, 0.05)
        self.w -= self.lr * 2.0 * (self.w - 1.0)
        return loss

    def state(self) -> tuple:
        """What a restore must bring back, the LR aside (the driver sets it after)."""
        return self.w, self.rng.getstate()

    # -- aikit.core.autolrs.Training --

    def snapshot(self) -> tuple:
        return self.w, self.lr, self.rng.getstate()

    def restore(self, snapshot: tuple) -> None:
        self.w, self.lr, rng = snapshot
        self.rng.setstate(rng)

    def set_lr(self, lr: float) -> None:
        self.lr = lr

    def validation_loss(self) -> float:
        self.validations += 1
        return (self.w - 1.0) ** 2

    def agree(self, decide):
        return decide()


@pytest.mark.parametrize("options", [
    {"min_lr": 1e-3, "max_lr": 0.5, "tau": 30, "tau_max": 60, "trials": 3, "val_tau": 60, "val_points": 4},
    # a range test, its restore and checkpoint, a searched stage, an anneal
    {"total_steps": 400, "range_steps": 20, "trials": 3, "stages": 2},
])
def test_the_driver_keeps_restores_resumes_checkpoints_then_sets_the_lr(options):
    training = Quadratic()
    controller = Controller(**options, seed=1)
    driver = Driver(controller, training)
    driver.begin(0.05)
    used, kinds = [], set()
    for _ in range(400):
        used.append(training.lr)
        loss = training.train_step()
        after_step = training.state()
        driver.step(loss)
        action = driver.action
        kinds.update(flag for flag in ("keep_trial", "restore", "resume_trial", "checkpoint") if getattr(action, flag))
        if action.keep_trial:  # the trial's end state, before any restore
            assert driver.slots["trial"][::2] == after_step
        if action.checkpoint:  # the state the next stage starts from: after the restore or resume
            assert driver.slots["stage"][::2] == training.state()
        if action.restore:
            assert training.state() == driver.slots["stage"][::2]
        if action.resume_trial:
            assert training.state() == driver.slots["trial"][::2]
        assert driver.kept == controller.kept
    assert used == [record.lr for record in controller.history]  # each step ran at the LR decided for it
    assert kinds == {"keep_trial", "restore", "resume_trial", "checkpoint"}
    scored = [stage for stage in controller.stages if stage.val_every is not None]
    assert training.validations == sum(len(t.losses) for stage in scored for t in stage.trials)
    assert training.validations > 0 or "min_lr" not in options


def test_a_decision_travels_as_numbers_and_back():
    controller = Controller(1e-3, 1.0, tau=30)
    action = controller.begin()
    numbers = [float(x) for x in pack(action, controller.kept)]  # as a float64 collective carries it
    assert unpack(numbers) == (action, controller.kept)
