"""aikit.lr_finder.TF.LRFinder: the range test on a Keras 3 model (TensorFlow backend)."""

from __future__ import annotations

import math

import keras
import matplotlib
import numpy as np
import pytest
import tensorflow as tf

from aikit.core.lr_range import lr_sequence, read_history
from aikit.lr_finder.TF import LRFinder

matplotlib.use("Agg")


@pytest.fixture(autouse=True)
def _float64(float64):
    """Every test here in float64 (the fixture is in tests/conftest.py)."""
    yield


def data(samples=64, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, 3))
    return x, (x.sum(1, keepdims=True) ** 2)


def make_model(optimizer=None, loss="mse"):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=optimizer or keras.optimizers.SGD(1e-3, momentum=0.9), loss=loss)
    return model


def weights_equal(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_exp_history_holds_the_five_decades_and_the_lr_is_put_back():
    model = make_model(keras.optimizers.SGD(1e-5))
    finder = LRFinder(model)
    finder.range_test(data(), end_lr=1e-1, num_iter=5, diverge_th=math.inf, progress_bar=False)
    assert finder.history["lr"] == pytest.approx([1e-5, 1e-4, 1e-3, 1e-2, 1e-1], rel=1e-12)
    assert float(model.optimizer.learning_rate) == pytest.approx(1e-5, rel=1e-15)


def test_each_recorded_loss_is_the_loss_of_the_update_at_that_lr():
    """Keras' own train_on_batch with the same LRs and batches gives the same losses."""
    x, y = data()
    finder = LRFinder(make_model())
    finder.range_test((x, y), start_lr=1e-3, end_lr=0.5, num_iter=8, smooth_f=0, diverge_th=math.inf,
                      batch_size=8, shuffle=False, progress_bar=False)
    reference = make_model()
    losses = []
    for i, lr in enumerate(lr_sequence(1e-3, 0.5, 8)):
        reference.optimizer.learning_rate = lr
        losses.append(float(reference.train_on_batch(x[8 * i:8 * i + 8], y[8 * i:8 * i + 8])))
    assert finder.history["loss"] == pytest.approx(losses, rel=1e-9)
    for a, b in zip(finder.model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_an_accumulated_update_equals_the_update_on_the_concatenated_batch():
    runs = {}
    for batch_size, steps in [(8, 1), (4, 2)]:
        finder = LRFinder(make_model())
        finder.range_test(data(), end_lr=0.5, num_iter=6, accumulation_steps=steps, batch_size=batch_size,
                          shuffle=False, diverge_th=math.inf, progress_bar=False)
        runs[steps] = finder.history["loss"], finder.model.get_weights()
    assert runs[2][0] == pytest.approx(runs[1][0], rel=1e-12)
    for a, b in zip(runs[2][1], runs[1][1], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_accumulation_calls_the_criterion_accumulation_steps_times_per_iteration():
    calls = tf.Variable(0)

    def criterion(y_true, y_pred):
        calls.assign_add(1)
        return keras.losses.mean_squared_error(y_true, y_pred)

    finder = LRFinder(make_model(), criterion=criterion)
    finder.range_test(data(), end_lr=1e-2, num_iter=10, accumulation_steps=4, batch_size=4, progress_bar=False)
    assert int(calls.numpy()) == 40


def test_reset_restores_weights_and_every_optimizer_variable():
    model = make_model(keras.optimizers.Adam(1e-3))
    x, y = data()
    model.train_on_batch(x[:8], y[:8])  # Adam now has moments and an iteration count to lose
    weights = model.get_weights()
    optimizer_state = [v.numpy().copy() for v in model.optimizer.variables]
    finder = LRFinder(model)
    for _ in range(2):
        finder.range_test((x, y), end_lr=1.0, num_iter=6, progress_bar=False)
        assert not weights_equal(model.get_weights(), weights)
        finder.reset()
        assert weights_equal(model.get_weights(), weights)
        assert weights_equal([v.numpy() for v in model.optimizer.variables], optimizer_state)


def test_disk_cache_restores_and_is_removed(tmp_path):
    model = make_model()
    weights = model.get_weights()
    finder = LRFinder(model, memory_cache=False, cache_dir=str(tmp_path))
    finder.range_test(data(), end_lr=1.0, num_iter=4, progress_bar=False)
    finder.reset()
    assert weights_equal(model.get_weights(), weights)
    del finder
    assert list(tmp_path.iterdir()) == []


def test_validation_loss_is_the_mean_over_every_validation_sample():
    model = make_model()
    x_val, y_val = data(samples=20, seed=1)  # batches of 8, 8, 4
    finder = LRFinder(model)
    finder.range_test(data(), val_data=(x_val, y_val), end_lr=1e-2, num_iter=3, smooth_f=0, batch_size=8,
                      progress_bar=False)
    expected = float(keras.losses.mean_squared_error(y_val[:, 0], model(x_val, training=False)[:, 0]))
    assert finder.history["loss"][-1] == pytest.approx(expected, rel=1e-12)


def test_a_tf_data_dataset_with_sample_weights_is_accepted():
    x, y = data()
    weights = np.linspace(0.5, 1.5, len(x))
    dataset = tf.data.Dataset.from_tensor_slices((x, y, weights)).batch(16)
    finder = LRFinder(make_model())
    finder.range_test(dataset, end_lr=1e-2, num_iter=6, progress_bar=False)  # 6 > 4 batches: it repeats
    assert len(finder.history["loss"]) == 6


def test_a_nan_loss_stops_the_test():
    x, y = data()
    x[24] = np.nan  # in the fourth batch of 8
    finder = LRFinder(make_model())
    finder.range_test((x, y), end_lr=1e-2, num_iter=20, batch_size=8, shuffle=False, diverge_th=math.inf,
                      progress_bar=False)
    assert len(finder.history["loss"]) == 4
    assert math.isnan(finder.history["loss"][-1])


def test_a_diverging_loss_stops_the_test():
    finder = LRFinder(make_model(keras.optimizers.SGD(1e-3)))
    finder.range_test(data(), end_lr=1e3, num_iter=100, smooth_f=0, batch_size=8, progress_bar=False)
    losses = finder.history["loss"]
    assert len(losses) < 100
    assert losses[-1] > 5 * min(losses) or not math.isfinite(losses[-1])


def test_plot_suggestions_and_csv_are_shared_with_the_torch_finder(tmp_path):
    import matplotlib.pyplot as plt

    finder = LRFinder(make_model(keras.optimizers.SGD(1e-4)))
    finder.range_test(data(), end_lr=1.0, num_iter=20, batch_size=8, diverge_th=math.inf, progress_bar=False)
    fig, ax = plt.subplots()
    got_ax, lr = finder.plot(ax=ax, suggest_lr="valley")
    assert got_ax is ax and lr == finder.suggest_lr("valley")
    assert list(ax.lines[0].get_xdata()) == finder.history["lr"][10:-5]
    plt.close(fig)
    finder.to_csv(tmp_path / "history.csv")
    assert read_history(tmp_path / "history.csv") == finder.history


@pytest.mark.parametrize("make, error, message", [
    (lambda: LRFinder(make_model()).range_test([1, 2, 3, 4], num_iter=3), ValueError,
     "`train_data` has unsupported type: <class 'list'>. Expected a tf.data.Dataset"),
    (lambda: LRFinder(make_model()).range_test(data(), num_iter=1), ValueError,
     "num_iter must be an integer larger than 1"),
    (lambda: LRFinder(make_model()).range_test(data(), batch_size=0), ValueError,
     "batch_size must be a positive integer, got 0"),
    (lambda: LRFinder(keras.Sequential([keras.layers.Dense(1)]), keras.optimizers.SGD(1e-3), "mse"),
     ValueError, "the model is not built"),
    (lambda: LRFinder(make_model(keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(1e-3, 10, 0.9)))),
     RuntimeError, "the optimizer's learning rate is a LearningRateSchedule"),
])
def test_bad_input_is_refused_by_name(make, error, message):
    with pytest.raises(error) as raised:
        make()
    assert str(raised.value).startswith(message)


def test_a_downward_sweep_and_a_plot_before_any_test_are_refused_with_the_fix():
    model = make_model()
    finder = LRFinder(model)
    with pytest.raises(RuntimeError, match=r"^plot\(\) reads the range test's history, which is empty: run "
                                           r"range_test\(\) first$"):
        finder.plot()
    with pytest.raises(RuntimeError, match=r"run range_test\(\) first"):
        finder.suggest_lr()
    weights = model.get_weights()
    with pytest.raises(ValueError, match=r"^end_lr=0.0001 is not above the start LR 0.001 \(start_lr, or the "
                                         r"optimizer's LR when start_lr is None\): the range test climbs"):
        finder.range_test(data(), end_lr=1e-4, num_iter=5, progress_bar=False)
    assert weights_equal(model.get_weights(), weights) and finder.history == {"lr": [], "loss": []}


def test_an_uncompiled_model_needs_an_optimizer_and_a_loss():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="the model has no optimizer: compile it with one or pass optimizer="):
        LRFinder(model)
    with pytest.raises(ValueError, match="the model has no loss: compile it with one or pass criterion="):
        LRFinder(model, keras.optimizers.SGD(1e-3))
    finder = LRFinder(model, keras.optimizers.SGD(1e-3), "mse")
    finder.range_test(data(), end_lr=1e-2, num_iter=3, progress_bar=False)
    assert len(finder.history["loss"]) == 3


def test_mixed_precision_with_a_loss_scale_optimizer_tracks_the_float32_curve():
    keras.config.set_floatx("float32")
    x, y = (a.astype("float32") for a in data())
    histories = {}
    for policy in ["float32", "mixed_float16"]:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(8, activation="tanh", dtype=policy),
                                  keras.layers.Dense(1, dtype="float32")])
        optimizer = keras.optimizers.SGD(1e-3)
        if policy != "float32":
            # a scale at which no update overflows: a skipped update is made again on the next batch
            # (not counted, tested below), and the curves would then see different batches
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=2.0**12)
        model.compile(optimizer=optimizer, loss="mse")
        finder = LRFinder(model)  # builds the optimizer: its slots and loss scale exist from here
        before = [v.numpy().copy() for v in optimizer.variables]
        finder.range_test((x, y), end_lr=0.1, num_iter=10, batch_size=8, shuffle=False, progress_bar=False)
        histories[policy] = finder.history["loss"]
        assert int(optimizer.iterations.numpy()) == 10  # no update skipped
        finder.reset()
        assert weights_equal([v.numpy() for v in optimizer.variables], before)  # the loss scale too
    assert histories["mixed_float16"] == pytest.approx(histories["float32"], rel=1e-2)


# --- through aikit's GA optimizer (issue 27): one LR per update --------------------------------


def ga_model(steps=None, optimizer=None, linear=False):
    """``make_model`` whose optimizer is ``optimizer`` (SGD) wrapped in aikit's GA optimizer."""
    from aikit.ga.TF.optimizers import Optimizer as GAOptimizer

    keras.utils.set_random_seed(0)
    layers = [keras.layers.Dense(1)] if linear else [keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)]
    model = keras.Sequential([keras.Input((3,)), *layers])
    optimizer = optimizer or keras.optimizers.SGD(1e-4, momentum=0.9)
    model.compile(optimizer=optimizer if steps is None else GAOptimizer(optimizer, steps), loss="mse")
    return model


def test_a_range_test_through_the_ga_optimizer_equals_the_range_test_of_the_big_batch():
    runs = {}
    for batch_size, steps in [(16, None), (4, 4)]:
        model = ga_model(steps)
        finder = LRFinder(model)
        finder.range_test(data(), end_lr=1.0, num_iter=8, batch_size=batch_size, shuffle=False, diverge_th=math.inf,
                          progress_bar=False)
        runs[steps] = finder.history, model.get_weights(), model.optimizer
    (big, big_weights, _), (ga, ga_weights, optimizer) = runs[None], runs[4]
    assert ga["lr"] == big["lr"] == lr_sequence(1e-4, 1.0, 8)  # one LR per update, not per batch
    assert int(optimizer.iterations.numpy()) == 8 and int(optimizer.micro_steps.numpy()) == 32
    assert ga["loss"] == pytest.approx(big["loss"], rel=1e-12)
    for a, b in zip(ga_weights, big_weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_reset_after_a_ga_range_test_restores_the_model_and_every_ga_variable():
    model = ga_model(3, keras.optimizers.Adam(1e-3))
    x, y = data()
    model.fit(x[:24], y[:24], batch_size=4, verbose=0)  # two updates: Adam's moments, a count, sums mid-way
    weights, variables = model.get_weights(), [v.numpy().copy() for v in model.optimizer.variables]
    finder = LRFinder(model)
    finder.range_test((x, y), end_lr=1.0, num_iter=5, batch_size=4, progress_bar=False)
    first = list(finder.history["loss"])
    assert int(model.optimizer.iterations.numpy()) == 2 + 5
    finder.reset()
    assert weights_equal(model.get_weights(), weights)
    assert weights_equal([v.numpy() for v in model.optimizer.variables], variables)  # sums, counts, moments, LR
    finder.range_test((x, y), end_lr=1.0, num_iter=5, batch_size=4, shuffle=False, progress_bar=False)
    finder.reset()
    finder.range_test((x, y), end_lr=1.0, num_iter=5, batch_size=4, shuffle=False, progress_bar=False)
    assert len(first) == 5 and finder.history["loss"] != first  # (shuffled then not: both ran)


@pytest.mark.parametrize("steps", [2, None], ids=["GA optimizer", "accumulation_steps"])
def test_an_update_the_loss_scale_optimizer_skipped_is_made_again_and_not_counted(steps):
    keras.config.set_floatx("float32")  # (the float64 fixture puts both back)
    keras.config.set_dtype_policy("float32")
    x, y = (a.astype("float32") for a in data())
    x[4 * 3 + 1] = 1e18  # a finite loss whose scaled gradient overflows: the 2nd batch of update 1
    inner = keras.optimizers.SGD(1e-5)
    model = ga_model(steps, keras.optimizers.LossScaleOptimizer(inner), linear=True)
    finder = LRFinder(model)
    loss_scale = next(v for v in model.optimizer.variables if "dynamic_scale" in v.path)
    before = float(loss_scale.numpy())
    finder.range_test((x, y), start_lr=1e-5, end_lr=1e-2, num_iter=8, batch_size=4, shuffle=False,
                      diverge_th=math.inf, accumulation_steps=1 if steps else 2, progress_bar=False)
    assert finder.history["lr"] == lr_sequence(1e-5, 1e-2, 8)  # every LR once, the skipped one again
    assert int(inner.iterations.numpy()) == 8  # 8 real updates of SGD: the skipped one not counted
    assert all(math.isfinite(loss) and loss < 1e3 for loss in finder.history["loss"])
    assert float(loss_scale.numpy()) == before / 2
    finder.reset()
    assert float(loss_scale.numpy()) == before


def test_a_ga_range_test_refuses_what_would_not_be_one_lr_per_update():
    model = ga_model(4)
    finder = LRFinder(model)
    with pytest.raises(ValueError, match=r"^accumulation_steps=2 through aikit's GA optimizer, which accumulates "
                                         r"steps=4 batches per update itself: leave accumulation_steps out"):
        finder.range_test(data(), num_iter=3, accumulation_steps=2, progress_bar=False)
    x, y = data()
    model.train_on_batch(x[:4], y[:4])
    with pytest.raises(ValueError, match=r"^aikit's GA optimizer has 1 of its 4 batches accumulated: run the range "
                                         r"test between updates"):
        finder.range_test(data(), num_iter=3, progress_bar=False)


def test_the_ga_optimizer_of_aikits_model_wrapper_is_range_tested_at_the_global_batch():
    import aikit.elastic.TF
    from aikit.elastic.TF.model import Model

    aikit.elastic.TF.init(16, 4, gpus=1)
    wrapped = Model(make_model())
    wrapped.compile(keras.optimizers.SGD(1e-3), loss="mse")
    finder = LRFinder(wrapped.model)
    finder.range_test(data(), end_lr=1.0, num_iter=4, batch_size=4, progress_bar=False)
    assert int(wrapped.model.optimizer.micro_steps.numpy()) == 16 and len(finder.history["lr"]) == 4
