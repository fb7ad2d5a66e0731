"""aikit's elastic Keras training on the backend of this process: ``init`` plans the devices the
backend trains on, ``Model`` and ``fit_trace`` equal plain Keras' big-batch steps, ``fit_adaptive``
measures the noise; on JAX over two (virtual CPU) devices through ``keras.distribution``; and
what a backend cannot do is refused by name."""

from __future__ import annotations

import sys
import types

import keras
import numpy as np
import pytest
from common import BACKEND, EXACT, data, difference, mlp

import aikit.keras.elastic as elastic
from aikit.core.errors import InvalidState, InvalidValue
from aikit.core.goodput import GoodputController
from aikit.keras import NoiseOptimizer, Optimizer

DEVICES = len(keras.distribution.list_devices()) if BACKEND == "jax" else 1


def big_batch_steps(x, y, windows, lrs) -> keras.Model:
    model = mlp()
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    model.compile(optimizer, loss="mse")
    for window, lr in zip(windows, lrs, strict=True):
        optimizer.learning_rate = lr
        model.fit(x[window], y[window], batch_size=len(window), epochs=1, shuffle=False, verbose=0)
    return model


def test_one_device_model_fit_equals_the_big_batch(float64):
    plan = elastic.init(16, 4, gpus=1, verbose=False)
    assert (plan.steps, plan.batch_size, elastic.steps) == (4, 4, 4)
    x, y = data(48)
    model = elastic.Model(mlp())
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    model.fit(x, y, epochs=1, shuffle=False, verbose=0)
    big = big_batch_steps(x, y, [np.arange(i, i + 16) for i in (0, 16, 32)], [0.1] * 3)
    assert difference(model.model, big) < EXACT
    assert int(model.optimizer.iterations) == 3


def test_model_fit_of_a_summed_loss_equals_the_big_batch(float64):
    """elastic.Model wraps the optimizer in GA with the compiled loss's reduction: a loss with
    reduction="sum" gets the sum of its micro-batch gradients, the big batch's gradient."""
    elastic.init(16, 4, gpus=1, verbose=False)
    x, y = data(48)
    summed = keras.losses.MeanSquaredError(reduction="sum")
    model = elastic.Model(mlp())
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), loss=summed)
    model.fit(x, y, epochs=1, shuffle=False, verbose=0)
    big = mlp()
    big.compile(keras.optimizers.SGD(0.01, momentum=0.9), loss=summed)
    big.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    assert difference(model.model, big) < EXACT
    with pytest.raises(InvalidValue, match=r"needs reduction='sum'.*made with reduction='mean'"):
        elastic.Model(mlp()).compile(Optimizer(keras.optimizers.SGD(0.01), 4, reduction="mean"), loss=summed)


def test_model_fit_names_x_and_y_of_different_lengths():
    elastic.init(8, 4, gpus=1, verbose=False)
    model = elastic.Model(mlp())
    model.compile(keras.optimizers.SGD(0.1), loss="mse")
    x, y = data(10)
    with pytest.raises(InvalidValue, match=r"`Model.fit\(x, y\)` holds arrays of different lengths \(x 10, y 9\): "
                                           "give one entry per sample in each"):
        model.fit(x, y[:9], epochs=1, verbose=0)
    with pytest.raises(InvalidValue, match=r"\(x 10, y 10, sample_weight 8\)"):
        model.fit(x, y, sample_weight=np.ones(8), epochs=1, verbose=0)


def test_fit_trace_sets_every_updates_batch_and_lr(float64):
    elastic.init(16, 4, gpus=1, verbose=False)
    x, y = data(40)
    model = mlp()
    model.compile(Optimizer(keras.optimizers.SGD(0.1, momentum=0.9), 1), loss="mse")
    log = elastic.fit_trace(model, x, y, [8, 16, 16], micro_batch=4, base_lr=0.1, ref_batch_size=16,
                            rule="linear", shuffle=False)
    assert [row["batch_size"] for row in log] == [8, 16, 16] and [row["ga_steps"] for row in log] == [2, 4, 4]
    starts = np.cumsum([0, 8, 16])
    windows = [np.arange(s, s + b) for s, b in zip(starts, [8, 16, 16], strict=True)]
    big = big_batch_steps(x, y, windows, [row["lr"] for row in log])
    assert difference(model, big) < EXACT


def test_fit_adaptive_measures_the_noise_of_every_update(float64):
    x, y = data(64)
    model = mlp()
    model.compile(NoiseOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
    controller = GoodputController(4, 1, ref_batch_size=8, min_batch=8, max_batch=32, policy="error",
                                   min_estimates=2, interval=2)
    rows = elastic.fit_adaptive(model, x, y, controller, base_lr=0.05, rule="sqrt", epochs=1, shuffle=False)
    assert rows and all(row["ga_steps"] >= 2 for row in rows)
    assert controller.noise.measured is not None


@pytest.mark.skipif(BACKEND != "torch", reason="Keras' torch trainer only")
def test_torch_refuses_more_than_its_one_device():
    with pytest.raises(InvalidValue, match=r"Keras 3\.15's torch trainer, one device.*KERAS_BACKEND=jax"):
        elastic.init(16, 4, gpus=2, verbose=False)


def test_a_backend_switched_after_import_is_refused(monkeypatch):
    other = types.SimpleNamespace(backend=types.SimpleNamespace(backend=lambda: "numpy"))
    monkeypatch.setitem(sys.modules, "keras", other)
    with pytest.raises(InvalidState, match=f"imported with Keras on '{BACKEND}', but Keras now runs on 'numpy'"):
        elastic.init(16, 4, verbose=False)


jax_devices = pytest.mark.skipif(BACKEND != "jax" or DEVICES < 2, reason="JAX over two devices")


@jax_devices
def test_jax_data_parallel_over_two_devices_equals_one_devices_big_batch(float64):
    plan = elastic.init(16, 4, verbose=False)  # every device: DataParallel over 2
    assert (plan.gpus, plan.steps) == (2, 2) and type(elastic.distribution).__name__ == "DataParallel"
    try:
        x, y = data(48)
        model = elastic.Model(mlp())  # built after init: laid out on the mesh
        model.compile(keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
        model.fit(x, y, epochs=1, shuffle=False, verbose=0)
        weights = model.model.get_weights()
        trace_model = mlp()
        trace_model.compile(Optimizer(keras.optimizers.SGD(0.1, momentum=0.9), 1), loss="mse")
        elastic.fit_trace(trace_model, x, y, [16, 16, 16], micro_batch=4, base_lr=0.1, ref_batch_size=16,
                          rule="constant", shuffle=False)
        trace_weights = trace_model.get_weights()
    finally:
        keras.distribution.set_distribution(None)
    big = big_batch_steps(x, y, [np.arange(i, i + 16) for i in (0, 16, 32)], [0.1] * 3)
    assert max(float(np.abs(a - b).max()) for a, b in zip(weights, big.get_weights(), strict=True)) < 1e-12
    # fit_trace deals the window's micro-batches round-robin to the 2 devices: the same samples per update
    assert max(float(np.abs(a - b).max()) for a, b in zip(trace_weights, big.get_weights(), strict=True)) < 1e-12


@jax_devices
def test_jax_refuses_a_model_built_before_the_distribution_and_a_batch_the_devices_cannot_split(float64):
    early = mlp()  # on one device
    early.compile(Optimizer(keras.optimizers.SGD(0.1), 1), loss="mse")
    elastic.init(16, 4, verbose=False)
    try:
        x, y = data(40)
        with pytest.raises(InvalidState, match=r"made before keras\.distribution's DataParallel was set.*"
                                               "incompatible devices"):
            elastic.fit_trace(early, x, y, [16], micro_batch=4, base_lr=0.1, ref_batch_size=16, rule="constant")
        model = elastic.Model(mlp())
        model.compile(keras.optimizers.SGD(0.1), loss="mse")
        with pytest.raises(InvalidValue, match=r"last batch of 5, which does not split over the 2 devices.*21167"):
            model.fit(x[:37], y[:37], epochs=1, verbose=0)
    finally:
        keras.distribution.set_distribution(None)


@jax_devices
def test_jax_lets_kerass_own_error_through_for_a_model_compiled_before_the_distribution():
    """Keras' fit of a model compiled before set_distribution fails in its first jitted step with
    JAX's "incompatible devices"; aikit's optimizer, asked at the fit's end for its skips, must not
    hide that error behind its own (the variables' values were never put back)."""
    early = mlp()
    early.compile(Optimizer(keras.optimizers.SGD(0.1), 2), loss="mse")
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=keras.distribution.list_devices()))
    try:
        x, y = data(16)
        with pytest.raises(ValueError, match="incompatible devices"):
            early.fit(x, y, batch_size=4, epochs=1, verbose=0)
    finally:
        keras.distribution.set_distribution(None)
