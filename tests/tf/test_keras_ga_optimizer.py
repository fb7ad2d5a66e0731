"""aikit.ga.TF.optimizers.Optimizer: k micro-steps make exactly one big-batch update."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tf_common import data, gradients, keras, max_difference, mlp

from aikit.core.errors import NonFiniteGradientWarning, TrainingFailed
from aikit.ga.TF.optimizers import Optimizer

OPTIMIZERS = {
    "sgd-nesterov": lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
    # schedule per update, decoupled weight decay and a global clip that bites (norm > 0.1)
    "adam-schedule-wd-clip": lambda: keras.optimizers.Adam(
        keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=1, decay_rate=0.5),
        weight_decay=0.05, global_clipnorm=0.1),
    "adamw-clipnorm": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1, clipnorm=0.05),
    "rmsprop-clipvalue": lambda: keras.optimizers.RMSprop(0.01, momentum=0.5, clipvalue=0.01),
    "adam-ema": lambda: keras.optimizers.Adam(0.01, use_ema=True, ema_momentum=0.5, ema_overwrite_frequency=2),
}


def train_big_and_ga(make_optimizer, steps: int, micro: int, updates: int):
    """The same data as ``updates`` big-batch steps and as GA over ``steps`` micro-batches each."""
    x, y = data(steps * micro * updates)
    big, small = mlp(), mlp()
    big_opt, ga = make_optimizer(), Optimizer(make_optimizer(), steps)
    for u in range(updates):
        rows = slice(u * steps * micro, (u + 1) * steps * micro)
        big_opt.apply(gradients(big, x[rows], y[rows]), big.trainable_variables)
    for m in range(steps * updates):
        rows = slice(m * micro, (m + 1) * micro)
        ga.apply(gradients(small, x[rows], y[rows]), small.trainable_variables)
    return big, small, big_opt, ga


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_ga_equals_big_batch(float64, name):
    big, small, big_opt, ga = train_big_and_ga(OPTIMIZERS[name], steps=3, micro=4, updates=3)
    assert max_difference(big, small) < 1e-12
    # the wrapped optimizer counted updates, not micro-steps (bias correction, schedules, EMA)
    assert int(ga.iterations) == int(big_opt.iterations) == 3
    assert int(ga.micro_steps) == 9 and ga.accumulated == 0
    assert float(ga.learning_rate) == pytest.approx(float(big_opt.learning_rate), rel=1e-15)
    for mine, theirs in zip(ga.inner.variables, big_opt.variables, strict=True):
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-10, atol=1e-13)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.integers(1, 4), micro=st.integers(1, 3), updates=st.integers(1, 3))
def test_ga_equals_big_batch_for_any_split(float64, steps, micro, updates):
    big, small, _, ga = train_big_and_ga(OPTIMIZERS["adam-schedule-wd-clip"], steps, micro, updates)
    assert max_difference(big, small) < 1e-12
    assert int(ga.iterations) == updates


@pytest.mark.parametrize("name", ["sgd-nesterov", "adam-schedule-wd-clip"])
def test_embedding_gradients_accumulate_to_the_dense_big_batch_step(float64, name):
    """IndexedSlices are summed densely; the update is the big batch's with its gradient densified
    (Keras' sparse Adam squares duplicate-index slices one by one, unlike its dense path)."""
    def embedder():
        keras.utils.set_random_seed(1)
        return keras.Sequential([keras.Input((5,), dtype="int32"), keras.layers.Embedding(20, 4),
                                 keras.layers.Flatten(), keras.layers.Dense(3)])

    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 20, size=(24, 5)), rng.normal(size=(24, 3))
    big, small = embedder(), embedder()
    big_opt, ga = OPTIMIZERS[name](), Optimizer(OPTIMIZERS[name](), 3)
    assert isinstance(gradients(small, x[:4], y[:4])[0], tf.IndexedSlices)
    for u in range(2):
        dense = [tf.convert_to_tensor(g) for g in gradients(big, x[u * 12:(u + 1) * 12], y[u * 12:(u + 1) * 12])]
        big_opt.apply(dense, big.trainable_variables)
    for m in range(6):
        ga.apply(gradients(small, x[m * 4:(m + 1) * 4], y[m * 4:(m + 1) * 4]), small.trainable_variables)
    assert max_difference(big, small) < 1e-12


def test_steps_change_between_updates_without_retracing(float64):
    """Traces change the GA steps every update: a tf.Variable, so one trace serves them all."""
    sizes = [2, 3, 1, 4]
    micro = 2
    x, y = data(micro * sum(sizes))
    big, small = mlp(), mlp()
    big_opt, ga = keras.optimizers.Adam(0.02), Optimizer(keras.optimizers.Adam(0.02), 1)
    ga.build(small.trainable_variables)  # variables made inside a first trace would force a second
    traces = []

    @tf.function
    def micro_step(xb, yb):
        traces.append(1)
        ga.apply(gradients(small, xb, yb), small.trainable_variables)

    start = 0
    for k in sizes:
        ga.steps = k
        big_opt.apply(gradients(big, x[start:start + k * micro], y[start:start + k * micro]),
                      big.trainable_variables)
        for _ in range(k):
            micro_step(tf.constant(x[start:start + micro]), tf.constant(y[start:start + micro]))
            start += micro
    assert max_difference(big, small) < 1e-12
    assert len(traces) == 1
    assert int(ga.iterations) == len(sizes)


def test_fewer_steps_mid_update_applies_the_mean_of_what_was_accumulated(float64):
    x, y = data(4)
    big, small = mlp(), mlp()
    big_opt, ga = keras.optimizers.SGD(0.1), Optimizer(keras.optimizers.SGD(0.1), 3)
    ga.apply(gradients(small, x[:2], y[:2]), small.trainable_variables)
    ga.steps = 2  # the update now ends at the next micro-step, with the mean of both
    ga.apply(gradients(small, x[2:], y[2:]), small.trainable_variables)
    big_opt.apply(gradients(big, x, y), big.trainable_variables)
    assert max_difference(big, small) < 1e-12 and ga.accumulated == 0


def test_matches_keras_gradient_accumulation_steps(float64):
    """Where Keras' own GA is right (constant LR, one device) the two agree."""
    x, y = data(24)
    keras_ga, aikit_ga = mlp(), mlp()
    keras_ga.compile(keras.optimizers.Adam(0.01, gradient_accumulation_steps=3), loss="mse")
    aikit_ga.compile(Optimizer(keras.optimizers.Adam(0.01), 3), loss="mse")
    for model in (keras_ga, aikit_ga):
        model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    assert max_difference(keras_ga, aikit_ga) < 1e-12
    assert int(keras_ga.optimizer.iterations) == int(aikit_ga.optimizer.iterations) == 4


def test_lr_schedule_counts_updates_unlike_keras_ga(float64):
    """keras#19990's class of bug: Keras' GA shows its LR schedule the micro-step count."""
    x, y = data(24)
    schedule = keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=1, decay_rate=0.5)
    big, keras_ga, aikit_ga = mlp(), mlp(), mlp()
    big.compile(keras.optimizers.SGD(schedule), loss="mse")
    keras_ga.compile(keras.optimizers.SGD(schedule, gradient_accumulation_steps=3), loss="mse")
    aikit_ga.compile(Optimizer(keras.optimizers.SGD(schedule), 3), loss="mse")
    big.fit(x, y, batch_size=12, epochs=2, shuffle=False, verbose=0)
    for model in (keras_ga, aikit_ga):
        model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    assert max_difference(big, aikit_ga) < 1e-12
    assert max_difference(big, keras_ga) > 1e-4


def test_save_and_load_mid_update_resumes_identically(tmp_path):
    x, y = data(36, seed=3)
    model = mlp()
    model.compile(Optimizer(keras.optimizers.Adam(0.01, weight_decay=0.01), 3), loss="mse")
    model.fit(x[:16], y[:16], batch_size=4, epochs=1, shuffle=False, verbose=0)  # 4 micro-steps
    assert model.optimizer.accumulated == 1
    model.save(tmp_path / "ga.keras")
    loaded = keras.models.load_model(tmp_path / "ga.keras")
    assert isinstance(loaded.optimizer, Optimizer)
    assert loaded.optimizer.steps == 3 and loaded.optimizer.accumulated == 1
    assert int(loaded.optimizer.iterations) == 1
    for m in (model, loaded):
        m.fit(x[16:], y[16:], batch_size=4, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(model.get_weights() + [v.numpy() for v in model.optimizer.variables],
                    loaded.get_weights() + [v.numpy() for v in loaded.optimizer.variables], strict=True):
        np.testing.assert_array_equal(a, b)


def test_config_round_trip():
    ga = Optimizer(keras.optimizers.Adam(0.003, beta_1=0.8, clipnorm=1.0), 5, name="ga")
    again = Optimizer.from_config(ga.get_config())
    assert again.get_config() == ga.get_config()
    assert again.steps == 5 and isinstance(again.inner, keras.optimizers.Adam)
    assert again.inner.beta_1 == 0.8 and again.inner.clipnorm == 1.0
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(ga))
    assert isinstance(restored, Optimizer) and restored.get_config() == ga.get_config()


def test_learning_rate_is_the_wrapped_optimizers():
    ga = Optimizer(keras.optimizers.SGD(0.1), 2)
    ga.learning_rate = 0.25
    assert float(ga.inner.learning_rate) == 0.25 == float(ga.learning_rate)


@pytest.mark.parametrize(("make", "error", "message"), [
    (lambda: Optimizer(keras.optimizers.SGD(0.1), 0), ValueError, "steps must be a positive integer, got 0"),
    (lambda: Optimizer(keras.optimizers.SGD(0.1), 2.5), ValueError, "steps must be a positive integer, got 2.5"),
    (lambda: Optimizer("adam", 2), TypeError, "optimizer must be a Keras 3 optimizer instance"),
    (lambda: Optimizer(keras.optimizers.SGD(0.1, gradient_accumulation_steps=2), 2), ValueError,
     "already accumulates with Keras' gradient_accumulation_steps=2"),
    (lambda: Optimizer(Optimizer(keras.optimizers.SGD(0.1), 2), 2), ValueError, "set its .steps instead"),
    (lambda: Optimizer(keras.optimizers.SGD(0.1), 2, clipnorm=1.0), ValueError,
     "takes only optimizer, steps, name, reduction, skip_nonfinite and max_skips_in_a_row, got ['clipnorm']"),
])
def test_bad_input_is_named(make, error, message):
    with pytest.raises(error) as raised:
        make()
    assert message in str(raised.value)


def test_bad_steps_assignment_is_named():
    ga = Optimizer(keras.optimizers.SGD(0.1), 2)
    with pytest.raises(ValueError, match="steps must be a positive integer, got -1"):
        ga.steps = -1
    assert ga.steps == 2


def test_fit_compiled_with_xla_equals_big_batch(float64):
    """Keras compiles with XLA on a single GPU by default; the GA update runs inside it."""
    x, y = data(48)
    big, small = mlp(), mlp()
    big.compile(keras.optimizers.Adam(0.01, weight_decay=0.1), loss="mse", jit_compile=True)
    small.compile(Optimizer(keras.optimizers.Adam(0.01, weight_decay=0.1), 3), loss="mse", jit_compile=True)
    big.fit(x, y, batch_size=12, epochs=2, shuffle=False, verbose=0)
    small.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    assert small.jit_compile and max_difference(big, small) < 1e-12
    assert int(small.optimizer.iterations) == 8


def test_steps_lowered_below_the_micro_steps_accumulated_divides_by_what_was_accumulated(float64):
    """3 micro-steps accumulated when the update ends at steps=2: the mean of 3, not a sum / 2."""
    x, y = data(6)
    big, small = mlp(), mlp()
    big_opt, ga = keras.optimizers.SGD(0.1), Optimizer(keras.optimizers.SGD(0.1), 4)
    ga.apply(gradients(small, x[:2], y[:2]), small.trainable_variables)
    ga.apply(gradients(small, x[2:4], y[2:4]), small.trainable_variables)
    ga.steps = 2
    ga.apply(gradients(small, x[4:], y[4:]), small.trainable_variables)
    big_opt.apply(gradients(big, x, y), big.trainable_variables)
    assert max_difference(big, small) < 1e-12 and ga.accumulated == 0


def test_load_weights_keeps_the_steps_compiled_now(tmp_path):
    x, y = data(16, seed=2)
    saved = mlp()
    saved.compile(Optimizer(keras.optimizers.Adam(0.01), 4), loss="mse")
    saved.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    saved.save_weights(tmp_path / "ga4.weights.h5")
    other = mlp()
    other.compile(Optimizer(keras.optimizers.Adam(0.01), 2), loss="mse")
    other.optimizer.build(other.trainable_variables)
    other.load_weights(tmp_path / "ga4.weights.h5")
    assert other.optimizer.steps == 2
    assert int(other.optimizer.iterations) == int(saved.optimizer.iterations) == 1
    np.testing.assert_array_equal(other.get_weights()[0], saved.get_weights()[0])


def test_apply_on_a_variable_it_was_not_built_for_is_named():
    x, y = data(4)
    first, second = mlp(), mlp()
    ga = Optimizer(keras.optimizers.SGD(0.1), 2)
    ga.apply(gradients(first, x, y), first.trainable_variables)
    with pytest.raises(ValueError, match=r"apply\(\) got a gradient for variable '.*', which this GA optimizer was "
                                         r"not built for"):
        ga.apply(gradients(second, x, y), second.trainable_variables)


def test_weights_saved_mid_update_load_only_into_the_same_steps(tmp_path):
    """2 of 4 micro-steps accumulated: loaded into steps=2 they would make one update of 3
    micro-batches; refused as the torch wrapper refuses it, before the wrapper's counters and
    sums change (Keras loads the layers, and the wrapped optimizer as a child of its own, whatever
    the wrapper says). Into steps=4 it resumes the update."""
    x, y = data(24, seed=5)
    saved = mlp()
    saved.compile(Optimizer(keras.optimizers.Adam(0.01), 4), loss="mse")
    saved.fit(x[:24], y[:24], batch_size=4, epochs=1, shuffle=False, verbose=0)  # 6 micro-steps: 2 pending
    assert saved.optimizer.accumulated == 2
    saved.save_weights(tmp_path / "mid.weights.h5")
    other = mlp()
    other.compile(Optimizer(keras.optimizers.Adam(0.01), 2), loss="mse")
    other.optimizer.build(other.trainable_variables)
    own = other.optimizer._variables  # steps, micro-steps accumulated, the sums
    before = [v.numpy().copy() for v in own]
    with pytest.raises(ValueError, match=r"saved 2 micro-steps into an update of steps=4, but this optimizer has "
                                         r"steps=2: resume with steps=4, or save between updates"):
        other.load_weights(tmp_path / "mid.weights.h5")
    for got, want in zip([v.numpy() for v in own], before, strict=True):
        np.testing.assert_array_equal(got, want)
    same = mlp()
    same.compile(Optimizer(keras.optimizers.Adam(0.01), 4), loss="mse")
    same.optimizer.build(same.trainable_variables)
    same.load_weights(tmp_path / "mid.weights.h5")
    assert same.optimizer.accumulated == 2 and same.optimizer.steps == 4


# --- an inf/NaN gradient: the update skipped in the graph ------------------------------------


def test_a_nan_gradient_skips_the_update_and_an_eager_apply_warns_once():
    """The issue's case: apply([nan, 1, 1]) then apply([1, 1, 1]) left [nan, 0.9, 0.9]."""
    weights = keras.Variable(np.ones(3))
    ga = Optimizer(keras.optimizers.SGD(0.1), 2)
    with pytest.warns(NonFiniteGradientWarning) as caught:
        ga.apply([tf.constant([np.nan, 1.0, 1.0], "float64")], [weights])
        ga.apply([tf.constant([1.0, 1.0, 1.0], "float64")], [weights])
        assert weights.numpy().tolist() == [1.0, 1.0, 1.0]  # skipped: nothing applied
        assert (ga.skipped, ga.skipped_in_a_row, int(ga.iterations), ga.accumulated) == (1, 1, 0, 0)
        for _ in range(2):  # the sums were cleared: the next update is the mean of its own micro-steps
            ga.apply([tf.constant([1.0, 3.0, -1.0], "float64")], [weights])
    assert np.allclose(weights.numpy(), [0.9, 0.7, 1.1])
    assert (ga.skipped, ga.skipped_in_a_row, int(ga.iterations), int(ga.micro_steps)) == (1, 0, 1, 4)
    (warning,) = caught
    assert str(warning.message).startswith(
        "aikit skipped an update: its gradient is not finite (inf or NaN), so no weight changed and nothing that "
        "counts updates advanced, as a GradScaler skips one (optimizer.iterations did not advance, "
        "optimizer.skipped counts the skips). Check the loss and the data for inf/NaN")


def test_skip_nonfinite_false_applies_the_nan_as_keras_does():
    weights = keras.Variable(np.ones(3))
    ga = Optimizer(keras.optimizers.SGD(0.1), 2, skip_nonfinite=False)
    ga.apply([tf.constant([np.nan, 1.0, 1.0], "float64")], [weights])
    ga.apply([tf.constant([1.0, 1.0, 1.0], "float64")], [weights])
    assert np.isnan(weights.numpy()[0]) and np.allclose(weights.numpy()[1:], 0.9) and ga.skipped == 0


def test_a_run_of_skips_in_eager_applies_raises_training_failed():
    weights = keras.Variable(np.ones(3))
    ga = Optimizer(keras.optimizers.Adam(0.1), 1, max_skips_in_a_row=3)
    with pytest.warns(NonFiniteGradientWarning):
        for poisoned in (True, True, False, True, True):  # an applied update ends a run
            ga.apply([tf.constant([np.inf if poisoned else 1.0, 1.0, 1.0], "float64")], [weights])
        moved = weights.numpy().copy()
        with pytest.raises(TrainingFailed) as error:
            ga.apply([tf.constant([np.nan, 1.0, 1.0], "float64")], [weights])
    assert str(error.value).startswith(
        "3 updates in a row were skipped because their gradient was not finite (inf or NaN): the weights have not "
        "changed since (optimizer.skipped is 5), and every batch gives inf/NaN at them. Check the learning rate")
    assert np.array_equal(weights.numpy(), moved) and int(ga.iterations) == 1


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "XLA"])
def test_fit_skips_an_update_with_a_nan_gradient_in_its_compiled_step_and_warns_at_its_end(float64, jit_compile):
    """One NaN target in the second update's batch: that update is skipped in the graph (Adam's
    iterations, weight decay and moments untouched), the others equal the big-batch fit without it."""
    x, y = data(36)
    y[14, 0] = np.nan  # the second update (samples 12..23), its second micro-batch
    big, small = mlp(), mlp()
    big.compile(keras.optimizers.Adam(0.01, weight_decay=0.1), loss="mse")
    small.compile(Optimizer(keras.optimizers.Adam(0.01, weight_decay=0.1), 3), loss="mse", jit_compile=jit_compile)
    keep = np.r_[0:12, 24:36]
    big.fit(x[keep], y[keep], batch_size=12, epochs=1, shuffle=False, verbose=0)
    with pytest.warns(NonFiniteGradientWarning, match=r"inf or NaN: 1 update\(s\) skipped, the last 0 in a row"):
        small.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    assert max_difference(big, small) < 1e-12
    assert (small.optimizer.skipped, int(small.optimizer.iterations)) == (1, 2)


def test_the_skip_counts_are_no_saved_variables_and_the_options_round_trip():
    """``skipped`` is this object's count, as torch's: weights saved before still load. The counts
    are variables of the optimizer's state (JAX's pure step carries only those), last in
    ``variables``, and left out of what it saves: the 10 saved before."""
    ga = Optimizer(keras.optimizers.Adam(0.1), 2)
    ga.build([keras.Variable(np.ones(3))])
    store: dict = {}
    ga.save_own_variables(store)
    saved = [getattr(v, "path", v.name) for v in ga.variables[:len(store)]]
    assert len(store) == 10 and not [p for p in saved if "skipped" in p or "in_a_row" in p], saved  # as before
    assert [v.name for v in ga.variables[10:]] == [f"{ga.name}_skipped", f"{ga.name}_in_a_row"]
    ga.load_own_variables(store)  # what was saved before loads back
    assert Optimizer.from_config(ga.get_config()).max_skips_in_a_row == 10
    config = Optimizer(keras.optimizers.Adam(0.1), 2, skip_nonfinite=False, max_skips_in_a_row=None).get_config()
    restored = Optimizer.from_config(config)
    assert (restored.skip_nonfinite, restored.max_skips_in_a_row) == (False, None)
