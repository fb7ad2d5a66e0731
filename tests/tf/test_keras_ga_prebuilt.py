"""Run:AI's prebuilt Keras GA optimizers and the ``reduction`` switch of the Keras GA wrapper.

References are the plain Keras optimizer stepping once on the whole batch, in float64."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import tensorflow as tf
from tf_common import data, keras, max_difference, mlp

import aikit.ga.TF.optimizers as ga
from aikit.core.errors import InvalidValue

# Run:AI's AIkit listed these by hand; aikit makes one for every optimizer algorithm Keras ships
ORIGINAL = ["SGD", "RMSprop", "Adagrad", "Adadelta", "Adam", "Adamax", "Nadam"]
ALGORITHMS = sorted(name for name in dir(keras.optimizers)
                    if inspect.isclass(cls := getattr(keras.optimizers, name))
                    and issubclass(cls, keras.optimizers.Optimizer)
                    and name not in ("Optimizer", "LossScaleOptimizer", "MultiOptimizer"))


def test_every_keras_optimizer_algorithm_has_a_prebuilt_ga_optimizer_of_its_name():
    assert set(ORIGINAL) <= set(ALGORITHMS)
    assert sorted(ga.PREBUILT) == ALGORITHMS
    for name in ALGORITHMS:
        prebuilt = getattr(ga, name)
        assert issubclass(prebuilt, ga.Optimizer) and prebuilt.__name__ == name
        assert prebuilt.inner_class is getattr(keras.optimizers, name)
    # the wrapper keeps its name; Keras' base class and its wrappers of other optimizers have no GA form
    assert not hasattr(ga, "LossScaleOptimizer") and not hasattr(ga, "MultiOptimizer")


def gradients(model, x, y, reduction: str):
    with tf.GradientTape() as tape:
        squares = tf.square(model(x) - y)
        loss = tf.reduce_mean(squares) if reduction == "mean" else tf.reduce_sum(squares)
    return tape.gradient(loss, model.trainable_variables)


@pytest.mark.parametrize("name", ALGORITHMS)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_prebuilt_ga_equals_the_big_batch_step_of_its_optimizer(float64, name, reduction):
    """``Name(steps, learning_rate=...)`` over 3 micro-batches equals ``keras.optimizers.Name`` on
    the whole batch, under a mean loss (the default) or a summed one (``reduction="sum"``)."""
    x, y = data(24)
    big, small = mlp(), mlp()
    plain = getattr(keras.optimizers, name)(learning_rate=0.01)
    prebuilt = getattr(ga, name)(3, learning_rate=0.01, reduction=reduction)
    for u in range(2):
        plain.apply(gradients(big, x[u * 12:(u + 1) * 12], y[u * 12:(u + 1) * 12], reduction), big.trainable_variables)
    for m in range(6):
        prebuilt.apply(gradients(small, x[m * 4:(m + 1) * 4], y[m * 4:(m + 1) * 4], reduction),
                       small.trainable_variables)
    assert max_difference(big, small) < 1e-10
    assert int(prebuilt.iterations) == 2 and isinstance(prebuilt, ga.Optimizer)


def test_the_sum_switch_applies_steps_times_the_mean_for_sgd(float64):
    x, y = data(12)
    start, mean, summed = mlp(), mlp(), mlp()
    for model, reduction in ((mean, "mean"), (summed, "sum")):
        optimizer = ga.SGD(3, 0.01, reduction=reduction)
        for m in range(3):
            optimizer.apply(gradients(model, x[m * 4:(m + 1) * 4], y[m * 4:(m + 1) * 4], "mean"),
                            model.trainable_variables)
    for s, a, b in zip(start.get_weights(), mean.get_weights(), summed.get_weights(), strict=True):
        np.testing.assert_allclose(b - s, 3 * (a - s), rtol=1e-9, atol=1e-14)


def test_a_prebuilt_optimizer_round_trips_its_config_as_itself():
    adam = ga.Adam(4, learning_rate=0.003, beta_1=0.8, reduction="sum")
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(adam))
    assert type(restored) is ga.Adam and restored.get_config() == adam.get_config()
    assert (restored.steps, restored.reduction, restored.optimizer.beta_1) == (4, "sum", 0.8)
    assert type(ga.Optimizer.from_config(adam.get_config())) is ga.Optimizer


def test_a_bad_reduction_is_named():
    with pytest.raises(InvalidValue, match="reduction must be 'mean' or 'sum', got 'total'"):
        ga.Optimizer(keras.optimizers.SGD(0.1), 2, reduction="total")
    with pytest.raises(InvalidValue, match="reduction must be 'mean' or 'sum', got 'total'"):
        ga.SGD(2, reduction="total")
