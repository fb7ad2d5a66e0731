"""AutoLRS against the grid search it replaces, on MNIST-1D, every step counted.

MNIST-1D (Greydanus & Kobak, ICML 2024), generated offline by the ``mnist1d`` package
(``make_dataset(get_dataset_args())``: 4,000 train / 1,000 test sequences of 40 values, 10
classes); the last 500 training sequences are held out for validation. The paper's small CNN
(three Conv1d of 25 channels with stride 2, then Linear), SGD with momentum 0.9, batch 100.
Validation accuracy is checked every ``--every`` steps.

Baselines, each over ``--seeds`` seeds (model init and data order):

* a 6-point grid of constant LRs, ``--budget`` steps each;
* cosine schedules ``peak * (1 + cos(pi t / T)) / 2`` with the best constant LR and its two grid
  neighbours as peaks and ``T`` in 1000, 2000, 4000 (a run of length ``T`` costs ``T`` steps).

Their total is the grid's cost. Targets: the best baseline's median final validation accuracy
minus 1 and minus 3 points. For each target the best constant LR and the best cosine are the
grid points with the fewest median steps to it (an oracle choice AutoLRS does not get).

AutoLRS runs over the same seeds with ``total_steps=--total-steps`` and its default search range
(a short LR range test in the run, counted), unless ``--min-lr``/``--max-lr`` are given. Every
step counts, search included; the target is checked only on the model AutoLRS keeps (never on
a trial that may be undone). Prints steps to each target per seed, medians, the ratios best
baseline / AutoLRS (> 1: AutoLRS needs fewer steps) and grid cost / AutoLRS, final test
accuracies and whether any run ended at NaN/inf.

The baselines are cached in ``--cache`` (JSON, keyed by the protocol), so AutoLRS variants can
be compared without recomputing them::

    nice -n 10 python benchmarks/autolrs_mnist1d.py [--seeds 3] [--budget 4000] [--option tau=100]
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import math
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from autolrs_digits import batches  # a sibling script: benchmarks run as python benchmarks/NAME.py
from torch import nn

from aikit.autolrs.Torch import AutoLRS

BATCH = 100
VALIDATION = 500
GRID = np.geomspace(1e-3, 1.0, 6).tolist()
COSINE_LENGTHS = (1000, 2000, 4000)
PEAKS = GRID[2:5]  # cosine peaks: the grid's best constant LR (0.063, measured) and its two neighbours


def mnist1d() -> tuple[torch.Tensor, ...]:
    """Train, validation and test tensors, generated locally (no download)."""
    from mnist1d.data import get_dataset_args, make_dataset

    state = np.random.get_state()  # make_dataset seeds NumPy's global generator
    data = make_dataset(get_dataset_args())
    np.random.set_state(state)
    x, y = torch.tensor(data["x"], dtype=torch.float32), torch.tensor(data["y"], dtype=torch.int64)
    xt, yt = torch.tensor(data["x_test"], dtype=torch.float32), torch.tensor(data["y_test"], dtype=torch.int64)
    return x[:-VALIDATION], y[:-VALIDATION], x[-VALIDATION:], y[-VALIDATION:], xt, yt


class ConvBase(nn.Module):
    """The MNIST-1D paper's CNN: 40 -> 19 -> 10 -> 5 positions, 25 channels, then Linear."""

    def __init__(self, channels: int = 25):
        super().__init__()
        self.conv1 = nn.Conv1d(1, channels, 5, stride=2, padding=1)
        self.conv2 = nn.Conv1d(channels, channels, 3, stride=2, padding=1)
        self.conv3 = nn.Conv1d(channels, channels, 3, stride=2, padding=1)
        self.linear = nn.Linear(channels * 5, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(x[:, None, :]).relu()
        h = self.conv2(h).relu()
        h = self.conv3(h).relu()
        return self.linear(h.flatten(1))


class Task:
    def __init__(self, every: int):
        self.x, self.y, self.xv, self.yv, self.xt, self.yt = mnist1d()
        self.every = every

    @staticmethod
    def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        with torch.no_grad():
            logits = model(x)
        return nn.functional.cross_entropy(logits, y).item(), (logits.argmax(1) == y).float().mean().item()

    def run(self, seed: int, steps: int, lr_at=None, autolrs_options: dict | None = None) -> dict:
        """Train ``steps`` steps (search included); the validation accuracy of the kept model
        every ``every`` steps, and the final test accuracy."""
        torch.manual_seed(seed)
        model = ConvBase()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        autolrs = None
        if autolrs_options is not None:
            autolrs = AutoLRS(model, optimizer, lambda: self.evaluate(model, self.xv, self.yv)[0],
                              total_steps=steps, seed=seed, **autolrs_options)
        stream = batches(len(self.y), seed, BATCH)
        curve: dict[int, float] = {}
        for step in range(1, steps + 1):
            if lr_at is not None:
                optimizer.param_groups[0]["lr"] = lr_at(step - 1)
            index = next(stream)
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(self.x[index]), self.y[index])
            loss.backward()
            optimizer.step()
            if autolrs is not None:
                autolrs.on_train_batch_end(loss)
                if not autolrs.kept:  # a trial that may be undone: not the model AutoLRS keeps
                    continue
            if step % self.every == 0:
                curve[step] = self.evaluate(model, self.xv, self.yv)[1]
        val_loss, val_acc = self.evaluate(model, self.xv, self.yv)
        result = {"curve": curve, "final_val_acc": val_acc, "final_val_loss": val_loss,
                  "test_acc": self.evaluate(model, self.xt, self.yt)[1],
                  "finite": all(torch.isfinite(p).all().item() for p in model.parameters())}
        if autolrs is not None:
            result["schedule"] = [(r.step, r.lr, r.phase) for r in autolrs.controller.history]
        return result


def steps_to(curve: dict, target: float) -> float:
    return next((step for step, acc in sorted(curve.items()) if acc >= target), math.inf)


def cosine(peak: float, length: int):
    return lambda t: peak * 0.5 * (1.0 + math.cos(math.pi * t / length))


def baselines(task: Task, seeds: list[int], budget: int, cache: Path, cached_only: bool = False) -> dict:
    """Every grid run's results per seed. Each seed's runs are cached in their own file (keyed by
    the protocol), run by run, so an interrupted benchmark picks up where it stopped and the
    seeds can be computed by separate processes (``--baseline-seed``)."""
    per_seed = [seed_baselines(task, seed, budget, cache, cached_only) for seed in seeds]
    return {name: [runs[name] for runs in per_seed] for name in per_seed[0] if all(name in r for r in per_seed)}


def planned_runs(budget: int) -> list[tuple]:
    """The grid: 6 constant LRs and cosines peaking at the best of them (0.063, as measured) and
    its two neighbours, ordered so that the most telling runs come first."""
    constant = [(f"constant {lr:.4g}", budget, lambda t, lr=lr: lr) for lr in GRID]
    cosines = [(f"cosine {p:.4g} T={n}", n, cosine(p, n)) for n in COSINE_LENGTHS for p in PEAKS]
    order = [constant[3], cosines[5], cosines[4], cosines[2], cosines[1], constant[4], constant[2], cosines[0],
             cosines[3], *cosines[6:], constant[1], constant[5], constant[0]]
    assert sorted(name for name, _, _ in order) == sorted(name for name, _, _ in constant + cosines)
    return order


def seed_baselines(task: Task, seed: int, budget: int, cache: Path, cached_only: bool = False) -> dict:
    path = cache.with_name(f"{cache.stem}_seed{seed}{cache.suffix}")
    key = json.dumps({"seed": seed, "budget": budget, "every": task.every, "grid": GRID,
                      "lengths": COSINE_LENGTHS, "batch": BATCH, "version": 3})
    stored = json.loads(path.read_text()) if path.exists() else {}
    runs: dict[str, dict] = stored["runs"] if stored.get("key") == key else {}

    def run(name: str, steps: int, lr_at) -> dict:
        if name not in runs:
            result = task.run(seed, steps, lr_at=lr_at)
            runs[name] = {**result, "curve": {str(k): v for k, v in result["curve"].items()}}
            path.write_text(json.dumps({"key": key, "runs": runs}))
            print(f"  seed {seed}, {name}: final val acc {runs[name]['final_val_acc']:.4f}", flush=True)
        return runs[name]

    for name, steps, lr_at in planned_runs(budget):  # most telling first, for --cached-only
        if not cached_only:
            run(name, steps, lr_at)
    return {name: {**r, "curve": {int(k): v for k, v in r["curve"].items()}} for name, r in runs.items()}


def median_steps(results: list[dict], target: float) -> float:
    return statistics.median(steps_to(r["curve"], target) for r in results)


def parse_options(pairs: list[str]) -> dict:
    options = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        options[name] = ast.literal_eval(value)
    return options


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budget", type=int, default=4000, help="steps per constant run of the grid")
    parser.add_argument("--total-steps", type=int, default=1000, help="AutoLRS's total_steps (search included)")
    parser.add_argument("--every", type=int, default=50, help="check validation accuracy every this many steps")
    parser.add_argument("--min-lr", type=float, default=None, help="AutoLRS's range (default: its range test)")
    parser.add_argument("--max-lr", type=float, default=None)
    parser.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                        help="an AutoLRS option, e.g. tau=100 (repeatable)")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/aikit_autolrs_mnist1d.json"))
    parser.add_argument("--baselines-only", action="store_true")
    parser.add_argument("--cached-only", action="store_true", help="use the baseline runs cached so far")
    parser.add_argument("--baseline-seed", type=int, default=None,
                        help="compute (and cache) one seed's grid, then stop")
    parser.add_argument("--verbose", action="store_true", help="log AutoLRS's trials")
    parser.add_argument("--save", type=Path, default=None, help="write AutoLRS's runs (curves, schedules) as JSON")
    parser.add_argument("--autolrs-only", action="store_true", help="run AutoLRS only and --save its runs")
    parser.add_argument("--load", type=Path, default=None, help="AutoLRS's runs from a --save, instead of running")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    seeds = list(range(args.seeds))
    task = Task(args.every)
    began = time.perf_counter()
    if args.baseline_seed is not None:
        seed_baselines(task, args.baseline_seed, args.budget, args.cache)
        return
    options = parse_options(args.option)
    if args.min_lr is not None:
        options.update(min_lr=args.min_lr, max_lr=args.max_lr)
    if args.autolrs_only:  # AutoLRS's runs alone, saved for a later --load
        results = [task.run(s, args.total_steps, autolrs_options=options) for s in seeds]
        args.save.write_text(json.dumps(results))
        return
    runs = baselines(task, seeds, args.budget, args.cache, args.cached_only)
    best_final = max(statistics.median(r["final_val_acc"] for r in results) for results in runs.values())
    targets = {"best-1": best_final - 0.01, "best-3": best_final - 0.03}
    grid_cost = len(seeds) * sum(steps for _, steps, _ in planned_runs(args.budget))
    if len(runs) < len(planned_runs(args.budget)):
        print(f"(--cached-only: {len(runs)} of the grid's {len(planned_runs(args.budget))} runs are cached for "
              "every seed; the grid's cost counts all of them)")
    print(f"best baseline final val acc (median over {len(seeds)} seeds): {best_final:.4f}; "
          f"targets {', '.join(f'{k} = {v:.4f}' for k, v in targets.items())}; grid cost {grid_cost} steps")
    best = {}
    for kind in ("constant", "cosine"):
        for label, target in targets.items():
            name = min((n for n in runs if n.startswith(kind)), key=lambda n: median_steps(runs[n], target))
            best[kind, label] = (name, median_steps(runs[name], target))
            per_seed = [steps_to(r["curve"], target) for r in runs[name]]
            print(f"  best {kind} to {label}: {name}: median {best[kind, label][1]} steps {per_seed}")
    if args.baselines_only:
        return

    if args.load:
        saved = json.loads(args.load.read_text())
        results = [{**r, "curve": {int(k): v for k, v in r["curve"].items()}} for r in saved]
    else:
        results = [task.run(s, args.total_steps, autolrs_options=options) for s in seeds]
    print(f"\nAutoLRS {options or '(defaults)'}, total_steps={args.total_steps}:")
    medians = {}
    for label, target in targets.items():
        per_seed = [steps_to(r["curve"], target) for r in results]
        medians[label] = statistics.median(per_seed)
        print(f"  to {label}: {per_seed}, median {medians[label]}")
    print(f"  final val acc {[round(r['final_val_acc'], 4) for r in results]}, "
          f"test acc {[round(r['test_acc'], 4) for r in results]}, all finite: {all(r['finite'] for r in results)}")
    for label in targets:
        for kind in ("constant", "cosine"):
            ratio = best[kind, label][1] / medians[label]
            print(f"  best {kind} / AutoLRS to {label}: {ratio:.2f}")
        print(f"  grid / AutoLRS to {label}: {grid_cost / medians[label]:.1f}")
    print(f"({time.perf_counter() - began:.0f} s)")
    if args.save:
        args.save.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
