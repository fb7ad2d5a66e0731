"""PyTorch's AdaptiveSampler/AdaptiveOptimizer and Keras' fit_adaptive run one algorithm
(aikit.core.adaptive): given the same decisions they take the same batches, end their epochs at
the same updates, split them in the same micro-batches and log the same history rows; given the
same measurements their controllers decide the same; given the same costs they time their
updates the same."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from keras_adaptive_common import ScriptedController, big_batch_reference
from tf_common import data, keras, max_difference, mlp

from aikit.core.adaptive import AdaptiveRun, AdaptiveSchedule
from aikit.core.goodput import GoodputController
from aikit.core.gradient_noise import NoiseEstimate
from aikit.elastic.TF import fit_adaptive
from aikit.elastic.Torch import AdaptiveOptimizer, AdaptiveSampler
from aikit.ga.TF.noise import NoiseOptimizer

SCRIPT = {2: 24, 4: 12, 7: 20}  # update: the batch the controller proposes after it
SETTINGS = {"ref_batch_size": 8, "max_batch": 24}  # one device holding at most 4 samples, every 4th update in two


class Clock:
    """Seconds as the training loops say they pass: ``per_sample`` for every sample a micro-step
    trains, ``per_update`` for every update (both frameworks advance it the same way)."""

    per_sample, per_update = 1e-3, 0.05

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def torch_run(x: np.ndarray, y: np.ndarray, clock: Clock, epochs: int = 2,
              hold_after: int | None = None) -> tuple[list[dict], GoodputController]:
    """The adaptive run in PyTorch, its controller's decisions the script's."""
    sampler = AdaptiveSampler(len(x), max_device_batch=4, noise_every=4, seed=3, hold_after=hold_after, **SETTINGS)
    sampler.schedule.controller = ScriptedController(SCRIPT, 4, 1, noise_every=4, **SETTINGS)
    torch.manual_seed(0)
    model = torch.nn.Linear(x.shape[1], y.shape[1]).double()
    inner = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    optimizer = AdaptiveOptimizer(inner, sampler, "sqrt", clock=clock)
    inner.register_step_post_hook(lambda *_: setattr(clock, "now", clock.now + clock.per_update))
    data_set = torch.utils.data.TensorDataset(torch.as_tensor(x), torch.as_tensor(y))
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        optimizer.set_epoch(epoch)
        for xb, yb in sampler.loader(data_set):
            torch.nn.functional.mse_loss(model(xb), yb).backward()
            clock.now += clock.per_sample * len(xb)
            optimizer.step()
    return optimizer.history, sampler.controller


def keras_run(x: np.ndarray, y: np.ndarray, clock: Clock | None = None, epochs: int = 2,
              hold_after: int | None = None):
    """The same run in Keras (run eagerly with a clock: every micro-step and update advance it)."""
    inner = keras.optimizers.SGD(0.05, momentum=0.9)

    class Timed(keras.Sequential):
        def train_step(self, batch):
            updates = int(inner.iterations.numpy())
            result = super().train_step(batch)
            clock.now += clock.per_sample * int(batch[0].shape[0])
            if int(inner.iterations.numpy()) > updates:  # the update runs inside the last micro-step
                clock.now += clock.per_update
            return result

    keras.utils.set_random_seed(1)
    model = Timed(mlp().layers) if clock is not None else mlp()
    model.compile(NoiseOptimizer(inner), loss="mse", run_eagerly=clock is not None)
    controller = ScriptedController(SCRIPT, 4, 1, noise_every=4, **SETTINGS)
    rows = fit_adaptive(model, x, y, controller, base_lr=0.05, rule="sqrt", epochs=epochs, seed=3,
                        hold_after=hold_after, **({} if clock is None else {"clock": clock}))
    return model, rows, controller


def test_both_frameworks_take_the_same_batches_end_epochs_alike_and_log_the_same_rows(float64):
    """50 samples: 8, 8, 24, then the 10 left of epoch 0 as 9 (3 x 3): the 1 left cannot run on
    update 4, which measures the noise in two micro-batches, so it sits epoch 0 out; epoch 1 ends
    on 12 of the 14 left, then the last 2 in two micro-batches of 1 (update 8 measures too)."""
    x, y = data(50)
    torch_rows, torch_controller = torch_run(x, y, Clock())
    keras_model, keras_rows, keras_controller = keras_run(x, y)
    assert [r["batch_size"] for r in torch_rows] == [8, 8, 24, 9, 12, 12, 12, 12, 2]
    assert [r["epoch"] for r in torch_rows] == [0, 0, 0, 0, 1, 1, 1, 1, 1]
    assert [r["micro_batch"] for r in torch_rows] == [4, 4, 4, 3, 4, 4, 4, 4, 1]
    assert [r["ga_steps"] for r in torch_rows] == [2, 2, 6, 3, 3, 3, 3, 3, 2]
    assert set(keras_rows[0]) == {*torch_rows[0], "loss"}  # one format, Keras' with the loss it computes
    for key in ("epoch", "step", "batch_size", "ga_steps", "micro_batch", "lr"):
        assert [r[key] for r in keras_rows] == [r[key] for r in torch_rows], key
    assert torch_controller.batches == keras_controller.batches and torch_controller.changes == keras_controller.changes
    assert max_difference(keras_model, big_batch_reference(x, y, keras_rows, 3, lambda: keras.optimizers.SGD(
        0.05, momentum=0.9))) < 1e-12  # and Keras trained those samples, each update one big-batch step


def test_both_frameworks_hold_the_batch_at_the_same_update(float64):
    """Held after 30 samples: update 3 starts at 40 (8, 8, then the script's 24), so it and every
    later update keep 24 and none is split to measure the noise: the 1 sample left after update 3
    (9 of the 10 left) runs whole as update 4 (without the hold update 4 measures, so it sits epoch
    0 out), and the script's later proposals are not asked for."""
    x, y = data(50)
    torch_rows, torch_controller = torch_run(x, y, Clock(), hold_after=30)
    keras_model, keras_rows, keras_controller = keras_run(x, y, hold_after=30)
    assert [r["batch_size"] for r in torch_rows] == [8, 8, 24, 9, 1, 24, 24, 2]
    assert [r["ga_steps"] for r in torch_rows] == [2, 2, 6, 3, 1, 6, 6, 1]
    for key in ("epoch", "step", "batch_size", "ga_steps", "micro_batch", "lr"):
        assert [r[key] for r in keras_rows] == [r[key] for r in torch_rows], key
    assert torch_controller.changes == keras_controller.changes == [(2, 8, 24, math.inf)]
    assert max_difference(keras_model, big_batch_reference(x, y, keras_rows, 3, lambda: keras.optimizers.SGD(
        0.05, momentum=0.9))) < 1e-12


def test_a_keras_run_resumed_after_its_hold_holds_on(float64):
    """A controller saved at the end of epoch 0 of that held run resumes held: the proposal its
    script makes after update 5 is not asked for, and epoch 1 is 24, 24 and the 2 left."""
    x, y = data(50)
    _, first_rows, first = keras_run(x, y, epochs=1, hold_after=30)
    resumed = ScriptedController({6: 12}, 4, 1, noise_every=4, **SETTINGS)
    resumed.load_state_dict(first.state_dict())
    model = mlp()
    model.compile(NoiseOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), loss="mse")
    rows = fit_adaptive(model, x, y, resumed, base_lr=0.05, rule="sqrt", epochs=1, seed=3, hold_after=30)
    assert [r["batch_size"] for r in first_rows] == [8, 8, 24, 9, 1]
    assert [r["batch_size"] for r in rows] == [24, 24, 2] and resumed.changes == first.changes


def test_both_frameworks_time_their_updates_alike(float64):
    """A micro-step of m samples costs a·m seconds and an update c: whichever way the framework
    runs its update (torch after the last micro-step, Keras inside it), every timed update gives
    the throughput model its cycle k·a·m + c and its single-micro-step update a·m + c. Untimed:
    what follows a pause (torch: an epoch's first update, after the user's loop ran), and in
    Keras the first update at each micro-batch size (it may compile)."""
    x, y = data(50)
    torch_rows, torch_controller = torch_run(x, y, Clock())
    _, keras_rows, keras_controller = keras_run(x, y, Clock())
    for controller, rows in ((torch_controller, torch_rows), (keras_controller, keras_rows)):
        times = controller.throughput.state_dict()["times"]
        assert len(times) >= 3  # several micro-batches and GA steps
        for micro, steps, seconds in times:
            expected = steps * Clock.per_sample * micro + Clock.per_update
            assert seconds == pytest.approx([expected] * len(seconds), rel=1e-9), (micro, steps)
        for row in rows:
            expected = row["ga_steps"] * Clock.per_sample * row["micro_batch"] + Clock.per_update
            assert row["seconds"] is None or row["seconds"] == pytest.approx(expected, rel=1e-9)
    assert [r["step"] for r in torch_rows if r["seconds"] is None] == [0, 4]  # each epoch's first
    assert [r["step"] for r in keras_rows if r["seconds"] is None] == [0, 3, 8]  # micro-batches 4, 3, 1 first


def drive(schedule: AdaptiveSchedule, updates: int) -> AdaptiveRun:
    """Feed a run the same measurements whichever framework built its controller: each update
    timed by one cost model, its noise scale growing from 50 to 2,000."""
    run = AdaptiveRun(schedule, "adascale")
    for update in range(updates):
        batch = schedule.sizes[update]
        micro = int(schedule.micro_sizes([batch], update)[0])
        steps = batch // (micro * schedule.num_replicas)
        cycle = steps * (0.002 + 1e-4 * micro) + 0.05
        noise = NoiseEstimate(grad_sq=1.0, trace=50.0 + 1950.0 * update / updates)
        run.record(batch, micro, steps, (cycle, cycle - (steps - 1) * (0.002 + 1e-4 * micro)), noise)
        run.finish(0, run.lr(0.1, batch), log_change=False)
    return run


def test_the_same_measurements_make_the_same_decisions_in_both_frameworks():
    """The controller AdaptiveSampler builds and the one docs/adaptive.md has Keras users build
    (GoodputController(..., policy="error")) are one: the same candidates, the same gating
    (min_estimates, interval), the same decisions and rows from the same measurements."""
    torch_sampler = AdaptiveSampler(100_000, base_batch=32, max_batch=2048, max_device_batch=64, num_replicas=2,
                                    rank=0)
    keras_controller = GoodputController(64, 2, ref_batch_size=32, max_batch=2048, policy="error")
    torch_run_ = drive(torch_sampler.schedule, 150)
    keras_run_ = drive(AdaptiveSchedule(100_000, keras_controller), 150)
    assert len(keras_controller.changes) >= 3 and torch_sampler.controller.changes == keras_controller.changes
    assert torch_sampler.controller.batches == keras_controller.batches
    assert keras_controller.changes[0][0] == 20  # after 20 estimates, at a 10th update
    assert len(torch_run_.history) == len(keras_run_.history) == 150
    for a, b in zip(torch_run_.history, keras_run_.history, strict=True):
        assert a.keys() == b.keys() and all(a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]) for k in a)

