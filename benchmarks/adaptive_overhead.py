"""What the adaptive batch's measuring costs per update, taken apart, side by side in one run.

At one global batch (the adaptive run's bounds pinned to it, so it decides nothing and every run
trains the same updates), alternated and repeated, the training thread's CPU time per update of:

* **fixed**: ``TraceSampler`` at the batch and ``ConstantOptimizer``, one micro-batch an update;
* **split**: the same with ``noise_every=4``: every fourth update in two micro-batches, the deal
  an adaptive run makes on one device to measure the gradient noise, nothing measured;
* **adaptive**: ``AdaptiveSampler``/``AdaptiveOptimizer`` with their defaults: that deal, the
  gradient hooks of the measured updates, the timing, the controller's record and decisions.

``split / fixed`` is the price of the extra micro-steps, ``adaptive / split`` that of the measuring
and bookkeeping; ``aikit step`` is the CPU inside ``optimizer.step()`` (aikit's own work, the
wrapped optimizer's update included). Medians over the repeats; the tasks are
``batch_schedules.py``'s (MNIST-1D's CNN with SGD, its MLP with Adam).

    python benchmarks/adaptive_overhead.py                       # both tasks, batches 32 and 128
    python benchmarks/adaptive_overhead.py --task mlp --batches 16 256 --repeats 9
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import types
import warnings
from pathlib import Path

import torch

from aikit.elastic.Torch import AdaptiveOptimizer, AdaptiveSampler, ConstantOptimizer, TraceSampler

sys.path.insert(0, str(Path(__file__).parent))

from batch_schedules import TASKS, Clock, train

RUNS = ("fixed", "split", "adaptive")


class StepClock:
    """CPU seconds spent inside ``optimizer.step()``."""

    def __init__(self, optimizer) -> None:
        self.seconds, step = 0.0, optimizer.step

        def timed(*args, **kwargs):
            start = time.thread_time()
            try:
                return step(*args, **kwargs)
            finally:
                self.seconds += time.thread_time() - start

        optimizer.step = timed


def one_run(task, name: str, batch: int, lr: float, seed: int) -> tuple[float, float]:
    """``(CPU ms per update, of it in optimizer.step())`` of one run."""
    torch.manual_seed(seed)
    model, clock, size = task.model(), Clock(), len(task.train)
    if name == "adaptive":
        sampler = AdaptiveSampler(size, ref_batch_size=batch, max_batch=batch, max_device_batch=task.max_device,
                                  seed=seed)
        optimizer = AdaptiveOptimizer(task.optimizer(model, lr), sampler, task.rule, clock=clock)
    else:
        sampler = TraceSampler(size, batch, max_device_batch=task.max_device, seed=seed,
                               noise_every=4 if name == "split" else None)
        optimizer = ConstantOptimizer(task.optimizer(model, lr), sampler)
    inside = StepClock(optimizer)
    run = train(task, model, sampler, optimizer, clock, task.budget, metric=lambda: 0.0)
    return clock() * 1e3 / run["updates"], inside.seconds * 1e3 / run["updates"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", nargs="+", choices=["mnist1d", "mlp"], default=["mnist1d", "mlp"])
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", UserWarning)
    print(f"CPU ms per update (median of {args.repeats} alternated runs of {args.epochs} epochs)")
    print(f"{'task':14s} {'batch':>5s} {'fixed':>7s} {'split':>7s} {'adaptive':>8s} {'split/fixed':>11s} "
          f"{'adaptive/split':>14s} {'adaptive/fixed':>14s}   aikit step: fixed, split, adaptive")
    for task_name in args.task:
        task = TASKS[task_name](types.SimpleNamespace(full=False, quick=False, epochs=args.epochs))
        for batch in args.batches:
            lr = task.lr_grid[-1] * (batch / task.lr_ref) ** 0.5
            measured = {name: [] for name in RUNS}
            for repeat in range(args.repeats):
                for name in RUNS:
                    measured[name].append(one_run(task, name, batch, lr, repeat))
            total = {name: statistics.median(m[0] for m in measured[name]) for name in RUNS}
            step = {name: statistics.median(m[1] for m in measured[name]) for name in RUNS}
            print(f"{task_name:14s} {batch:5d} {total['fixed']:7.3f} {total['split']:7.3f} {total['adaptive']:8.3f} "
                  f"{total['split'] / total['fixed']:11.2f} {total['adaptive'] / total['split']:14.2f} "
                  f"{total['adaptive'] / total['fixed']:14.2f}   "
                  + ", ".join(f"{step[name]:.3f}" for name in RUNS), flush=True)


if __name__ == "__main__":
    main()
