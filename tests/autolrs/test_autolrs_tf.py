"""aikit.autolrs.TF.AutoLRS as a Keras 3 callback in real model.fit runs."""

from __future__ import annotations

import math
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

keras = pytest.importorskip("keras")

import aikit.ga.TF.optimizers  # noqa: E402
from aikit.autolrs.TF import AutoLRS, ReplaySchedule  # noqa: E402
from aikit.core.errors import InvalidValue  # noqa: E402
from aikit.datasets import digits  # noqa: E402

OPTIONS = {"tau": 30, "tau_max": 30, "trials": 3, "val_tau": 10**6, "warmup_steps": 4, "warmup_lr": 0.01,
           "keep_winner": False}
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@pytest.fixture(scope="module")
def data():
    x, y, xv, yv = digits()
    return x.reshape(len(x), 64), y, xv.reshape(len(xv), 64), yv


def mlp(optimizer, dropout: float = 0.0) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dropout(dropout), keras.layers.Dense(10)])
    model.compile(optimizer=optimizer, loss=LOSS)
    return model


class Probe(keras.callbacks.Callback):
    """Placed after AutoLRS: records the LR each step starts with and the state after each decision."""

    def __init__(self, autolrs: AutoLRS):
        super().__init__()
        self.autolrs, self.step_lrs, self.checkpoint, self.restores = autolrs, [], None, 0

    def state(self) -> list[np.ndarray]:
        lr = self.model.optimizer._learning_rate  # set after the restore: compared on its own
        return [v.numpy().copy() for v in [*self.model.variables, *self.model.optimizer.variables] if v is not lr]

    def on_train_batch_begin(self, batch, logs=None):
        self.step_lrs.append(float(self.model.optimizer.learning_rate))

    def on_train_batch_end(self, batch, logs=None):
        action = self.autolrs.action
        if action.checkpoint:
            self.checkpoint = self.state()
        elif action.restore:
            self.restores += 1
            restored = self.state()
            assert len(restored) == len(self.checkpoint)
            for now, then in zip(restored, self.checkpoint, strict=True):
                np.testing.assert_array_equal(now, then)


def test_restore_returns_bit_exactly_to_the_checkpoint_and_the_new_lr_is_in_force(data):
    x, y, _, _ = data
    model = mlp(keras.optimizers.Adam(), dropout=0.3)
    autolrs = AutoLRS(lambda: 0.0, 1e-4, 1e-1, **OPTIONS)
    probe = Probe(autolrs)
    model.fit(x[:32 * 20], y[:32 * 20], batch_size=32, epochs=1, shuffle=False, verbose=0,
              callbacks=[autolrs, probe])
    assert probe.restores == 3
    seeds = [v for v in model.variables if "seed" in v.path]
    assert seeds, "dropout's seed state is among the checkpointed variables"
    # Every step ran at the LR the controller recorded for it (Keras holds it in float32),
    # trials right after restores included.
    f32 = lambda lr: float(np.float32(lr))  # noqa: E731
    assert probe.step_lrs == [f32(r.lr) for r in autolrs.controller.history]
    trials = autolrs.controller.stages[0].trials
    assert probe.step_lrs[:5] == [f32(x) for x in (0.001, 0.0025, 0.005, 0.0075, 0.01)]  # the original's warmup
    assert [probe.step_lrs[5 + 3 * i] for i in range(3)] == [f32(t.lr) for t in trials]
    assert probe.step_lrs[5 + 9] == f32(autolrs.controller.stages[0].lr)


def test_the_controller_sees_each_steps_own_loss_not_the_running_mean(data):
    x, y, _, _ = data
    model = mlp(keras.optimizers.SGD(0.1))
    losses = [float(LOSS(y[:32], model(x[:32], training=False)))]
    autolrs = AutoLRS(lambda: 0.0, 1e-4, 1e-1, **OPTIONS)
    history = model.fit(x[:320], y[:320], batch_size=32, epochs=1, shuffle=False, verbose=0, callbacks=[autolrs])
    seen = [r.loss for r in autolrs.controller.history]
    assert seen[0] == pytest.approx(losses[0], rel=1e-5)
    assert np.mean(seen) == pytest.approx(history.history["loss"][0], rel=1e-5)
    assert np.std(seen) > 0.01  # step losses, not a smoothed mean


def test_kept_says_whether_the_model_is_on_the_run_autolrs_keeps(data):
    x, y, _, _ = data
    model = mlp(keras.optimizers.SGD(0.1))
    autolrs = AutoLRS(lambda: 0.0, 1e-4, 1e-1, **OPTIONS)
    seen = []
    probe = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: seen.append((autolrs.kept, autolrs.controller.phase)))
    model.fit(x[:32 * 20], y[:32 * 20], batch_size=32, epochs=1, shuffle=False, verbose=0, callbacks=[autolrs, probe])
    assert [kept for kept, _ in seen] == [phase not in ("trial", "range") for _, phase in seen]
    assert {kept for kept, _ in seen} == {True, False}  # warmup and stage: kept; the trials: not


def test_a_learning_rate_schedule_is_refused(data):
    x, y, _, _ = data
    model = mlp(keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)))
    with pytest.raises(InvalidValue, match="AutoLRS sets the learning rate itself"):
        model.fit(x[:64], y[:64], batch_size=32, verbose=0, callbacks=[AutoLRS(lambda: 0.0, 1e-4, 1e-1)])


@pytest.mark.parametrize("ga", [False, True])
def test_a_schedule_free_optimizer_is_refused_by_name(data, ga):
    # Keras' ScheduleFreeAdamW (issue 27): its averaging replaces the schedule AutoLRS would set
    x, y, _, _ = data
    optimizer = (aikit.ga.TF.optimizers.ScheduleFreeAdamW(2, learning_rate=0.01) if ga
                 else keras.optimizers.ScheduleFreeAdamW(learning_rate=0.01))
    model = mlp(optimizer)
    before = [v.numpy().copy() for v in model.variables]
    with pytest.raises(TypeError, match=r"^ScheduleFreeAdamW is Schedule-Free: its averaging of the iterates "
                                        r"replaces the LR schedule, .* run AutoLRS over AdamW or SGD"):
        model.fit(x[:64], y[:64], batch_size=32, verbose=0, callbacks=[AutoLRS(lambda: 0.0, 1e-4, 1e-1)])
    assert all(np.array_equal(v.numpy(), b) for v, b in zip(model.variables, before, strict=True))  # no step taken


def run_digits(data, lr_or_options, steps: int = 600) -> tuple[float, AutoLRS | None]:
    x, y, xv, yv = data
    lr = lr_or_options if isinstance(lr_or_options, float) else 0.1
    model = mlp(keras.optimizers.SGD(lr))
    val_fn = lambda: float(LOSS(yv, model(xv, training=False)))  # noqa: E731
    callbacks = [AutoLRS(val_fn, 1e-3, 10.0, **lr_or_options)] if isinstance(lr_or_options, dict) else []
    n = len(y) // 32 * 32
    model.fit(np.tile(x[:n], (14, 1)), np.tile(y[:n], 14), batch_size=32, epochs=1, steps_per_epoch=steps,
              shuffle=False, verbose=0, callbacks=callbacks)
    return val_fn(), (callbacks[0] if callbacks else None)


def test_short_digits_run_beats_its_first_trial_lr_held_constant(data):
    # As the torch test: 600 steps, search included; seed 2 draws a slow first trial LR.
    options = {"tau": 100, "tau_max": 200, "trials": 5, "trial_ratio": 5, "val_points": 5, "seed": 2, "design": 0}
    tuned, autolrs = run_digits(data, options)
    stages = autolrs.controller.stages
    assert autolrs.controller.steps == 600 and stages[1].lr is not None and stages[1].val_every == 8
    first_lr = stages[0].trials[0].lr
    constant, _ = run_digits(data, first_lr)
    assert math.isfinite(tuned)
    assert tuned < constant, (tuned, constant, first_lr, [s.lr for s in stages])


@pytest.mark.slow
def test_under_mirrored_strategy_every_replica_restores_exactly_at_the_lr_decided():
    import json
    import subprocess
    import sys
    from pathlib import Path

    worker = Path(__file__).with_name("autolrs_mirrored_worker.py")
    run = subprocess.run([sys.executable, str(worker)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["restores"] == 3 and result["restore_mismatches"] == 0
    assert result["checkpointed_values"] > 0
    assert result["step_lrs"] == result["history_lrs"]  # each step ran at the LR decided for it
    seen = result["seen"]
    assert np.mean(seen[:20]) == pytest.approx(result["epoch_losses"][0], rel=1e-5)  # the reduced step losses
    assert np.mean(seen[20:]) == pytest.approx(result["epoch_losses"][1], rel=1e-5)


def test_the_found_schedule_replays_as_a_plain_keras_schedule(data, tmp_path):
    x, y, _, _ = data
    model = mlp(keras.optimizers.SGD(0.05))
    autolrs = AutoLRS(lambda: 0.0, 1e-3, 1.0, total_steps=120, tau=20, trials=3, trial_ratio=5)
    model.fit(x[:32 * 40], y[:32 * 40], batch_size=32, epochs=3, shuffle=False, verbose=0, callbacks=[autolrs])
    autolrs.export_schedule(tmp_path / "schedule.csv")
    kept = [lr for _, lr in autolrs.controller.schedule()]
    replayed = mlp(keras.optimizers.SGD(ReplaySchedule(tmp_path / "schedule.csv")))
    probe = keras.callbacks.LambdaCallback(on_train_batch_begin=lambda batch, logs: used.append(
        float(replayed.optimizer.learning_rate)))
    used = []
    replayed.fit(x[:32 * 10], y[:32 * 10], batch_size=32, epochs=len(kept) // 10 + 1, shuffle=False, verbose=0,
                 callbacks=[probe])
    f32 = lambda lr: float(np.float32(lr))  # noqa: E731
    assert used[:len(kept)] == [f32(lr) for lr in kept]
    assert used[len(kept):] == [f32(kept[-1])] * (len(used) - len(kept))  # then the last LR stays


def fit_with_autolrs(data, first: int, last: int, saved: dict | None = None):
    """Steps ``first..last-1`` of one SGD run under AutoLRS; from ``saved`` weights and state."""
    x, y, _, _ = data
    model = mlp(keras.optimizers.SGD(0.05, momentum=0.9))
    model.optimizer.build(model.trainable_variables)
    autolrs = AutoLRS(lambda: 0.0, 1e-3, 1.0, total_steps=60, tau=10, trials=3, trial_ratio=3, anneal=0.2)
    if saved is not None:
        for variable, value in zip([*model.variables, *model.optimizer.variables], saved["weights"], strict=True):
            variable.assign(value)
        autolrs.load_state_dict(saved["autolrs"])
    model.fit(x[32 * first:32 * last], y[32 * first:32 * last], batch_size=32, epochs=1, shuffle=False, verbose=0,
              callbacks=[autolrs])
    weights = [np.array(v.numpy(), copy=True) for v in [*model.variables, *model.optimizer.variables]]
    return autolrs, {"weights": weights, "autolrs": autolrs.state_dict()}


def test_a_preempted_keras_search_resumes_where_it_was(data):
    whole, _ = fit_with_autolrs(data, 0, 44)  # digits: 44 full batches of 32
    _, saved = fit_with_autolrs(data, 0, 23)
    resumed, _ = fit_with_autolrs(data, 23, 44, saved)
    # Every step at the same LR in the same phase; the losses equal up to float32 rounding (each
    # is a difference of the loss tracker's running sums, which restart with each fit()).
    mine, theirs = resumed.controller.history, whole.controller.history
    assert [(r.step, r.lr, r.phase) for r in mine] == [(r.step, r.lr, r.phase) for r in theirs]
    np.testing.assert_allclose([r.loss for r in mine], [r.loss for r in theirs], rtol=1e-5, atol=1e-5)
    assert resumed.controller.schedule() == whole.controller.schedule()
    assert sum(len(s.trials) for s in whole.controller.stages) >= 6  # the run spans trials of 2 stages


@pytest.mark.slow
def test_under_multi_worker_mirrored_strategy_every_worker_applies_the_chiefs_decision():
    """Two real worker processes on localhost (TF_CONFIG), each with its own AutoLRS seed and
    its own half of every batch: both run every step at the chief's LR and end with equal weights."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from ports import free_ports

    worker = Path(__file__).with_name("autolrs_multiworker_worker.py")
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(2)]}
    processes = []
    for index in range(2):
        env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}))
        processes.append(subprocess.Popen([sys.executable, str(worker)], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
    results = []
    for process in processes:
        out, err = process.communicate(timeout=300)
        lines = [line for line in out.splitlines() if line.startswith("RESULTS ")]
        assert process.returncode == 0 and lines, out[-2000:] + err[-4000:]
        results.append(json.loads(lines[-1][len("RESULTS "):]))
    chief, other = sorted(results, key=lambda r: r["worker"])
    assert chief["multi_worker"] and chief["replicas"] == 2
    assert len(chief["decided_lrs"]) == 40 and chief["restores"] >= 4  # trials of two stages, restored
    assert other["decided_lrs"] == []  # the other worker's controller never decided
    assert chief["step_lrs"] == chief["decided_lrs"] and other["step_lrs"] == chief["decided_lrs"]
    assert len(set(chief["step_lrs"])) > 3
    np.testing.assert_array_equal(other["weights"], chief["weights"])
