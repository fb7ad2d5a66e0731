"""aikit.core.lr_range.RangeTest: the range test's loop, with no framework at all.

The trainer here is a line ``w * x`` fitted to ``y = 3x`` by SGD in Python floats, one sample
per update: an adapter as small as one can be, so every number can be written down by hand.
"""

from __future__ import annotations

import itertools
import math

import pytest

from aikit.core.lr_range import RangeTest, lr_sequence


class Results:
    """What a finder holds: ``history`` and ``best_loss``."""


class LineTrainer:
    """:class:`aikit.core.lr_range.Trainer` over one weight ``w``; ``lrs`` has one LR per group
    and only the first group's trains ``w``."""

    empty_validation = "val_data yields no samples: give a validation set with data, or leave val_data out"

    def __init__(self, xs=(1.0, -0.5, 2.0), val=(1.0, 0.5), groups=1, fail_at=None):
        self.w = 0.0
        self.group_lrs = [0.01] * groups
        self.xs, self.val, self.fail_at = itertools.cycle(xs), val, fail_at
        self.set_calls, self.updates = [], 0

    def lrs(self) -> list:
        return list(self.group_lrs)

    def set_lrs(self, lrs) -> None:
        self.group_lrs = list(lrs)
        self.set_calls.append(list(lrs))

    def train_update(self) -> float:
        self.updates += 1
        if self.updates == self.fail_at:
            raise RuntimeError("out of memory")
        x = next(self.xs)
        error = (self.w - 3.0) * x
        self.w -= self.group_lrs[0] * 2 * error * x
        return error**2

    def evaluate(self) -> tuple[float, int]:
        return sum(((self.w - 3.0) * x) ** 2 for x in self.val), len(self.val)

    def val_dataset_size(self) -> int:
        return 4 * len(self.val)  # a sampler read a quarter of the data set


def hand_written(lrs, xs=(1.0, -0.5, 2.0)) -> list[float]:
    """The losses of SGD on the line at ``lrs``, one sample per update."""
    w, losses = 0.0, []
    for lr, x in zip(lrs, itertools.cycle(xs)):
        error = (w - 3.0) * x
        losses.append(error**2)
        w -= lr * 2 * error * x
    return losses


def test_each_update_runs_at_its_lr_and_records_its_own_loss_then_the_lrs_go_back():
    trainer, results = LineTrainer(groups=2), Results()
    test = RangeTest(results, [1e-3, 1e-5], end_lr=0.1, num_iter=9, smooth_f=0, diverge_th=math.inf)
    test.run(trainer)
    lrs = lr_sequence(1e-3, 0.1, 9)
    assert results.history == {"lr": lrs, "loss": hand_written(lrs)}
    assert results.best_loss == min(results.history["loss"])
    assert trainer.set_calls[:-1] == [[a, b] for a, b in zip(lrs, lr_sequence(1e-5, 0.1, 9), strict=True)]
    assert trainer.set_calls[-1] == trainer.group_lrs == [0.01, 0.01]  # put back


def test_the_test_stops_after_the_update_whose_smoothed_loss_diverged(capsys):
    trainer, results = LineTrainer(), Results()
    RangeTest(results, [1e-3], end_lr=10, num_iter=100, smooth_f=0.05).run(trainer)
    losses = results.history["loss"]
    assert trainer.updates == len(losses) < 100
    assert losses[-1] > 5 * min(losses) and all(loss <= 5 * min(losses[: i + 1]) for i, loss in enumerate(losses[:-1]))
    assert capsys.readouterr().out.splitlines() == [
        "Stopping early, the loss has diverged", "Learning rate search finished. See the graph with plot()"]


def test_a_framework_that_owns_the_loop_gets_the_same_test_update_by_update():
    """Keras fit's way: begin and end each update from callbacks. An update begun again without
    being ended (skipped) is not counted: the same LRs are set again."""
    whole = Results()
    RangeTest(whole, [1e-3], end_lr=0.1, num_iter=6).run(LineTrainer())
    trainer, stepwise, skipped = LineTrainer(), Results(), False
    test = RangeTest(stepwise, [1e-3], end_lr=0.1, num_iter=6)
    with test.running(trainer):
        while not test.done:
            test.begin_update()
            if test.iteration == 2 and not skipped:
                skipped = True
                continue  # the framework skipped this update: it begins it again
            test.end_update(trainer.train_update())
    assert stepwise.history == whole.history
    assert trainer.set_calls[2] == trainer.set_calls[3]  # iteration 2's LRs, twice
    assert len(trainer.set_calls) == 6 + 1 + 1


def test_an_error_mid_test_puts_the_lrs_back_and_keeps_what_was_recorded():
    trainer, results = LineTrainer(fail_at=4), Results()
    with pytest.raises(RuntimeError, match="out of memory"):
        RangeTest(results, [1e-3], end_lr=0.1, num_iter=9, smooth_f=0, diverge_th=math.inf).run(trainer)
    assert results.history["loss"] == hand_written(lr_sequence(1e-3, 0.1, 9)[:3])
    assert results.best_loss == min(results.history["loss"])
    assert trainer.group_lrs == [0.01]


@pytest.mark.parametrize("average, divisor", [("seen", 2), ("dataset", 8)])
def test_validation_records_the_validation_loss_over_the_samples_seen_or_the_data_set(average, divisor):
    trainer, results = LineTrainer(), Results()
    RangeTest(results, [1e-3], end_lr=0.1, num_iter=4, smooth_f=0, validate=True, val_average=average).run(trainer)
    assert trainer.updates == 4
    assert results.history["loss"][-1] == ((trainer.w - 3) ** 2 * (1.0 + 0.25)) / divisor


def test_validation_without_samples_is_refused_with_the_adapters_words():
    with pytest.raises(ValueError, match=r"^val_data yields no samples: give a validation set with data"):
        RangeTest(Results(), [1e-3], num_iter=4, validate=True).run(LineTrainer(val=()))


def test_the_constructor_checks_its_arguments_and_empties_the_results_only():
    results = Results()
    results.history, results.best_loss = {"lr": [1.0], "loss": [2.0]}, 2.0
    RangeTest(results, [1e-3], num_iter=4)
    assert (results.history, results.best_loss) == ({"lr": [], "loss": []}, None)
    with pytest.raises(ValueError, match=r"^val_average must be 'dataset' \(torch-lr-finder's.*got 'mean'"):
        RangeTest(results, [1e-3], val_average="mean")
    with pytest.raises(ValueError, match=r"^num_iter must be an integer larger than 1"):
        RangeTest(results, [1e-3], num_iter=1)
