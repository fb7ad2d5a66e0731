"""The Keras LR finder and AutoLRS callback on the backend of this process: the range test runs
through aikit's GA optimizer (its updates counted, the LR climbing), ``reset`` puts the model and
optimizer back, AutoLRS sets the LR of ``fit``'s steps through ``Callback.model``."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from common import data, mlp

from aikit.keras import Optimizer
from aikit.keras.autolrs import AutoLRS
from aikit.keras.lr_finder import LRFinder


def test_the_range_test_runs_through_the_ga_optimizer_and_reset_restores(float64):
    x, y = data(64)
    model = mlp()
    optimizer = Optimizer(keras.optimizers.SGD(1e-4), steps=2)
    model.compile(optimizer, loss="mse")
    before = [w.copy() for w in model.get_weights()]
    finder = LRFinder(model)
    finder.range_test((x, y), val_data=(x[:16], y[:16]), end_lr=1.0, num_iter=6, batch_size=8, progress_bar=False)
    assert len(finder.history["lr"]) == 6 and finder.history["lr"][0] < finder.history["lr"][-1]
    assert all(np.isfinite(finder.history["loss"]))
    assert int(optimizer.iterations) == 6 and optimizer.accumulated == 0
    finder.reset()
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))
    assert int(keras.ops.convert_to_numpy(optimizer.iterations)) == 0


def test_the_range_test_accumulates_without_the_ga_optimizer(float64):
    x, y = data(64)
    model = mlp()
    model.compile(keras.optimizers.Adam(1e-4), loss="mse")
    finder = LRFinder(model)
    finder.range_test((x, y), end_lr=1.0, num_iter=4, batch_size=8, accumulation_steps=2, progress_bar=False)
    assert len(finder.history["lr"]) == 4 and int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 4


def test_autolrs_sets_the_lr_of_fits_steps(float64):
    x, y = data(128)
    model = mlp()
    model.compile(keras.optimizers.SGD(0.01), loss="mse")

    def val_fn() -> float:
        return float(keras.ops.convert_to_numpy(keras.ops.mean(keras.ops.square(model(x[:32]) - y[:32]))))

    callback = AutoLRS(val_fn, min_lr=1e-3, max_lr=0.1, total_steps=48, tau=16, trials=2, seed=0)
    model.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0, callbacks=[callback])
    lrs = [lr for _, lr in callback.controller.schedule()]
    assert lrs and max(lrs) <= 0.1 + 1e-12 and len(set(lrs)) > 1  # searched, within the range
    assert float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)) == pytest.approx(callback.lr)
