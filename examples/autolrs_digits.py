"""AutoLRS on the embedded digits, with PyTorch and with Keras: the LR schedule found on the fly.

An MLP trains with SGD (momentum 0.9) while AutoLRS searches one constant LR per stage in
``[--min-lr, --max-lr]``: each stage tries ``--trials`` LRs for tau/10 steps from the stage's
checkpoint, forecasts each one's loss at tau, and trains the stage at the best. Stages grow
from ``--tau`` to ``--tau-max`` steps; the longest are scored on validation losses. Every
trial and choice is logged; the LR schedule and the loss over all steps (search included)
are plotted to ``<out>/autolrs_<framework>.png`` and the schedule the run kept is written to
``<out>/autolrs_<framework>.csv`` (``step,lr``). About half a minute per framework on a CPU:

    python examples/autolrs_digits.py                      # both frameworks
    python examples/autolrs_digits.py --framework torch --steps 3000 --tau 200 --tau-max 800
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from aikit.datasets import digits


def accuracy(logits, labels) -> float:
    return float((logits.argmax(1) == labels).mean())


def run_torch(args, options: dict) -> tuple[float, float]:
    import torch
    from torch import nn

    from aikit.autolrs.Torch import AutoLRS

    torch.set_num_threads(1)  # a tiny model: more threads only add overhead
    torch.manual_seed(0)
    x, y, xv, yv = (torch.from_numpy(a) for a in digits())
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def val_loss() -> float:
        with torch.no_grad():
            return nn.functional.cross_entropy(model(xv), yv).item()

    autolrs = AutoLRS(model, optimizer, val_loss, args.min_lr, args.max_lr, **options)
    step = 0
    while step < args.steps:
        for index in torch.randperm(len(y)).split(args.batch_size):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x[index]), y[index])
            loss.backward()
            optimizer.step()
            autolrs.on_train_batch_end(loss)
            step += 1
            if step == args.steps:
                break
    autolrs.plot(Path(args.out) / "autolrs_torch.png")
    autolrs.export_schedule(Path(args.out) / "autolrs_torch.csv")  # replay: aikit.autolrs.Torch.ReplaySchedule
    with torch.no_grad():
        logits = model(xv)
    return val_loss(), float((logits.argmax(1) == yv).float().mean())


def run_keras(args, options: dict) -> tuple[float, float]:
    import keras
    import numpy as np

    from aikit.autolrs.TF import AutoLRS

    keras.utils.set_random_seed(0)
    x, y, xv, yv = digits()
    x, xv = x.reshape(len(x), 64), xv.reshape(len(xv), 64)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9), loss=loss_fn)

    def val_loss() -> float:  # not model.evaluate(), which would reset fit()'s loss tracker
        return float(loss_fn(yv, model(xv, training=False)))

    autolrs = AutoLRS(val_loss, args.min_lr, args.max_lr, **options)
    per_epoch = -(-len(y) // args.batch_size)
    model.fit(x, y, batch_size=args.batch_size, epochs=-(-args.steps // per_epoch),
              verbose=0, callbacks=[autolrs, keras.callbacks.LambdaCallback(
                  on_train_batch_end=lambda batch, logs: autolrs.controller.steps >= args.steps
                  and setattr(model, "stop_training", True))])
    autolrs.plot(Path(args.out) / "autolrs_keras.png")
    autolrs.export_schedule(Path(args.out) / "autolrs_keras.csv")  # replay: aikit.autolrs.TF.ReplaySchedule
    return val_loss(), accuracy(np.asarray(model(xv, training=False)), yv)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--framework", choices=["torch", "keras", "both"], default="both")
    parser.add_argument("--steps", type=int, default=1800, help="training steps, search included")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--min-lr", type=float, default=1e-3)
    parser.add_argument("--max-lr", type=float, default=1.0)
    parser.add_argument("--tau", type=int, default=100, help="first stage's steps (paper: 1000)")
    parser.add_argument("--tau-max", type=int, default=400, help="longest stage's steps (paper: 8000)")
    parser.add_argument("--trials", type=int, default=10, help="LRs tried per stage (paper: 10)")
    parser.add_argument("--seed", type=int, default=0, help="the search's seed")
    parser.add_argument("--out", default=".", help="folder for the PNG plots")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    options = {"tau": args.tau, "tau_max": args.tau_max, "trials": args.trials, "seed": args.seed}
    frameworks = ["torch", "keras"] if args.framework == "both" else [args.framework]
    for framework in frameworks:
        loss, acc = (run_torch if framework == "torch" else run_keras)(args, options)
        print(f"{framework}: validation loss {loss:.4f}, accuracy {acc:.3f} after {args.steps} steps; "
              f"plot in {Path(args.out) / f'autolrs_{framework}.png'}")


if __name__ == "__main__":
    main()
