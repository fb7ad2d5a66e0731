"""aikit.elastic.TF on one device: init's plan, the Model wrapper, and training on a trace."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tf_common import data, gradients, keras, max_difference, mlp

import aikit.elastic
import aikit.elastic.TF as elastic_tf
import aikit.keras.elastic
from aikit.core.ramp import seesaw_schedule
from aikit.core.scaling import cosine_decay, scaled_lr
from aikit.core.schedule import Schedule
from aikit.core.trace import schedule_trace
from aikit.ga.TF.optimizers import Optimizer


def test_init_publishes_the_plan():
    plan = elastic_tf.init(256, 64, verbose=False)
    assert (elastic_tf.steps, elastic_tf.batch_size, elastic_tf.global_batch_size, elastic_tf.gpus,
            elastic_tf.master) == (4, 64, 256, 1, True)
    assert (aikit.elastic.steps, aikit.elastic.batch_size) == (4, 64)  # seed 002 reads them here
    assert elastic_tf.plan is plan and elastic_tf.strategy.num_replicas_in_sync == 1
    assert aikit.elastic.models.Model is elastic_tf.model.Model is elastic_tf.models.Model
    # docs/keras.md: aikit.elastic exposes them all too, the plan and the strategy included
    assert aikit.elastic.plan is plan and aikit.elastic.strategy is elastic_tf.strategy


def test_init_without_horovod_publishes_no_hvd():
    """Run:AI's AIkit's runai.elastic.hvd exists only under Horovod (its own test checks that)."""
    elastic_tf.init(64, 32, verbose=False)
    assert not hasattr(aikit.elastic, "hvd") and not hasattr(elastic_tf, "hvd")


def test_init_under_horovodrun_without_horovod_initialised_is_refused(monkeypatch):
    """Run:AI's Keras example runs under horovodrun and lets init() start Horovod; aikit does not,
    so each process would train alone: refused, with the two ways to run it."""
    before = elastic_tf.init(64, 32, verbose=False)
    monkeypatch.setenv("HOROVOD_SIZE", "2")
    with pytest.raises(ValueError, match=r"this process is one of 2 that horovodrun started, but "
                                         r"horovod.tensorflow is not initialised, so each would train alone: "
                                         r"call `import horovod.tensorflow as hvd; hvd.init\(\)`"):
        elastic_tf.init(128, 16, verbose=False)
    assert elastic_tf.plan is before and aikit.elastic.global_batch_size == 64  # nothing changed


def test_init_keeps_the_global_batch_exact():
    plan = elastic_tf.init(100, 30, verbose=False)
    assert plan.steps * plan.batch_size * plan.gpus == 100 and plan.batch_size <= 30 and plan.is_even


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"gpus": 2}, "gpus=2 but only 1 device(s) can be used here"),
    ({"policy": "ragged"}, "Keras' fit feeds micro-batches of one size"),
    ({"gpus": 0}, "gpus must be a positive integer, got 0"),
])
def test_init_bad_input_is_named(kwargs, message):
    with pytest.raises(ValueError) as raised:
        elastic_tf.init(256, 64, verbose=False, **kwargs)
    assert message in str(raised.value)


def test_init_uneven_batch_with_policy_error_names_the_nearest():
    with pytest.raises(ValueError, match="use global_batch_size 100 or 104"):
        elastic_tf.init(101, 30, policy="error", verbose=False)


def test_model_fit_equals_big_batch_fit(float64):
    x, y = data(48)
    elastic_tf.init(12, 4, verbose=False)
    big = mlp()
    big.compile(keras.optimizers.Adam(0.01, weight_decay=0.05), loss="mse")
    big.fit(x, y, batch_size=12, epochs=2, shuffle=False, verbose=0)
    model = elastic_tf.model.Model(mlp())
    model.compile(keras.optimizers.Adam(0.01, weight_decay=0.05), loss="mse")
    model.fit(x, y, batch_size=elastic_tf.batch_size, epochs=2, shuffle=False, verbose=0)
    assert isinstance(model.optimizer, Optimizer) and model.optimizer.steps == 3
    assert max_difference(big, model) < 1e-12
    assert int(model.optimizer.iterations) == 8
    np.testing.assert_allclose(model.evaluate(x, y, verbose=0), big.evaluate(x, y, verbose=0), rtol=1e-12)
    np.testing.assert_allclose(model.predict(x, verbose=0), big.predict(x, verbose=0), rtol=1e-12)


def test_fit_counts_epochs_and_every_sample():
    """40 samples in micro-batches of 4: 10 micro-steps an epoch, none dropped; updates span epochs."""
    x, y = data(40)
    elastic_tf.init(12, 4, verbose=False)
    epochs, batches = [], []
    callback = keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: epochs.append(e),
                                              on_train_batch_end=lambda b, logs: batches.append(b))
    model = elastic_tf.model.Model(mlp())
    model.compile("sgd", loss="mse")
    history = model.fit(x, y, epochs=2, verbose=0, callbacks=[callback])
    assert epochs == [0, 1] and len(history.history["loss"]) == 2
    assert batches == list(range(10)) * 2
    assert int(model.optimizer.micro_steps) == 20
    assert int(model.optimizer.iterations) == 6 and model.optimizer.accumulated == 2


def test_fit_on_a_dataset_batched_at_the_step_batch(float64):
    x, y = data(24)
    elastic_tf.init(12, 4, verbose=False)
    from_arrays, from_dataset = elastic_tf.model.Model(mlp()), elastic_tf.model.Model(mlp())
    for model in (from_arrays, from_dataset):
        model.compile(keras.optimizers.SGD(0.1, momentum=0.5), loss="mse")
    from_arrays.fit(x, y, epochs=2, shuffle=False, verbose=0)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(from_dataset.step_batch_size)
    from_dataset.fit(dataset, epochs=2, shuffle=False, verbose=0)
    assert max_difference(from_arrays, from_dataset) == 0.0
    assert int(from_dataset.optimizer.iterations) == 4


def test_fit_refuses_another_batch_size():
    elastic_tf.init(12, 4, verbose=False)
    model = elastic_tf.model.Model(mlp())
    model.compile("sgd", loss="mse")
    with pytest.raises(ValueError, match="batch_size=8 is not the plan's per-device micro-batch 4"):
        model.fit(*data(16), batch_size=8, verbose=0)


def test_wrapped_model_saves_and_loads(tmp_path):
    x, y = data(24)
    elastic_tf.init(8, 4, verbose=False)
    model = elastic_tf.model.Model(mlp())
    model.compile(keras.optimizers.Adam(0.01), loss="mse")
    model.fit(x, y, epochs=1, verbose=0)
    model.save(tmp_path / "elastic.keras")
    loaded = keras.models.load_model(tmp_path / "elastic.keras")
    assert isinstance(loaded.optimizer, Optimizer) and loaded.optimizer.steps == 2
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))


def test_model_needs_init_and_a_keras_model(monkeypatch):
    with pytest.raises(TypeError, match=r"Model wraps a keras\.Model, got str"):
        elastic_tf.model.Model("not a model")
    monkeypatch.setattr(aikit.keras.elastic, "plan", None)  # where init publishes it (the seed path re-exports)
    with pytest.raises(RuntimeError, match=r"aikit.elastic.TF.init\(global_batch_size, max_device_batch\)"):
        elastic_tf.model.Model(mlp())


def test_fit_trace_equals_big_batch_steps_at_the_rules_lr(float64):
    """Each update of the trace equals one SGD step on that step's samples at the scaled LR."""
    x, y = data(64)
    sizes, mb, base_lr, ref = [8, 16, 8, 32], 4, 0.05, 8
    model = mlp()
    model.compile(Optimizer(keras.optimizers.SGD(base_lr), 1), loss="mse")
    log = elastic_tf.fit_trace(model, x, y, sizes, micro_batch=mb, base_lr=base_lr, ref_batch_size=ref,
                               rule="sqrt", seed=7)
    reference, sgd = mlp(), keras.optimizers.SGD(base_lr)
    epoch = Schedule(sizes, 64, micro_batch=mb, seed=7).epoch(0)
    for step, size in enumerate(sizes):
        sgd.learning_rate = scaled_lr(base_lr, size, ref, "sqrt", step=step)
        rows = epoch.step_indices(step)
        sgd.apply(gradients(reference, x[rows], y[rows]), reference.trainable_variables)
    assert max_difference(model, reference) < 1e-12
    assert [r["ga_steps"] for r in log] == [2, 4, 2, 8]
    assert [r["batch_size"] for r in log] == sizes
    assert [r["lr"] for r in log] == [scaled_lr(base_lr, s, ref, "sqrt", step=i) for i, s in enumerate(sizes)]
    assert int(model.optimizer.iterations) == 4


def test_fit_trace_runs_seesaw_and_its_cosine_baseline_at_the_samples_lr(float64):
    """Seesaw over a cosine: each update equals one SGD step on its samples at base x cosine(samples
    trained before it) x sqrt(B / B0); the cosine baseline at B0 decays by the same samples."""
    x, y = data(64)
    decay = cosine_decay(128)
    trace = schedule_trace(seesaw_schedule(8, decay, max_batch=32), samples=128)
    assert trace.sizes.tolist() == [8] * 8 + [16, 16, 32]  # two epochs: 64 at 8, then 16 + 16 + 32
    for rule, sizes in (("seesaw", trace), ("constant", 8)):
        model = mlp()
        model.compile(Optimizer(keras.optimizers.SGD(0.05), 1), loss="mse")
        log = elastic_tf.fit_trace(model, x, y, sizes, micro_batch=4, base_lr=0.05, ref_batch_size=8, rule=rule,
                                   lr_decay=decay, epochs=2, seed=7)
        before = np.concatenate(([0], np.cumsum([r["batch_size"] for r in log])))[:-1]
        expected = [0.05 * decay(int(s)) * (np.sqrt(r["batch_size"] / 8) if rule == "seesaw" else 1)
                    for r, s in zip(log, before, strict=True)]
        assert [r["lr"] for r in log] == pytest.approx(expected, rel=1e-12)
        assert sum(r["batch_size"] for r in log) == 128
    assert len(log) == 16 > 11  # the baseline at 8 took 16 updates where Seesaw took 11
    model = mlp()
    model.compile(Optimizer(keras.optimizers.SGD(0.05), 1), loss="mse")
    with pytest.raises(ValueError, match="rule='seesaw' needs lr_decay"):
        elastic_tf.fit_trace(model, x, y, trace, micro_batch=4, base_lr=0.05, ref_batch_size=8, rule="seesaw")


def test_fit_trace_refuses_a_size_that_is_not_a_multiple_of_the_micro_batch():
    model = mlp()
    model.compile(Optimizer(keras.optimizers.SGD(0.1), 1), loss="mse")
    with pytest.raises(ValueError, match="batch size 10 is not a multiple of micro_batch x num_replicas 4"):
        elastic_tf.fit_trace(model, *data(64), [8, 10], micro_batch=4, base_lr=0.1, ref_batch_size=8)


def test_fit_trace_needs_the_ga_optimizer():
    model = mlp()
    model.compile(keras.optimizers.SGD(0.1), loss="mse")
    with pytest.raises(TypeError, match=r"compiled with aikit\.ga\.TF\.optimizers\.Optimizer"):
        elastic_tf.fit_trace(model, *data(16), [8], micro_batch=4, base_lr=0.1, ref_batch_size=8)


def test_strategy_found_on_one_cpu_is_the_default():
    assert elastic_tf.strategies.available_strategy() is tf.distribute.get_strategy()
    assert elastic_tf.strategies.workers_in_tf_config() == 0


def test_tf_config_workers_are_counted(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"chief": ["a:1"], "worker": ["b:1", "c:1"]}, '
                                    '"task": {"type": "worker", "index": 0}}')
    assert elastic_tf.strategies.workers_in_tf_config() == 3


def test_unreadable_tf_config_is_named(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "workers=2")
    with pytest.raises(ValueError, match="TF_CONFIG is not a JSON object with a 'cluster' entry: 'workers=2'"):
        elastic_tf.strategies.workers_in_tf_config()
