"""Steps to a target validation loss on digits: AutoLRS against tuned baselines, side by side.

An MLP (64-64-10, PyTorch, SGD with momentum 0.9, batch 32) trains on scikit-learn's digits
until the validation loss reaches ``--target``, checked every ``--every`` steps. Three
contenders, each run for ``--seeds`` seeds (model init, data order and search):

* the best constant LR of a log grid (its grid search is *not* counted);
* the best cosine schedule ``peak * (1 + cos(pi t / T)) / 2`` over peaks from the same grid and
  lengths ``T`` (its grid search is *not* counted either);
* AutoLRS over ``[--min-lr, --max-lr]``, with the paper's structure (10 trials of tau/10 steps,
  tau doubling) scaled down to this task; *every* step counts, search included, and the target
  is checked only on the trajectory AutoLRS keeps (stage training, not the discarded trials).

Prints the median steps to target of each and the ratios baseline / AutoLRS (> 1: AutoLRS
needs fewer steps). The paper reports 1.22-1.5x against hand-tuned schedules on large
models; the baselines here are tuned by an oracle grid search that AutoLRS does not get.

    python benchmarks/autolrs_digits.py [--seeds 3] [--target 0.08] [--budget 4000] [--quick]
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import time

import numpy as np
import torch
from torch import nn

from aikit.autolrs.Torch import AutoLRS
from aikit.datasets import digits

BATCH = 32


def model_for(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def batches(n: int, seed: int, batch: int = BATCH):
    """An endless stream of shuffled batches of ``batch`` indices, a new permutation each epoch."""
    rng = np.random.default_rng(seed)
    while True:
        order = torch.from_numpy(rng.permutation(n))
        for start in range(0, n - batch + 1, batch):
            yield order[start:start + batch]


class Task:
    def __init__(self, args):
        x, y, xv, yv = digits()
        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)
        self.xv, self.yv = torch.from_numpy(xv), torch.from_numpy(yv)
        self.target, self.budget, self.every = args.target, args.budget, args.every

    def val_loss(self, model: nn.Module) -> float:
        with torch.no_grad():
            return nn.functional.cross_entropy(model(self.xv), self.yv).item()

    def run(self, seed: int, lr_at=None, autolrs_options: dict | None = None) -> int | float:
        """Steps until the validation loss reaches the target (inf if not within the budget)."""
        model = model_for(seed)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0, momentum=0.9)
        autolrs = None
        if autolrs_options is not None:
            autolrs = AutoLRS(model, optimizer, lambda: self.val_loss(model), **autolrs_options, seed=seed)
        stream = batches(len(self.y), seed)
        for step in range(1, self.budget + 1):
            if lr_at is not None:
                if lr_at(step - 1) is None:
                    return math.inf  # a finished cosine schedule
                optimizer.param_groups[0]["lr"] = lr_at(step - 1)
            index = next(stream)
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(self.x[index]), self.y[index])
            loss.backward()
            optimizer.step()
            if autolrs is not None:
                kept = autolrs.controller.phase == "train"  # else a trial, which will be undone
                autolrs.on_train_batch_end(loss)  # a new stage only checkpoints: the model stays
                if not kept:
                    continue
            if not math.isfinite(loss.item()):
                return math.inf
            if step % self.every == 0 and self.val_loss(model) <= self.target:
                return step
        return math.inf


def cosine(peak: float, length: int):
    return lambda t: peak * 0.5 * (1.0 + math.cos(math.pi * t / length)) if t < length else None


def median(values) -> float:
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--target", type=float, default=0.08, help="validation cross-entropy to reach")
    parser.add_argument("--budget", type=int, default=4000, help="most steps per run")
    parser.add_argument("--every", type=int, default=10, help="check the target every this many steps")
    parser.add_argument("--min-lr", type=float, default=1e-3)
    parser.add_argument("--max-lr", type=float, default=1.0)
    parser.add_argument("--tau", type=int, default=200, help="AutoLRS first stage (paper: 1000)")
    parser.add_argument("--tau-max", type=int, default=1600, help="AutoLRS longest stage (paper: 8000)")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--val-tau", type=int, default=None,
                        help="stages this long score trials on validation losses (default: --tau-max)")
    parser.add_argument("--quick", action="store_true", help="2 seeds, a coarse grid: a smoke run")
    parser.add_argument("--verbose", action="store_true", help="log AutoLRS's trials")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    seeds = range(2 if args.quick else args.seeds)
    grid = np.geomspace(args.min_lr, args.max_lr, 5 if args.quick else 10).tolist()
    lengths = [500, 1000, 2000] if args.quick else [250, 500, 1000, 2000, 4000]
    task = Task(args)
    began = time.perf_counter()

    constant = {lr: median([task.run(s, lr_at=lambda t, lr=lr: lr) for s in seeds]) for lr in grid}
    best_lr = min(constant, key=constant.get)
    print(f"constant LRs, median steps to val loss {args.target}:")
    for lr, steps in constant.items():
        print(f"  lr={lr:<8.4g} {steps}")

    peaks = sorted(grid, key=constant.get)[:3]  # cosine peaks around the best constant LRs
    peaks = sorted({*peaks, *(p * 2 for p in peaks if p * 2 <= args.max_lr * 4)})
    cosines = {(p, n): median([task.run(s, lr_at=cosine(p, n)) for s in seeds]) for p in peaks for n in lengths}
    best_cosine = min(cosines, key=cosines.get)
    print(f"best cosine: peak={best_cosine[0]:.4g}, T={best_cosine[1]}: {cosines[best_cosine]} steps "
          f"(of {len(cosines)} tried)")

    options = {"min_lr": args.min_lr, "max_lr": args.max_lr, "tau": args.tau, "tau_max": args.tau_max,
               "trials": args.trials, "val_tau": args.val_tau}
    runs = [task.run(s, autolrs_options=options) for s in seeds]
    autolrs = median(runs)
    print(f"AutoLRS (tau {args.tau}->{args.tau_max}, {args.trials} trials of tau/10, validation-scored from "
          f"tau={args.val_tau or args.tau_max}): steps per seed {runs}, "
          f"median {autolrs}")
    print(f"\nratio best constant / AutoLRS: {constant[best_lr] / autolrs:.2f}  (lr={best_lr:.4g})")
    print(f"ratio best cosine / AutoLRS:   {cosines[best_cosine] / autolrs:.2f}")
    print(f"(> 1: AutoLRS reaches the target in fewer steps, its search included; {time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
