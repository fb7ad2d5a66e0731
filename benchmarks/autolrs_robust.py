"""AutoLRS's default against the best constant of a small grid, per seed, torch and Keras (issue 46).

The embedded digits (the first 1,000 training digits, the 360 held out for validation), an MLP
64-32-10, batch 50, ``--steps`` updates (300), every step counted, AutoLRS's range test
included. The batches are the same in both frameworks (one seeded index stream per seed, fed to
Keras ``fit`` with ``shuffle=False``); with ``--same-init`` (the default) Keras starts from the
torch model's weights, so the two differ only in their framework's arithmetic and update rule.

Per seed and optimizer (SGD with momentum 0.9; AdamW, weight decay 0.01) it runs AutoLRS's
default (``total_steps=--steps``, nothing else given) and a constant LR per grid point, and prints
the range test's suggestion (the LR where its loss bottoms out, and ``max_lr``), the LR held,
the validation loss at the ramp's end, the final validation loss and accuracy, and the grid's
best constant (by validation loss) beside it: ``ok`` where AutoLRS is within 10 % of its loss
and 1 point of its accuracy. ``--json PATH`` writes every figure::

    nice python benchmarks/autolrs_robust.py --framework torch --seeds 5
    KERAS_BACKEND=jax nice python benchmarks/autolrs_robust.py --framework keras --seeds 5
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

TRAIN, BATCH, MOMENTUM, WEIGHT_DECAY = 1000, 50, 0.9, 0.01
GRIDS = {"sgd": (0.03, 0.1, 0.3, 1.0), "adamw": (1e-3, 3e-3, 1e-2, 3e-2)}


def data():
    from aikit.datasets import digits

    x, y, xv, yv = digits()
    return x[:TRAIN].reshape(-1, 64), y[:TRAIN], xv.reshape(-1, 64), yv


def order(seed: int, steps: int) -> np.ndarray:
    """The sample indices of ``steps`` batches: a new seeded permutation each epoch."""
    rng, out = np.random.default_rng(seed), []
    while len(out) < steps * BATCH:
        perm = rng.permutation(TRAIN)
        out.extend(perm[: TRAIN - TRAIN % BATCH])
    return np.asarray(out[: steps * BATCH])


def torch_weights(seed: int) -> list[np.ndarray]:
    """The torch MLP's initial weights (Keras layout: kernels transposed)."""
    model = torch_model(seed)
    return [p.detach().numpy().T.copy() if p.ndim == 2 else p.detach().numpy().copy() for p in model.parameters()]


def torch_model(seed: int):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def probe(controller) -> bool:
    """Whether the step just taken ended the ramp of stage 0 (the held LR starts next)."""
    return (controller.phase == "train" and bool(controller.stages) and controller.stage.index == 0
            and controller.steps - controller._segment_start == controller.settings.ramp_steps)


def summary(controller, after_ramp: float) -> dict:
    from aikit.core.lr_range import suggest

    test = controller.range_test
    hot = suggest(test["lr"], test["loss"], method="bottom").lr if test["lr"] else math.nan
    held = controller.stages[0].lr if controller.stages else math.nan
    return {"bottom": hot, "max_lr": controller.max_lr, "held": held, "after_ramp": after_ramp,
            "rollbacks": controller.rollbacks, "range_lr": list(test["lr"]), "range_loss": list(test["loss"])}


def run_torch(seed: int, steps: int, opt: str, lr: float | None, options: dict) -> dict:
    import torch
    from torch import nn

    from aikit.autolrs.Torch import AutoLRS

    x, y, xv, yv = (torch.from_numpy(a) for a in data())
    model = torch_model(seed)
    optimizer = (torch.optim.SGD(model.parameters(), lr=lr or 0.01, momentum=MOMENTUM) if opt == "sgd" else
                 torch.optim.AdamW(model.parameters(), lr=lr or 1e-3, weight_decay=WEIGHT_DECAY))

    def evaluate() -> tuple[float, float]:
        with torch.no_grad():
            logits = model(xv)
        return nn.functional.cross_entropy(logits, yv).item(), (logits.argmax(1) == yv).float().mean().item()

    autolrs = None if lr is not None else AutoLRS(model, optimizer, lambda: evaluate()[0], total_steps=steps,
                                                  seed=seed, **options)
    after_ramp = math.nan
    index = torch.from_numpy(order(seed, steps))
    for step in range(steps):
        batch = index[step * BATCH:(step + 1) * BATCH]
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
        loss.backward()
        optimizer.step()
        if autolrs is not None:
            autolrs.on_train_batch_end(loss)
            if probe(autolrs.controller):
                after_ramp = evaluate()[0]
    val_loss, val_acc = evaluate()
    out = {"loss": val_loss if math.isfinite(val_loss) else math.inf, "acc": val_acc}
    return out | ({} if autolrs is None else summary(autolrs.controller, after_ramp))


def run_keras(seed: int, steps: int, opt: str, lr: float | None, options: dict, same_init: bool) -> dict:
    import keras

    from aikit.autolrs.TF import AutoLRS

    x, y, xv, yv = data()
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
    if same_init:
        model.set_weights(torch_weights(seed))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = (keras.optimizers.SGD(lr or 0.01, momentum=MOMENTUM) if opt == "sgd" else
                 keras.optimizers.AdamW(lr or 1e-3, weight_decay=WEIGHT_DECAY))
    model.compile(optimizer, loss=loss_fn)

    def evaluate() -> tuple[float, float]:
        logits = np.asarray(keras.ops.convert_to_numpy(model(xv, training=False)))
        return float(keras.ops.convert_to_numpy(loss_fn(yv, logits))), float((logits.argmax(1) == yv).mean())

    callbacks, after_ramp = [], [math.nan]
    autolrs = None
    if lr is None:
        autolrs = AutoLRS(lambda: evaluate()[0], total_steps=steps, seed=seed, **options)
        callbacks = [autolrs, keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: probe(
            autolrs.controller) and after_ramp.__setitem__(0, evaluate()[0]))]
    index = order(seed, steps)
    model.fit(x[index], y[index], batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
    val_loss, val_acc = evaluate()
    out = {"loss": val_loss if math.isfinite(val_loss) else math.inf, "acc": val_acc}
    return out | ({} if autolrs is None else summary(autolrs.controller, after_ramp[0]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--framework", choices=["torch", "keras"], default="torch")
    parser.add_argument("--optimizers", default="sgd,adamw")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--keras-init", action="store_true", help="Keras' own initialisers, not torch's weights")
    parser.add_argument("--no-grid", action="store_true", help="AutoLRS only")
    parser.add_argument("--option", action="append", default=[], help="an AutoLRS option, NAME=VALUE")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    options = {k: json.loads(v) for k, v in (o.split("=", 1) for o in args.option)}
    if args.framework == "torch":
        import torch

        torch.set_num_threads(1)
        run = run_torch
    else:
        def run(seed, steps, opt, lr, options):
            return run_keras(seed, steps, opt, lr, options, not args.keras_init)
    began, results = time.time(), {}
    label = args.framework if args.framework == "torch" else f"keras/{os.environ.get('KERAS_BACKEND', 'tensorflow')}"
    for opt in args.optimizers.split(","):
        for seed in range(args.seeds):
            auto = run(seed, args.steps, opt, None, options)
            grid = {} if args.no_grid else {lr: run(seed, args.steps, opt, lr, {}) for lr in GRIDS[opt]}
            best = min(grid, key=lambda lr: grid[lr]["loss"]) if grid else None
            results[f"{opt}/{seed}"] = {"autolrs": auto, "grid": {str(k): v for k, v in grid.items()}, "best": best}
            line = (f"{label:14s} {opt:5s} seed {seed}: bottom {auto['bottom']:.3g} max_lr {auto['max_lr']:.3g} "
                    f"held {auto['held']:.3g} (rollbacks {auto['rollbacks']}) after ramp {auto['after_ramp']:.3f}; "
                    f"final {auto['loss']:.4f}/{auto['acc']:.3f}")
            if best is not None:
                b = grid[best]
                ok = auto["loss"] <= 1.1 * b["loss"] and auto["acc"] >= b["acc"] - 0.01
                line += f" | grid best {best:g}: {b['loss']:.4f}/{b['acc']:.3f} {'ok' if ok else 'WORSE'}"
            print(line, flush=True)
    print(f"({time.time() - began:.0f} s)")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle)


if __name__ == "__main__":
    main()
