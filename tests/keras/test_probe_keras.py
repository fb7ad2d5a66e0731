"""The critical-batch probe in Keras (``KerasBranches`` under ``aikit.core.critical_batch``), on
the backend this process loaded: every branch rolled back bit for bit (weights, momentum, the
dropout's seed generator, the GA optimizer's counters), a branch trains exactly the plain Keras
steps it stands for, and ``fit_adaptive`` runs a probed run at the LR the probe chose."""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest
from common import EXACT, data, mlp

from aikit.core.critical_batch import PROBED_NOISE_EVERY, CriticalBatchProbe, ProbeController, ProbePolicy
from aikit.core.errors import InvalidType
from aikit.keras import NoiseOptimizer
from aikit.keras.elastic import fit_adaptive
from aikit.keras.elastic.probe import KerasBranches
from aikit.runtime.Keras.backend import to_numpy

BASE, MAX, LR = 8, 32, 0.05


def learnable(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Targets a linear map of the inputs, with a little noise: the held-out loss falls."""
    x, noise = data(n)
    return x, x @ np.linspace(-1.0, 1.0, 12).reshape(4, 3) + 0.1 * noise


def per_sample(model, x, y):
    return keras.ops.mean(keras.ops.square(keras.ops.subtract(model(x), y)), axis=-1)


def with_dropout() -> keras.Model:
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(6, activation="tanh"), keras.layers.Dropout(0.2),
                             keras.layers.Dense(3)])


def probed_run(model, x, y, inner, *, first: int, epochs: int = 1, epsilon: float = 0.5):
    """``fit_adaptive`` under a probe policy; the controller and the history."""
    model.compile(NoiseOptimizer(inner), loss="mse")
    policy = ProbePolicy(CriticalBatchProbe(64, epsilon=epsilon, rules=("sqrt", "linear"), z=0.0), first=first)
    controller = ProbeController(policy, MAX, 1, ref_batch_size=BASE, max_batch=MAX, policy="error",
                                 noise_every=PROBED_NOISE_EVERY)
    controller.attach(KerasBranches(model, per_sample, x, y, (x[:32], y[:32])))
    rows = fit_adaptive(model, x, y, controller, base_lr=LR, rule="constant", epochs=epochs, seed=3)
    return controller, rows


def state(model) -> list[np.ndarray]:
    variables = [*model.variables, *model.optimizer.variables]
    return [np.array(to_numpy(v), copy=True) for v in variables]


def test_every_branch_is_rolled_back_bit_for_bit(float64):
    x, y = learnable(128)
    model = with_dropout()
    controller, _ = probed_run(model, x, y, keras.optimizers.SGD(LR, momentum=0.9), first=10**9)
    before = state(model)
    result = CriticalBatchProbe(64, rules=("sqrt", "linear"), z=0.0).run(
        controller.branches, BASE, max_batch=MAX, dataset_size=len(x))
    after = state(model)
    assert result.samples >= 3 * 64 and len(result.losses) >= 2
    assert not np.array_equal(result.start_loss, result.base_loss)  # the branches trained
    assert len(before) == len(after) and all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))


def test_a_branch_is_the_plain_keras_steps_it_stands_for(float64):
    x, y = learnable(128)
    model = mlp()
    controller, _ = probed_run(model, x, y, keras.optimizers.SGD(LR), first=10**9)
    start = model.get_weights()
    result = CriticalBatchProbe(64, rules=("sqrt",), z=0.0, epsilon=0.9).run(
        controller.branches, BASE, max_batch=MAX, dataset_size=len(x), seed=7, factors=[2, 4])
    window = np.random.default_rng(7).permutation(len(x))[:64]  # the probe's seeded draw
    for k in (2, 4):
        reference = mlp()
        reference.set_weights(start)
        sgd = keras.optimizers.SGD(LR * math.sqrt(k))
        for first in range(0, 64, k * BASE):
            rows = window[first:first + k * BASE]
            sgd.apply(_gradients(reference, x[rows], y[rows]), reference.trainable_variables)
        held = float(np.mean(to_numpy(keras.ops.stop_gradient(per_sample(reference, x[:32], y[:32])))))
        # (the run's compiled step against an eager reference: JAX's jit rounds apart at ~1e-9)
        assert result.losses[k, "sqrt"] == pytest.approx(held, abs=EXACT if keras.backend.backend() != "jax" else 1e-7)


def _gradients(model, x, y):
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = keras.ops.mean(per_sample(model, x, y))
        return tape.gradient(loss, model.trainable_variables)
    if backend == "jax":
        import jax

        values = [v.value for v in model.trainable_variables]

        def loss_of(trainable):
            out, _ = model.stateless_call(trainable, [v.value for v in model.non_trainable_variables], x)
            return keras.ops.mean(keras.ops.square(out - y))

        return jax.grad(loss_of)(values)
    model.zero_grad()
    loss = keras.ops.mean(per_sample(model, x, y))
    loss.backward()
    return [v.value.grad for v in model.trainable_variables]


def test_a_probed_keras_run_grows_at_the_lr_the_probe_chose(float64):
    x, y = learnable(128)
    model = mlp()
    controller, rows = probed_run(model, x, y, keras.optimizers.SGD(LR), first=64, epochs=2)
    policy = controller.batch_policy
    grown = [row for row in policy.rows if row["critical_batch"] > row["batch"]]
    assert grown and max(controller.batches) > BASE  # a probe grew the batch
    assert [r["batch_size"] for r in rows] == controller.batches
    first_grown = next(i for i, r in enumerate(rows) if r["batch_size"] > BASE)
    assert {r["lr"] for r in rows[:first_grown]} == {LR}
    assert rows[-1]["lr"] == pytest.approx(LR * policy.lr_scale) and policy.lr_scale > 1


def test_a_model_without_aikits_optimizer_is_refused(float64):
    x, y = data(16)
    model = mlp()
    model.compile(keras.optimizers.SGD(LR), loss="mse")
    with pytest.raises(InvalidType, match="KerasBranches needs the model compiled with aikit's Keras GA optimizer"):
        KerasBranches(model, per_sample, x, y, (x, y))
