"""One algorithm, two adapters: the Keras AutoLRS callback and the torch hook take the same
decisions, given the same losses and on the same problem (issue 46), on this process's backend."""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest

from aikit.keras.autolrs import AutoLRS as KerasAutoLRS

torch = pytest.importorskip("torch")
from aikit.autolrs.Torch import AutoLRS as TorchAutoLRS  # noqa: E402
from aikit.datasets import digits  # noqa: E402

STEPS = 100  # a 20-step range test, a 5-step ramp, the hold, a 40-step anneal


def loss_at(step: int, lr: float) -> float:
    """A loss that answers the LR in force: it falls with the LR up to about 0.5, blows up
    above 2, and has a little noise of its own; a spike at step 60 rolls the run back."""
    noise = 0.01 * math.sin(1.7 * step)
    return 2.3 / (1 + 4 * min(lr, 0.5) * step / 10) + max(0.0, lr - 2) ** 2 * 5 + noise + (50 if step == 60 else 0)


def keras_decisions(batch: int = 8) -> list:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), loss="mse")
    model.optimizer.build(model.trainable_variables)
    callback = KerasAutoLRS(lambda: 0.0, total_steps=STEPS, seed=0)
    callback.set_model(model)
    callback.on_train_begin()
    tracker = next(m for m in model.metrics if m.name == "loss")
    decided = []
    for step in range(STEPS):
        callback.on_train_batch_begin(step)
        tracker.update_state(loss_at(step, callback.lr), sample_weight=batch)  # what fit() does with a batch
        callback.on_train_batch_end(step)
        used = float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))
        decided.append((callback.lr, callback.action, callback.kept, used))
    return decided


def torch_decisions() -> list:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    hook = TorchAutoLRS(model, optimizer, lambda: 0.0, total_steps=STEPS, seed=0)
    decided = []
    for step in range(STEPS):
        hook.on_train_batch_end(torch.tensor(loss_at(step, hook.lr), dtype=torch.float64))
        decided.append((hook.lr, hook.action, hook.kept, optimizer.param_groups[0]["lr"]))
    return decided


def test_the_same_losses_give_the_same_decisions_in_both_adapters(float64):
    ours, theirs = keras_decisions(), torch_decisions()
    assert [d[:3] for d in ours] == [d[:3] for d in theirs]  # every LR, restore and checkpoint alike
    assert [d[3] for d in ours] == pytest.approx([d[3] for d in theirs], rel=1e-12)  # and in force
    actions = [d[1] for d in ours]
    assert any(a.restore for a in actions[25:])  # the spike's rollback is among them
    assert len({d[0] for d in ours}) > 30  # the range test, the ramp and the anneal


def test_the_same_problem_gives_the_same_range_test_and_schedule(float64):
    """SGD with momentum on the same data from the same weights: the range test, the LR it
    hands on and the kept schedule are the same in both frameworks (Keras' SGD would otherwise
    let its velocity lag the climbing LR, and its loss bottom out later)."""
    x, y, _, _ = digits(dtype=np.float64)
    rng = np.random.default_rng(0)
    index = np.concatenate([rng.permutation(len(y)) for _ in range(3)])[:32 * STEPS]  # STEPS batches of 32
    x, y = x.reshape(len(x), 64), y
    torch.manual_seed(0)
    net = torch.nn.Linear(64, 10).double()
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])
    model.set_weights([p.detach().numpy().T.copy() for p in net.parameters()])
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callback = KerasAutoLRS(lambda: 0.0, total_steps=STEPS, seed=0)
    model.fit(x[index], y[index], batch_size=32, epochs=1, shuffle=False, verbose=0, callbacks=[callback])

    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    hook = TorchAutoLRS(net, optimizer, lambda: 0.0, total_steps=STEPS, seed=0)
    xt, yt = torch.from_numpy(x[index]), torch.from_numpy(y[index])
    for step in range(STEPS):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(xt[32 * step:32 * step + 32]), yt[32 * step:32 * step + 32])
        loss.backward()
        optimizer.step()
        hook.on_train_batch_end(loss)
    ours, theirs = callback.controller, hook.controller
    assert ours.range_test["loss"] == pytest.approx(theirs.range_test["loss"], rel=1e-5)
    assert (ours.min_lr, ours.max_lr) == (theirs.min_lr, theirs.max_lr)
    assert ours.schedule() == theirs.schedule()
    kernel = keras.ops.convert_to_numpy(model.layers[0].kernel)
    np.testing.assert_allclose(kernel, net.weight.detach().numpy().T, rtol=1e-4, atol=1e-6)  # Keras: a float32 LR


def test_both_adapters_read_the_heavy_ball_momentum_alike():
    """The range test's max_lr accounts for SGD's momentum (not Adam's beta_1) in both."""
    for keras_optimizer, torch_optimizer, momentum in [
            (keras.optimizers.SGD(0.01, momentum=0.9), torch.optim.SGD, {"momentum": 0.9}),
            (keras.optimizers.SGD(0.01), torch.optim.SGD, {}),
            (keras.optimizers.Adam(1e-3), torch.optim.Adam, {})]:
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(keras_optimizer, loss="mse")
        callback = KerasAutoLRS(lambda: 0.0, total_steps=STEPS)
        callback.set_model(model)
        callback.on_train_begin()
        net = torch.nn.Linear(3, 2)
        hook = TorchAutoLRS(net, torch_optimizer(net.parameters(), lr=0.01, **momentum), lambda: 0.0,
                            total_steps=STEPS)
        assert callback.controller.momentum == hook.controller.momentum == momentum.get("momentum", 0.0)
