"""aikit's Keras GA wrapper on the backend of this process: every update equals one big-batch
step of plain Keras on the same backend (float64), through ``fit``: optimizers with momentum,
weight decay and an LR schedule (which counts updates), token weights over ragged micro-batches
(``TokenMean``, masks and ``sample_weight``), an inf/NaN update skipped in the compiled step, a
model saved mid-update resumed, ``steps`` changed between updates."""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest
from common import EXACT, PerTokenMean, data, difference, mlp

from aikit.core.errors import InvalidValue
from aikit.keras import Optimizer, TokenMean

OPTIMIZERS = {
    "adam_schedule": lambda: keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(0.05, 1, 0.7)),
    "adamw": lambda: keras.optimizers.AdamW(0.05, weight_decay=0.1, global_clipnorm=0.5),
    "sgd_momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
}


def fitted(optimizer, batch_size: int, x, y, epochs: int = 2, loss="mse", **compile_kwargs) -> keras.Model:
    model = mlp()
    model.compile(optimizer, loss=loss, **compile_kwargs)
    model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0)
    return model


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_update_equals_a_big_batch_step_of_plain_keras(float64, name):
    x, y = data(48)
    ga = fitted(Optimizer(OPTIMIZERS[name](), steps=4), 4, x, y)
    big = fitted(OPTIMIZERS[name](), 16, x, y)
    assert difference(ga, big) < EXACT
    assert int(ga.optimizer.iterations) == int(big.optimizer.iterations) == 6
    if name == "sgd_momentum":  # the same sums as Keras' own GA, which accumulates these micro-batches too
        theirs = fitted(keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True, gradient_accumulation_steps=4), 4, x, y)
        assert difference(ga, theirs) < 1e-12
    assert int(ga.optimizer.micro_steps) == 24 and ga.optimizer.accumulated == 0


def test_a_summed_loss_gets_the_sum_of_the_micro_batch_gradients_as_the_big_batch_does(float64):
    """A loss with reduction="sum": the GA optimizer takes the compiled loss's reduction (its
    mean would train 1/steps too slowly); one given that contradicts the loss is refused by name."""
    x, y = data(48)
    summed = keras.losses.MeanSquaredError(reduction="sum")
    ga = fitted(Optimizer(keras.optimizers.SGD(0.01, momentum=0.9), steps=4), 4, x, y, loss=summed)
    big = fitted(keras.optimizers.SGD(0.01, momentum=0.9), 16, x, y, loss=summed)
    assert ga.optimizer.reduction == "sum" and difference(ga, big) < EXACT
    for reduction, loss in (("mean", summed), ("sum", "mse")):
        with pytest.raises(InvalidValue, match=f"needs reduction='{'sum' if reduction == 'mean' else 'mean'}'.*"
                                               f"made with reduction='{reduction}'.*leave reduction out"):
            fitted(Optimizer(keras.optimizers.SGD(0.01), steps=4, reduction=reduction), 4, x, y, loss=loss)


def test_keras_own_ga_runs_lr_schedules_on_micro_steps_where_aikit_counts_updates(float64):
    x, y = data(48)
    ours = fitted(Optimizer(OPTIMIZERS["adam_schedule"](), steps=4), 4, x, y)
    theirs = fitted(keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(0.05, 1, 0.7),
                                          gradient_accumulation_steps=4), 4, x, y)
    big = fitted(OPTIMIZERS["adam_schedule"](), 16, x, y)
    assert difference(ours, big) < EXACT < difference(theirs, big)


def test_token_weights_over_ragged_micro_batches_equal_the_per_token_mean_of_the_update(float64):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(24, 4))
    labels = rng.integers(0, 5, size=(24, 3))
    labels[rng.random(labels.shape) < 0.4] = -100  # ignored tokens: micro-batches hold unequal counts
    labels[[3, 10]] = -100  # and some none at all
    weights = rng.integers(0, 3, size=24).astype("float64")  # sample_weight: more raggedness

    def model():
        keras.utils.set_random_seed(2)
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(15), keras.layers.Reshape((3, 5))])

    ga, optimizer = model(), Optimizer(keras.optimizers.AdamW(0.05, weight_decay=0.1), steps=4)
    ga.compile(optimizer, loss=TokenMean(optimizer, from_logits=True))
    ga.fit(x, labels, sample_weight=weights, batch_size=2, epochs=1, shuffle=False, verbose=0)
    big = model()
    big.compile(keras.optimizers.AdamW(0.05, weight_decay=0.1), loss=PerTokenMean())
    big.fit(x, labels, sample_weight=weights, batch_size=8, epochs=1, shuffle=False, verbose=0)
    assert difference(ga, big) < EXACT
    assert int(optimizer.iterations) == 3


def test_an_inf_or_nan_update_is_skipped_in_the_compiled_step_and_counted(float64):
    x, y = data(48)
    poisoned = y.copy()
    poisoned[20] = np.nan  # in the second update's window (samples 16..31)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ga = fitted(Optimizer(keras.optimizers.SGD(0.1, momentum=0.9), steps=4), 4, x, poisoned, epochs=1)
    keep = np.r_[0:16, 32:48]
    big = fitted(keras.optimizers.SGD(0.1, momentum=0.9), 16, x[keep], y[keep], epochs=1)
    assert difference(ga, big) < EXACT
    assert (ga.optimizer.skipped, int(ga.optimizer.iterations)) == (1, 2)
    assert [str(w.message) for w in caught if "skipped" in str(w.message)], "fit warns at its end"


@pytest.mark.parametrize("dtype", ["float32", "float64"])  # (torch checks float32 sums with AMP's kernel)
def test_an_eager_apply_skips_a_nan_and_warns_once(dtype):
    weights = keras.Variable(np.ones(3), dtype=dtype)
    ga = Optimizer(keras.optimizers.SGD(0.1), steps=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for poison in (np.nan, np.inf, 1.0):  # a NaN, then an inf, skip their updates; the third applies
            ga.apply([keras.ops.convert_to_tensor([poison, 1.0, 1.0], dtype)], [weights])
            ga.apply([keras.ops.convert_to_tensor([1.0, 1.0, 1.0], dtype)], [weights])
            if poison != 1.0:
                assert keras.ops.convert_to_numpy(weights).tolist() == [1.0, 1.0, 1.0]
    assert np.allclose(keras.ops.convert_to_numpy(weights), 0.9, rtol=0, atol=1e-6)
    assert (ga.skipped, ga.skipped_in_a_row, int(ga.iterations)) == (2, 0, 1)
    assert len([w for w in caught if "skipped" in str(w.message)]) == 1


def test_a_model_saved_mid_update_resumes_to_the_same_bits(float64, tmp_path):
    x, y = data(24)
    whole = fitted(Optimizer(keras.optimizers.Adam(0.05), steps=4), 4, x, y, epochs=1)
    half = fitted(Optimizer(keras.optimizers.Adam(0.05), steps=4), 4, x[:8], y[:8], epochs=1)
    assert half.optimizer.accumulated == 2
    half.save(tmp_path / "half.keras")
    resumed = keras.models.load_model(tmp_path / "half.keras")
    assert resumed.optimizer.accumulated == 2
    resumed.fit(x[8:], y[8:], batch_size=4, epochs=1, shuffle=False, verbose=0)
    assert difference(resumed, whole) == 0


def test_steps_change_between_updates(float64):
    x, y = data(24)
    model = mlp()
    optimizer = Optimizer(keras.optimizers.SGD(0.1), steps=2)
    model.compile(optimizer, loss="mse")
    model.fit(x[:8], y[:8], batch_size=4, epochs=1, shuffle=False, verbose=0)  # 1 update of 2 micro-batches
    optimizer.steps = 4
    model.fit(x[8:24], y[8:24], batch_size=4, epochs=1, shuffle=False, verbose=0)  # 1 update of 4
    big = mlp()
    big.compile(keras.optimizers.SGD(0.1), loss="mse")
    for window in (slice(0, 8), slice(8, 24)):
        big.fit(x[window], y[window], batch_size=24, epochs=1, shuffle=False, verbose=0)
    assert difference(model, big) < EXACT and int(optimizer.iterations) == 2
