"""The adaptive batch in Keras on one device: the gradient noise measured inside the GA optimizer,
and fit_adaptive's plan changes, sample accounting, LR rules and replayable trace.
(MirroredStrategy over two logical CPUs: test_adaptive_mirrored.py.)"""

from __future__ import annotations

import itertools
import logging
import math

import numpy as np
import pytest
import tensorflow as tf
from keras_adaptive_common import ScriptedController, big_batch_reference, brute_force_noise, order
from tf_common import data, keras, max_difference, mlp

from aikit.core.goodput import GoodputController
from aikit.core.trace import load_trace
from aikit.elastic.TF import fit_adaptive, fit_trace
from aikit.ga.TF.noise import NoiseOptimizer
from aikit.ga.TF.optimizers import Optimizer


def momentum():
    return keras.optimizers.SGD(0.05, momentum=0.9)


def test_the_measured_noise_is_the_brute_force_estimate_of_the_micro_batches(float64):
    """Every update: the part norms summed in the graph give what numpy computes part by part."""
    x, y = data(48)
    model = mlp()
    optimizer = NoiseOptimizer(keras.optimizers.SGD(0.1), steps=3)
    model.compile(optimizer, loss="mse")
    assert optimizer.noise(4) is None  # no update yet
    for update in range(2):  # the second update must not carry the first one's norms
        parts = [np.arange(update * 12 + m * 4, update * 12 + (m + 1) * 4) for m in range(3)]
        expected = brute_force_noise(model, x, y, parts)
        for rows in parts:
            model.train_on_batch(x[rows], y[rows])
        found = optimizer.noise(4)
        assert found.grad_sq == pytest.approx(expected.grad_sq, rel=1e-10)
        assert found.trace == pytest.approx(expected.trace, rel=1e-10)


def test_an_update_skipped_for_a_nan_leaves_its_part_norms_out_of_the_next_measure(float64):
    """A skipped update's micro-batch norms (NaN) are cleared with its sums: the update after it
    measures its own parts only."""
    x, y = data(48)
    y[5, 0] = np.nan  # the first update's second micro-batch
    model = mlp()
    optimizer = NoiseOptimizer(keras.optimizers.SGD(0.1), steps=3)
    model.compile(optimizer, loss="mse")
    for rows in (np.arange(m * 4, (m + 1) * 4) for m in range(3)):  # compiled: counted, not warned
        model.train_on_batch(x[rows], y[rows])
    assert optimizer.skipped == 1 and int(optimizer.iterations) == 0
    parts = [np.arange(12 + m * 4, 12 + (m + 1) * 4) for m in range(3)]
    expected = brute_force_noise(model, x, y, parts)
    for rows in parts:
        model.train_on_batch(x[rows], y[rows])
    found = optimizer.noise(4)
    assert found.grad_sq == pytest.approx(expected.grad_sq, rel=1e-10)
    assert found.trace == pytest.approx(expected.trace, rel=1e-10)


def test_the_measured_noise_is_unbiased_on_least_squares_with_a_known_covariance(float64):
    """Loss (x·w - y)² with x ~ N(0, I_d), y = x·w* + ε, ε ~ N(0, s²): at w, with δ = w - w*, the
    true gradient is G = 2δ and the per-sample covariance has tr(Σ) = 4((d + 1)|δ|² + d s²)
    (McCandlish et al.'s least-squares example, times 2² for the unhalved loss). Averaged over
    many updates the measurements land within 4 standard errors of both."""
    d, s, micro, steps, updates = 4, 0.5, 8, 4, 300
    rng = np.random.default_rng(1)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((d,)), keras.layers.Dense(1, use_bias=False)])
    optimizer = NoiseOptimizer(keras.optimizers.SGD(0.0), steps=steps)  # LR 0: w stays put
    model.compile(optimizer, loss="mse")
    w_star = rng.normal(size=(d, 1))
    delta = model.get_weights()[0] - w_star
    true_grad_sq = float(4 * (delta**2).sum())
    true_trace = float(4 * ((d + 1) * (delta**2).sum() + d * s * s))
    found = []
    for _ in range(updates):
        for _ in range(steps):
            xb = rng.normal(size=(micro, d))
            model.train_on_batch(xb, xb @ w_star + s * rng.normal(size=(micro, 1)))
        found.append(optimizer.noise(micro))
    grad_sq, trace = np.array([f.grad_sq for f in found]), np.array([f.trace for f in found])
    assert abs(grad_sq.mean() - true_grad_sq) < 4 * grad_sq.std() / math.sqrt(updates)
    assert abs(trace.mean() - true_trace) < 4 * trace.std() / math.sqrt(updates)
    assert abs(trace.mean() - true_trace) < 0.1 * true_trace  # and the test has the power to tell


def adaptive_run(x, y, script, *, rule="sqrt", epochs=2, max_device=4, base=8, max_batch=24, **kwargs):
    model = mlp()
    model.compile(NoiseOptimizer(momentum()), loss="mse")
    controller = ScriptedController(script, max_device, 1, ref_batch_size=base, max_batch=max_batch)
    rows = fit_adaptive(model, x, y, controller, base_lr=0.05, rule=rule, epochs=epochs, seed=3, **kwargs)
    return model, controller, rows


def test_every_update_equals_a_big_batch_step_across_plan_changes(float64):
    """Plans 2x4 -> 6x4 -> 3x4 -> 5x4 on 50 samples, the epochs' last updates shorter (9 = 3x3,
    then the last sample; 6 = 2x3)."""
    x, y = data(50)
    model, controller, rows = adaptive_run(x, y, {2: 24, 4: 12, 7: 20})
    assert [r["batch_size"] for r in rows] == [8, 8, 24, 9, 1, 12, 12, 20, 6]
    assert [r["ga_steps"] for r in rows] == [2, 2, 6, 3, 1, 3, 3, 5, 2]
    assert controller.batches == [r["batch_size"] for r in rows] and [r["step"] for r in rows] == list(range(9))
    assert max_difference(model, big_batch_reference(x, y, rows, 3, momentum)) < 1e-12


def test_every_sample_of_an_epoch_is_used_once(float64):
    x, y = data(50)
    _, _, rows = adaptive_run(x, y, {1: 16, 3: 24, 5: 8}, epochs=3)
    for epoch in range(3):
        sizes = [r["batch_size"] for r in rows if r["epoch"] == epoch]
        assert sum(sizes) == 50  # one device: every sample, the last update taking what is left
    # the reference takes consecutive slices of each epoch's permutation: equal weights prove it
    # was these samples (order() is written independently of aikit's Schedule)
    assert len(set(order(50, 3, 0)[:16])) == 16


def test_the_trace_replays_the_run_exactly_with_fit_trace(float64, tmp_path):
    x, y = data(50)
    path = tmp_path / "adaptive.csv"
    adaptive, controller, rows = adaptive_run(x, y, {2: 24, 4: 12, 7: 20}, trace_path=path)
    assert load_trace(path).sizes.tolist() == controller.batches
    replay = mlp()
    replay.compile(Optimizer(momentum()), loss="mse")
    # micro-batches of one sample divide every batch of the trace: other plans, the same updates
    log = fit_trace(replay, x, y, str(path), micro_batch=1, base_lr=0.05, ref_batch_size=8, rule="sqrt",
                    epochs=2, seed=3)
    assert [r["batch_size"] for r in log] == controller.batches
    assert [r["lr"] for r in log] == pytest.approx([r["lr"] for r in rows], rel=1e-15)
    assert max_difference(adaptive, replay) < 1e-12


def test_adascale_scales_the_lr_by_the_gain_of_the_measured_noise(float64):
    x, y = data(50)
    _, _, rows = adaptive_run(x, y, {2: 24}, rule="adascale", epochs=1)
    assert rows[0]["lr"] == 0.05  # no noise measured before the first update
    for before, row in itertools.pairwise(rows):
        # AdaScale's gain (Johnson et al., 2020) from the noise smoothed up to the update before
        trace, grad_sq = max(before["trace"], 0), max(before["grad_sq"], 0)
        expected = (trace / 8 + grad_sq) / (trace / row["batch_size"] + grad_sq)
        assert row["lr"] == pytest.approx(0.05 * expected, rel=1e-12)
    assert rows[2]["lr"] > rows[1]["lr"]  # a larger batch takes a larger step


def test_an_adascale_run_replays_with_its_learning_rates(float64, tmp_path):
    x, y = data(50)
    adaptive, _, rows = adaptive_run(x, y, {2: 24, 4: 12}, rule="adascale", trace_path=tmp_path / "a.csv")
    replay = mlp()
    replay.compile(Optimizer(momentum()), loss="mse")
    lrs = [r["lr"] for r in rows]
    too_few = rf"learning_rates has {len(rows) - 1} entries but the 2 epoch\(s\) train steps 0\.\.{len(rows) - 1}"
    with pytest.raises(ValueError, match=too_few):
        fit_trace(replay, x, y, str(tmp_path / "a.csv"), micro_batch=1, base_lr=0.05, ref_batch_size=8,
                  epochs=2, seed=3, learning_rates=lrs[:-1])
    assert int(replay.optimizer.iterations.numpy()) == 0  # refused before training
    fit_trace(replay, x, y, str(tmp_path / "a.csv"), micro_batch=1, base_lr=0.05, ref_batch_size=8, epochs=2,
              seed=3, learning_rates=lrs)
    assert len(set(lrs)) > 3 and max_difference(adaptive, replay) < 1e-12


def test_an_adascale_run_replays_under_its_own_rule_name_given_its_learning_rates(float64, tmp_path):
    """docs/adaptive.md replays with the run's rule: rule="adascale" is accepted with the run's
    LRs, and without them refused with that fix, before anything trains."""
    x, y = data(50)
    adaptive, _, rows = adaptive_run(x, y, {2: 24}, rule="adascale", epochs=1, trace_path=tmp_path / "a.csv")
    replay = mlp()
    replay.compile(Optimizer(momentum()), loss="mse")
    settings = {"micro_batch": 1, "base_lr": 0.05, "ref_batch_size": 8, "rule": "adascale", "seed": 3}
    with pytest.raises(ValueError, match=r"rule='adascale' needs the LRs of the run it replays .*: pass "
                                         r"learning_rates=\[row\['lr'\] for row in rows\]"):
        fit_trace(replay, x, y, str(tmp_path / "a.csv"), **settings)
    assert int(replay.optimizer.iterations.numpy()) == 0
    fit_trace(replay, x, y, str(tmp_path / "a.csv"), **settings, learning_rates=[r["lr"] for r in rows])
    assert max_difference(adaptive, replay) < 1e-12


def counting_traces(layers: list, traces: list) -> keras.Sequential:
    """A Sequential model of ``layers`` whose every tracing of its training step appends the
    batch size it was traced for to ``traces`` (None: a shape-generic tracing)."""

    class Counting(keras.Sequential):
        def train_step(self, batch):
            traces.append(batch[0].shape[0])
            return super().train_step(batch)

    return Counting(layers)

def test_plan_changes_do_not_retrace_the_training_step_each_time(float64):
    """Four micro-batch sizes: the training step is traced for the first (twice: Keras' first
    call, as with one fixed size) and once more for a shape-generic one (tf.function's
    reduce_retracing), never once per change."""
    x, y = data(200)
    traces = []

    keras.utils.set_random_seed(1)
    model = counting_traces([keras.Input((4,)), keras.layers.Dense(3)], traces)
    model.compile(NoiseOptimizer(momentum()), loss="mse")
    controller = ScriptedController({2: 10, 3: 6, 4: 2, 5: 12}, 5, 1, ref_batch_size=8, max_batch=12)
    rows = fit_adaptive(model, x, y, controller, base_lr=0.05, rule="sqrt")
    assert [r["micro_batch"] for r in rows[:6]] == [4, 4, 5, 3, 2, 4]
    assert traces == [4, 4, None]


def test_the_per_device_batch_grows_with_the_batch_and_tracing_stays_bounded(float64):
    """One device holding up to 64 samples, as PyTorch's max_device_batch: every update runs in
    one pass but every fourth (noise_every=4), which runs in two halves and alone measures the
    noise; the micro-batch grows with the batch through many sizes, and the training step is
    traced for the first shape (twice: Keras' first call) and once for a shape-generic step, not
    once per size. Every update equals a big-batch step."""
    x, y = data(200)
    traces = []

    keras.utils.set_random_seed(1)  # mlp()'s weights, for the reference
    model = counting_traces([keras.Input((4,)), keras.layers.Dense(6, activation="tanh"), keras.layers.Dense(3)],
                            traces)
    model.compile(NoiseOptimizer(momentum()), loss="mse")
    controller = ScriptedController({3: 12, 6: 24, 9: 40, 12: 64, 15: 20}, 64, 1, ref_batch_size=8, max_batch=64,
                                    noise_every=4)
    rows = fit_adaptive(model, x, y, controller, base_lr=0.05, rule="sqrt", epochs=2, seed=3)
    split = [(r["micro_batch"], r["ga_steps"]) for r in rows]
    assert all(steps == (2 if r["step"] % 4 == 0 else 1) for r, (_, steps) in zip(rows, split, strict=True))
    assert split[:7] == [(4, 2), (8, 1), (8, 1), (12, 1), (6, 2), (12, 1), (24, 1)]
    assert len({micro for micro, _ in split}) >= 8  # many shapes ...
    assert traces == [4, 4, None]  # ... three tracings
    for before, row in itertools.pairwise(rows):  # one part measures nothing: the smoothed noise stays
        assert (row["grad_sq"] == before["grad_sq"]) == (row["ga_steps"] == 1)
    assert max_difference(model, big_batch_reference(x, y, rows, 3, momentum)) < 1e-12


def test_a_real_controller_records_and_logs_every_change(float64, tmp_path, caplog):
    """A noisy problem (random targets) and a zero threshold: whatever the controller picks is
    planned, logged and written to the trace."""
    x, y = data(96)
    model = mlp()
    model.compile(NoiseOptimizer(momentum()), loss="mse")
    controller = GoodputController(4, 1, ref_batch_size=8, max_batch=48, threshold=0.0, policy="error")
    with caplog.at_level(logging.INFO, logger="aikit.adaptive"):
        rows = fit_adaptive(model, x, y, controller, base_lr=0.05, epochs=3, trace_path=tmp_path / "t.csv")
    assert [r["batch_size"] for r in rows] == controller.batches == load_trace(tmp_path / "t.csv").sizes.tolist()
    assert all(sum(r["batch_size"] for r in rows if r["epoch"] == e) == 96 for e in range(3))
    changes = [m for m in caplog.messages if m.startswith("adaptive batch:")]
    assert len(changes) == len(controller.changes)
    assert rows[0]["seconds"] is None and all(r["seconds"] > 0 for r in rows[1:] if r["micro_batch"] == 4)


def test_bad_settings_are_refused_with_the_fix(float64):
    x, y = data(20)
    model = mlp()
    model.compile(Optimizer(momentum()), loss="mse")
    controller = GoodputController(4, 1, ref_batch_size=8, max_batch=16, policy="error")
    with pytest.raises(TypeError, match=r"compiled with aikit\.ga\.TF\.noise\.NoiseOptimizer"):
        fit_adaptive(model, x, y, controller, base_lr=0.1)
    model.compile(NoiseOptimizer(momentum()), loss="mse")
    with pytest.raises(ValueError, match=r"devices=2 with policy='error'.*GoodputController\(max_device_batch, 1"):
        fit_adaptive(model, x, y, GoodputController(4, 2, ref_batch_size=8, max_batch=16, policy="error"), base_lr=0.1)
    with pytest.raises(ValueError, match="policy='ragged'"):
        fit_adaptive(model, x, y, GoodputController(4, 1, ref_batch_size=8, max_batch=16), base_lr=0.1)
    with pytest.raises(ValueError, match="batch 8 runs as one micro-batch on one replica, from which gradient noise "
                                         "cannot be measured: give the controller noise_every=4"):
        fit_adaptive(model, x, y, GoodputController(8, 1, ref_batch_size=8, max_batch=16, policy="error"), base_lr=0.1)
    with pytest.raises(ValueError, match="max_batch 32 is larger than the data set"):
        fit_adaptive(model, x, y, GoodputController(4, 1, ref_batch_size=8, max_batch=32, policy="error"), base_lr=0.1)
    with pytest.raises(ValueError, match="LR rule must be one of"):
        fit_adaptive(model, x, y, controller, base_lr=0.1, rule="cubic")
    with pytest.raises(ValueError, match=r"clipnorm=1\.0"):
        NoiseOptimizer(keras.optimizers.SGD(0.1, clipnorm=1.0))
    with pytest.raises(ValueError, match=r"NoiseOptimizer needs reduction='mean', got 'sum': it estimates \|G\|²"):
        NoiseOptimizer(keras.optimizers.SGD(0.1), 2, reduction="sum")
    assert int(model.optimizer.iterations.numpy()) == 0  # nothing ran
    model.optimizer.build(model.trainable_variables)  # from now on its inner all-reduce carries the norms
    with pytest.raises(ValueError, match="already serves another NoiseOptimizer"):
        NoiseOptimizer(model.optimizer.inner)


def test_a_controller_saved_at_an_epoch_end_resumes_with_the_next_epoch(float64):
    x, y = data(50)
    _, first, rows = adaptive_run(x, y, {2: 24}, epochs=1)
    resumed = ScriptedController({}, 4, 1, ref_batch_size=8, max_batch=24)
    resumed.load_state_dict(first.state_dict())
    model = mlp()
    model.compile(NoiseOptimizer(momentum()), loss="mse")
    more = fit_adaptive(model, x, y, resumed, base_lr=0.05, rule="sqrt", epochs=1, seed=3)
    assert {r["epoch"] for r in more} == {1} and more[0]["step"] == len(rows)
    first.batches.pop()  # a state from inside an epoch is refused
    with pytest.raises(ValueError, match="end inside epoch 0"):
        fit_adaptive(model, x, y, first, base_lr=0.05, rule="sqrt")
    assert tf.is_tensor(model.optimizer.iterations.value)
