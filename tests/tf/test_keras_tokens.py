"""Token-weighted accumulation for Keras (one device): a masked per-token mean loss, or one
weighted by ``sample_weight``, accumulates to the per-token mean of the whole update, in ``fit``
(TokenMean) and in custom loops (``apply(..., weight=n)``), and not to the mean of the
micro-batch means."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from keras_tokens_case import big_batch, keras, model, sequences, token_mean

from aikit.core.errors import InvalidType, InvalidValue
from aikit.ga.TF.noise import NoiseOptimizer
from aikit.ga.TF.optimizers import Optimizer
from aikit.ga.TF.tokens import TokenMean

WINDOWS = [np.arange(0, 8), np.arange(8, 16), np.arange(16, 24)]  # 3 updates of 4 micro-batches of 2


def adam():
    return keras.optimizers.Adam(0.05, global_clipnorm=0.5)  # a clip that bites: applied to the update's mean


def difference(a: keras.Model, b: keras.Model) -> float:
    return max(float(np.abs(p - q).max()) for p, q in zip(a.get_weights(), b.get_weights(), strict=True))


def custom_loop(weigh: bool, make_optimizer=adam, sample_weight=None) -> tuple[keras.Model, Optimizer]:
    inputs, labels = sequences()
    net = model()
    optimizer = Optimizer(make_optimizer(), steps=4)
    for window in WINDOWS:
        for part in np.array_split(window, 4):
            weight = None if sample_weight is None else sample_weight[part]
            with tf.GradientTape() as tape:
                loss, terms = token_mean(net, inputs[part], labels[part], weight)
            grads = tape.gradient(loss, net.trainable_variables)
            optimizer.apply(grads, net.trainable_variables, **({"weight": terms} if weigh else {}))
    return net, optimizer


def test_the_micro_batches_hold_unequal_tokens_some_none():
    _, labels = sequences()
    tokens = [int((labels[part] != -100).sum()) for part in np.array_split(np.arange(24), 12)]
    assert len(set(tokens)) > 4 and min(tokens) >= 0
    assert 0 in [int((labels[[i]] != -100).sum()) for i in range(24)]


def test_a_custom_loop_with_weight_equals_the_big_batch(float64):
    net, optimizer = custom_loop(weigh=True)
    assert difference(net, big_batch(adam, WINDOWS)) < 1e-12
    assert int(optimizer.iterations) == 3 and optimizer.accumulated == 0


def test_the_mean_of_micro_batch_means_is_far_from_it(float64):
    """What the test above would see without the weights: the mean of micro-batch means."""
    net, _ = custom_loop(weigh=False)
    assert difference(net, big_batch(adam, WINDOWS)) > 1e-4


def test_sample_weights_accumulate_to_the_weighted_big_batch(float64):
    weights = np.random.default_rng(0).uniform(0.0, 2.0, size=(32, 16))
    net, _ = custom_loop(weigh=True, sample_weight=weights)
    assert difference(net, big_batch(adam, WINDOWS, weights)) < 1e-12


@pytest.mark.parametrize("with_sample_weight", [False, True], ids=["masked", "sample_weight"])
def test_fit_with_token_mean_equals_the_big_batch(float64, with_sample_weight):
    inputs, labels = sequences()
    weights = np.random.default_rng(1).uniform(0.0, 2.0, size=labels.shape) if with_sample_weight else None
    net = model()
    optimizer = Optimizer(adam(), steps=4)
    net.compile(optimizer=optimizer, loss=TokenMean(optimizer, from_logits=True))
    net.fit(inputs[:24], labels[:24], sample_weight=None if weights is None else weights[:24], batch_size=2,
            epochs=1, shuffle=False, verbose=0)
    assert difference(net, big_batch(adam, WINDOWS, weights)) < 1e-12
    assert int(optimizer.iterations) == 3


def test_fit_reports_the_per_token_mean_of_its_micro_batches(float64):
    inputs, labels = sequences()
    net = model()
    optimizer = Optimizer(keras.optimizers.SGD(0.0), steps=2)
    net.compile(optimizer=optimizer, loss=TokenMean(optimizer, from_logits=True))
    logged = net.evaluate(inputs[:2], labels[:2], batch_size=2, verbose=0)
    assert logged == pytest.approx(float(token_mean(net, inputs[:2], labels[:2])[0]), rel=1e-12)


def test_an_update_without_any_token_steps_on_a_zero_gradient(float64):
    """A graph cannot refuse it: every micro-batch weighs 0, even one whose mean is NaN."""
    inputs, labels = sequences()
    net = model()
    before = net.get_weights()
    optimizer = Optimizer(keras.optimizers.SGD(0.5), steps=2)
    for part in ([2], [7]):  # prompts only: no token scored
        with tf.GradientTape() as tape:
            loss, terms = token_mean(net, inputs[part], labels[part])  # 0 / 0: NaN
        assert np.isnan(float(loss)) and float(terms) == 0
        optimizer.apply(tape.gradient(loss, net.trainable_variables), net.trainable_variables, weight=terms)
    assert int(optimizer.iterations) == 1
    for got, want in zip(net.get_weights(), before, strict=True):
        np.testing.assert_array_equal(got, want)


def test_misuses_are_refused_by_name(float64):
    net = model()
    grads = [tf.zeros_like(v) for v in net.trainable_variables]
    with pytest.raises(InvalidValue, match=r"weight must be a number >= 0, got -2"):
        Optimizer(keras.optimizers.SGD(0.1), 2).apply(grads, net.trainable_variables, weight=-2)
    with pytest.raises(InvalidValue, match=r"this optimizer sums the micro-batch gradients \(reduction='sum'\)"):
        Optimizer(keras.optimizers.SGD(0.1), 2, reduction="sum").apply(grads, net.trainable_variables, weight=3)
    with pytest.raises(InvalidValue, match=r"NoiseOptimizer measures gradient noise from equal micro-batch means, so "
                                           r"it takes no weight"):
        NoiseOptimizer(keras.optimizers.SGD(0.1), 2).apply(grads, net.trainable_variables, weight=3)
    with pytest.raises(InvalidType, match=r"TokenMean declares each micro-batch's tokens to aikit's GA optimizer, "
                                          r"got SGD"):
        TokenMean(keras.optimizers.SGD(0.1))


@pytest.fixture(scope="module")
def mirrored() -> dict:
    run = subprocess.run([sys.executable, str(Path(__file__).with_name("keras_tokens_mirrored_checks.py"))],
                         capture_output=True, text=True, timeout=600)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULTS ")]
    assert run.returncode == 0 and lines, f"failed:\n{run.stdout[-3000:]}\n{run.stderr[-5000:]}"
    return json.loads(lines[-1][len("RESULTS "):])


@pytest.mark.slow
def test_two_mirrored_replicas_with_unequal_tokens_equal_the_big_batch(mirrored):
    assert any(a != b for a, b in mirrored["replica_tokens"])  # the replicas hold different token counts
    assert mirrored["fit_updates"] == mirrored["custom_updates"] == 3
    assert mirrored["fit_difference"] < 1e-12
    assert mirrored["custom_difference"] < 1e-12
