"""Batch-size schedules against the best fixed batch: updates and time to a target, side by side.

For each task and seed:

* **fixed**: a grid of global batches (the task's), each with LRs ``g * sqrt(B / B_ref)`` for
  ``g`` in the task's grid; a batch's tuned LR is the one that reaches the target in the fewest
  updates. The best fixed batch is the one fastest to the target.
* **warmup**: nanochat's staged ramp to the best fixed batch at its tuned LR (a quarter of it over
  the first 3 % of the samples, half over the next 7 %, sqrt LR per stage): a batch-size warmup
  that knows the grid's answer.
* **cosine / seesaw**: cosine decay over the whole budget at the base batch (its tuned LR), and
  Seesaw from the same batch and LR (the batch doubles where the cosine halves, up to
  ``--seesaw-max``; LR x 1/sqrt(2) there): equal samples.
* **adaptive**: aikit's ``AdaptiveSampler``/``AdaptiveOptimizer`` from their defaults at the base
  batch and its tuned LR (``max_batch``, ``max_device_batch``: the task's; the LR rule AdaScale for
  SGD, sqrt for AdamW), and any ``--variants``.
* **hold**: the controller as a batch-size warmup: an adaptive run deciding early (5 noise
  estimates, every 5 updates) that holds its batch after the first tenth of the budget
  (``hold_after``: nothing more decided or measured), at the linear rule's LR (sqrt for AdamW).

Tasks: ``mnist1d`` (the small CNN of ``adaptive_mnist1d.py``, SGD with momentum), ``mlp`` (MNIST-1D
with the MNIST-1D paper's MLP and Adam: nothing was tuned on it) and ``lm`` (the small GPT of
``examples/gpt_stdlib.py`` over the standard library's bytes, 64 tokens a sample, AdamW). By
default a small grid and budget (under a minute of CPU for ``mnist1d``'s 3 seeds);
``--full`` runs the measurement docs/adaptive.md reports.

The target of a seed is the best fixed run's final metric less the task's ``below``. Time is the
training thread's CPU time (``time.thread_time``), evaluations excluded: on a shared machine it is
what the wall time of an unshared core would be (the wall time is kept too). The adaptive
controller is given the same clock. At levels of the metric on the way to the target, the
*measured* best batch (the fixed batch of the grid that first reached the level in the least time)
is set beside the batch the controller's goodput *predicts* best where the adaptive run reached it;
``--plot`` draws both.

    python benchmarks/batch_schedules.py                     # small: ratios and medians in a minute
    nice -n 10 python benchmarks/batch_schedules.py --task mnist1d --full --plot schedules.png
    nice -n 10 python benchmarks/batch_schedules.py --task lm --full --json lm.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aikit.core.errors import InvalidValue
from aikit.core.frontier import UpdateCost, fit_frontier, fit_update_cost
from aikit.core.ramp import seesaw_schedule, staged_schedule
from aikit.core.scaling import cosine_decay
from aikit.core.trace import TraceExhaustedError, schedule_trace
from aikit.elastic.Torch import (
    AdaptiveOptimizer,
    AdaptiveSampler,
    ConstantOptimizer,
    CustomSampler,
    RootRuleOptimizer,
    SeesawOptimizer,
)

sys.path.insert(0, str(Path(__file__).parent))


class Clock:
    """CPU seconds of this thread (and wall seconds), with evaluations taken out."""

    def __init__(self) -> None:
        self.cpu0, self.wall0, self.paused_cpu, self.paused_wall = time.thread_time(), time.perf_counter(), 0.0, 0.0

    def __call__(self) -> float:
        return time.thread_time() - self.cpu0 - self.paused_cpu

    def wall(self) -> float:
        return time.perf_counter() - self.wall0 - self.paused_wall

    def paused(self, work: Callable[[], float]) -> float:
        cpu, wall = time.thread_time(), time.perf_counter()
        try:
            return work()
        finally:
            self.paused_cpu += time.thread_time() - cpu
            self.paused_wall += time.perf_counter() - wall


@dataclass
class Task:
    """What a benchmark trains: data, model, loss, metric (higher is better) and its grid."""

    name: str
    train: TensorDataset
    validation: tuple[torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor]
    model: Callable[[], nn.Module]
    loss: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
    metric: Callable[[nn.Module, torch.Tensor, torch.Tensor], float]  # higher is better
    optimizer: Callable[[nn.Module, float], torch.optim.Optimizer]
    batches: list[int]
    lr_grid: list[float]  # LRs at batch lr_ref, sqrt-scaled to each batch
    lr_ref: int
    epochs: int
    eval_every: int  # samples
    max_device: int
    max_batch: int
    below: float  # the target: the best fixed final metric less this
    metric_name: str = "validation accuracy"
    rule: str = "adascale"  # the adaptive run's LR rule (AdaScale's gain is SGD's; Adam takes sqrt)
    extra: dict = field(default_factory=dict)

    @property
    def budget(self) -> int:
        return self.epochs * len(self.train)


def accuracy(model: nn.Module, xs: torch.Tensor, ys: torch.Tensor) -> float:
    with torch.no_grad():
        return (model(xs).argmax(1) == ys).float().mean().item()


def mnist1d_task(args) -> Task:
    from autolrs_mnist1d import ConvBase, mnist1d

    x, y, xv, yv, xt, yt = mnist1d()

    return Task("MNIST-1D CNN", TensorDataset(x, y), (xv, yv), (xt, yt), ConvBase,
                lambda model, xb, yb: nn.functional.cross_entropy(model(xb), yb), accuracy,
                lambda model, lr: torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                batches=[32, 64, 128, 256, 512] if args.full else [32, 64, 128],
                lr_grid=[0.063, 0.089, 0.126] if args.full else [0.126], lr_ref=100,
                epochs=args.epochs or (30 if args.full else 2 if args.quick else 10), eval_every=700, max_device=1024,
                max_batch=1024, below=0.02)


def mlp_task(args) -> Task:
    """MNIST-1D with the MNIST-1D paper's MLP (40 -> 100 -> 100 -> 10, ReLU) and Adam: a model and
    optimizer none of aikit's defaults were tuned on, the grid from batch 16."""
    from autolrs_mnist1d import mnist1d

    x, y, xv, yv, xt, yt = mnist1d()

    def mlp() -> nn.Module:
        return nn.Sequential(nn.Linear(40, 100), nn.ReLU(), nn.Linear(100, 100), nn.ReLU(), nn.Linear(100, 10))

    return Task("MNIST-1D MLP", TensorDataset(x, y), (xv, yv), (xt, yt), mlp,
                lambda model, xb, yb: nn.functional.cross_entropy(model(xb), yb), accuracy,
                lambda model, lr: torch.optim.Adam(model.parameters(), lr=lr),
                batches=[16, 32, 64, 128, 256, 512] if args.full else [16, 64, 256],
                lr_grid=[1e-3, 3e-3, 1e-2] if args.full else [3e-3], lr_ref=100,
                epochs=args.epochs or (30 if args.full else 2 if args.quick else 10), eval_every=700, max_device=1024,
                max_batch=1024, below=0.02, rule="sqrt")


def lm_task(args) -> Task:
    """The small GPT of ``examples/gpt_stdlib.py`` (pre-norm blocks, causal attention) over bytes
    of the standard library's sources, packed into windows of ``context + 1`` bytes so that every
    sample is ``context`` tokens (the unit of a Megatron schedule in tokens); AdamW, and the metric
    the validation loss negated (nats per byte, higher is better)."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "examples"))
    from gpt_stdlib import TinyGPT

    from aikit.datasets import stdlib_text

    context, sequences = 64, 2048
    train_text, val_text = stdlib_text(max_len=256, max_bytes=int(sequences * (context + 1) / 0.7),
                                       val_fraction=0.25)

    def packed(pieces: list[np.ndarray], count: int) -> torch.Tensor:
        flat = np.concatenate(pieces)
        count = min(count, len(flat) // (context + 1))
        return torch.from_numpy(flat[:count * (context + 1)].reshape(count, context + 1))

    train_windows, val_windows = packed(train_text, sequences), packed(val_text, 512)
    split = len(val_windows) // 2

    def loss(model, xb, yb):
        return nn.functional.cross_entropy(model(xb).flatten(0, 1), yb.flatten())

    def negative_loss(model, xs, ys):
        with torch.no_grad():
            return -float(loss(model, xs, ys))

    validation, test = val_windows[:split], val_windows[split:]
    return Task("byte-level GPT on stdlib sources", TensorDataset(train_windows[:, :-1], train_windows[:, 1:]),
                (validation[:, :-1], validation[:, 1:]), (test[:, :-1], test[:, 1:]),
                lambda: TinyGPT(context=context, width=64, layers=2, heads=4), loss, negative_loss,
                lambda model, lr: torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0),
                batches=[8, 16, 32, 64] if args.full else [8, 32, 128],
                lr_grid=[4e-3, 8e-3] if args.full else [8e-3], lr_ref=32,
                epochs=args.epochs or (3 if args.full else 1 if args.quick else 2), eval_every=512, max_device=256,
                max_batch=512, below=0.05, metric_name="negative validation loss (nats per byte)", rule="sqrt")


TASKS = {"mnist1d": mnist1d_task, "mlp": mlp_task, "lm": lm_task}


def validation_loss(task: Task, model: nn.Module) -> float:
    xv, yv = task.validation
    with torch.no_grad():
        return float(task.loss(model, xv, yv))


def evaluate(task: Task, model: nn.Module, split: tuple[torch.Tensor, torch.Tensor]) -> float:
    model.eval()
    try:
        return task.metric(model, *split)
    finally:
        model.train()


def train(task: Task, model, sampler, optimizer, clock: Clock, budget: int,
          metric: Callable[[], float] | None = None) -> dict:
    """Train until ``budget`` samples (or the trace's end); the curve ``(samples, updates, cpu,
    wall, metric)`` every ``eval_every`` samples, and the final test metric."""
    metric = metric or (lambda: evaluate(task, model, task.validation))
    loader_data = task.train
    curve, samples, updates, epoch, sizes, last = [], 0, 0, 0, [], 0
    next_eval = task.eval_every
    while samples < budget:
        try:
            sampler.set_epoch(epoch)
            optimizer.set_epoch(epoch)
        except TraceExhaustedError:
            break
        for xb, yb in DataLoader(loader_data, batch_sampler=sampler):
            task.loss(model, xb, yb).backward()
            samples += len(xb)
            if optimizer.step():
                updates += 1
                sizes.append(samples - last)  # each update's samples: its time at any UpdateCost
                last = samples
                if samples >= next_eval:
                    curve.append((samples, updates, clock(), clock.wall(), clock.paused(metric)))
                    next_eval += task.eval_every
                if samples >= budget:
                    break
        epoch += 1
    if not curve or curve[-1][0] != samples:
        curve.append((samples, updates, clock(), clock.wall(), clock.paused(metric)))
    return {"curve": curve, "test": evaluate(task, model, task.test), "samples": samples, "updates": updates,
            "sizes": sizes}


def tuned(lr_grid_value: float, batch: int, task: Task) -> float:
    return lr_grid_value * math.sqrt(batch / task.lr_ref)


def fixed_run(task: Task, batch: int, lr: float, seed: int) -> dict:
    torch.manual_seed(seed)
    model = task.model()
    sampler = CustomSampler(len(task.train), batch, max_device_batch=task.max_device, seed=seed)
    optimizer = ConstantOptimizer(task.optimizer(model, lr), sampler)
    return train(task, model, sampler, optimizer, Clock(), task.budget)


def trace_run(task: Task, trace, optimizer_class, lr: float, seed: int, **options) -> dict:
    torch.manual_seed(seed)
    model = task.model()
    sampler = CustomSampler(len(task.train), trace, max_device_batch=task.max_device, seed=seed)
    optimizer = optimizer_class(task.optimizer(model, lr), sampler, **options)
    return train(task, model, sampler, optimizer, Clock(), task.budget)


def adaptive_run(task: Task, base: int, lr: float, seed: int, rule: str | None = None,
                 **options) -> tuple[dict, AdaptiveSampler, AdaptiveOptimizer]:
    """An adaptive run; beside each evaluation, the controller's batch, noise scale and goodput
    of every batch of the grid (its prediction)."""
    torch.manual_seed(seed)
    model, clock = task.model(), Clock()
    sampler = AdaptiveSampler(len(task.train), base_batch=base, max_batch=options.pop("max_batch", task.max_batch),
                              max_device_batch=task.max_device, seed=seed, **options)
    optimizer = AdaptiveOptimizer(task.optimizer(model, lr), sampler, rule or task.rule, clock=clock)
    records, grid = [], np.array([b for b in task.batches if sampler.controller.split.runs(np.array([b]))[0]])

    def record() -> float:
        controller = sampler.controller
        ready = controller.throughput.configurations and controller.noise.updates
        records.append({"batch": controller.batch,
                        "noise_scale": controller.noise.smoothed.noise_scale if controller.noise.updates else math.nan,
                        "predicted": dict(zip(grid.tolist(), controller.goodputs(grid).tolist(), strict=True))
                        if ready else None})
        return evaluate(task, model, task.validation)

    run = train(task, model, sampler, optimizer, clock, task.budget, metric=record)
    run["controller"] = records
    return run, sampler, optimizer


def to_target(run: dict, target: float) -> tuple[float, float, float]:
    """``(updates, cpu seconds, wall seconds)`` at the first evaluation at or above ``target``."""
    for _, updates, cpu, wall, metric in run["curve"]:
        if metric >= target:
            return updates, cpu, wall
    return math.inf, math.inf, math.inf


def samples_to_target(run: dict, target: float) -> float:
    """Samples trained at the first evaluation at or above ``target`` (inf: never)."""
    return next((point[0] for point in run["curve"] if point[4] >= target), math.inf)


def model_seconds(run: dict, target: float, cost: UpdateCost) -> float:
    """The time the run's updates to ``target`` take at ``cost``: the same updates, another machine."""
    updates = to_target(run, target)[0]
    return cost.seconds(run["sizes"][:int(updates)]) if math.isfinite(updates) else math.inf


def costs(task: Task, runs: dict) -> dict[str, UpdateCost]:
    """This machine's cost of an update, fitted from the fixed runs' CPU time per update, and an
    accelerator-like one: an update costs the same up to the grid's largest batch (its saturation),
    then as much again per saturation's worth of samples."""
    fixed = {int(name.split()[1]): run for name, run in runs.items() if name.startswith("fixed ")}
    cpu = fit_update_cost(list(fixed), [run["curve"][-1][2] / run["updates"] for run in fixed.values()])
    saturation = max(task.batches)
    return {"this CPU": cpu, "accelerator-like": UpdateCost(1.0, 1.0 / saturation, saturation=saturation)}


# --- where the controller's predicted best batch and the measured one part -------------------------
def measured_best(task: Task, runs: dict, levels: list[float]) -> dict[float, int]:
    """For each level of the metric: the fixed batch of the grid (at its tuned LR) that first
    reached it in the least CPU time."""
    found = {}
    for level in levels:
        times = {int(name.split()[1]): to_target(run, level)[1] for name, run in runs.items()
                 if name.startswith("fixed ")}
        if math.isfinite(min(times.values())):
            found[level] = min(times, key=times.get)
    return found


def predicted_best(task: Task, run: dict, levels: list[float]) -> dict[float, tuple[int, int, float]]:
    """For each level: ``(predicted best batch of the grid, the run's batch, its noise scale)``
    where the adaptive run first reached it."""
    found = {}
    for level in levels:
        for point, record in zip(run["curve"], run["controller"], strict=True):
            if point[4] >= level and record["predicted"] is not None:
                found[level] = (max(record["predicted"], key=record["predicted"].get), record["batch"],
                                record["noise_scale"])
                break
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="mnist1d")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, help="the budget in epochs (default: the task's)")
    parser.add_argument("--full", action="store_true",
                        help="the measurement of docs/adaptive.md: the task's whole grid and budget (minutes, not "
                             "seconds); without it a small grid and budget that run in about a minute")
    parser.add_argument("--seesaw-max", type=int, default=8, help="Seesaw grows the batch up to this many times")
    parser.add_argument("--plot", help="draw the adaptive run, its predicted and the measured best batch here")
    parser.add_argument("--json", help="write every curve here")
    parser.add_argument("--quick", action="store_true", help="a smoke test in seconds: seed 0, a tiny grid and budget")
    parser.add_argument("--runs", nargs="+",
                        default=["fixed", "warmup", "cosine", "seesaw", "adaptive", "hold"])
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                        help="an adaptive run with other AdaptiveSampler options, e.g. 'fast:min_estimates=5'")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", UserWarning)
    if args.quick:
        args.seeds, args.runs = [0], ["fixed", "adaptive"]
    task = TASKS[args.task](args)
    if args.quick:
        task.batches, task.lr_grid = task.batches[:2], task.lr_grid[-1:]
    results = {}
    for seed in args.seeds:
        results[seed] = one_seed(task, seed, args)
    report(task, results, args)


def parse_variant(text: str) -> tuple[str, dict]:
    name, _, options = text.partition(":")
    parsed = {}
    for item in filter(None, options.split(",")):
        key, _, value = item.partition("=")
        parsed[key] = float(value) if "." in value else int(value) if value.lstrip("-").isdigit() else value
    return name, parsed


def one_seed(task: Task, seed: int, args) -> dict:
    runs, tuned_lr = {}, {}
    fixed = {}
    for batch in task.batches:
        for g in task.lr_grid:
            fixed[batch, g] = fixed_run(task, batch, tuned(g, batch, task), seed)
            print(f"  seed {seed} fixed {batch} g={g}: final {fixed[batch, g]['curve'][-1][4]:.3f}", flush=True)
    best_final = max(run["curve"][-1][4] for run in fixed.values())
    target = best_final - task.below
    for batch in task.batches:
        g = min(task.lr_grid, key=lambda g: (to_target(fixed[batch, g], target)[0], -fixed[batch, g]["curve"][-1][4]))
        tuned_lr[batch] = tuned(g, batch, task)
        runs[f"fixed {batch}"] = fixed[batch, g]
    best_batch = min(task.batches, key=lambda b: to_target(runs[f"fixed {b}"], target)[1])
    base = min(task.batches)
    if "warmup" in args.runs:
        warmup = schedule_trace(staged_schedule(best_batch, task.budget), samples=task.budget)
        runs["warmup to best fixed"] = trace_run(task, warmup, RootRuleOptimizer, tuned_lr[best_batch], seed,
                                                    ref_batch_size=best_batch)
    decay = cosine_decay(task.budget)
    if "cosine" in args.runs:
        runs[f"cosine at {base}"] = trace_run(task, base, ConstantOptimizer, tuned_lr[base], seed, lr_decay=decay)
    if "seesaw" in args.runs:
        seesaw = schedule_trace(seesaw_schedule(base, decay, max_batch=base * args.seesaw_max), samples=task.budget)
        runs[f"seesaw from {base}"] = trace_run(task, seesaw, SeesawOptimizer, tuned_lr[base], seed,
                                                ref_batch_size=base, lr_decay=decay)
    if "adaptive" in args.runs:
        run, _, optimizer = adaptive_run(task, base, tuned_lr[base], seed)
        runs[f"adaptive from {base}"] = run
        runs[f"adaptive from {base}"]["history"] = optimizer.history
    if "hold" in args.runs:
        run, sampler, optimizer = adaptive_run(task, base, tuned_lr[base], seed, "sqrt" if task.rule == "sqrt" else
                                               "linear", hold_after=task.budget // 10, min_estimates=5, interval=5)
        runs[f"hold from {base}"] = {**run, "history": optimizer.history}
        print(f"  hold from {base}: batch {sampler.controller.batch} held from update {sampler.schedule.held_from}")
    for text in args.variant:
        name, options = parse_variant(text)
        run, _, optimizer = adaptive_run(task, base, tuned_lr[base], seed, **options)
        runs[name] = run
        runs[name]["history"] = optimizer.history
    print(f"\nseed {seed}: target {task.metric_name} {target:.3f} (best fixed final {best_final:.3f} less "
          f"{task.below}); best fixed batch {best_batch}")
    frontier, cost = judged(task, runs, target)
    print(f"{'run':28s} {'updates':>8s} {'samples':>8s} {'cpu s':>7s} {'wall s':>7s} {'final':>7s} {'test':>7s} "
          f"{'all cpu s':>9s} {'frontier':>8s}")
    for name, run in runs.items():
        updates, cpu, wall = to_target(run, target)
        excess = frontier.excess(updates, samples_to_target(run, target)) if frontier else math.nan
        print(f"{name:28s} {updates:8.0f} {samples_to_target(run, target):8.0f} {cpu:7.2f} {wall:7.2f} "
              f"{run['curve'][-1][4]:7.3f} {run['test']:7.3f} {run['curve'][-1][2]:9.2f} {excess:8.2f}", flush=True)
    levels = [round(target - d, 3) for d in (0.3, 0.2, 0.1, 0.05, 0.0)]
    measured = measured_best(task, runs, levels)
    predicted = {name: predicted_best(task, run, levels) for name, run in runs.items() if "controller" in run}
    for name, found in predicted.items():
        print(f"  {name}: at each level, predicted best / its batch / noise scale / measured best (fixed runs): " +
              "; ".join(f"{level:.3f}: {p[0]} / {p[1]} / {p[2]:.0f} / {measured.get(level)}"
                        for level, p in found.items()))
    return {"target": target, "runs": runs, "best": f"fixed {best_batch}", "tuned": tuned_lr, "levels": levels,
            "measured": measured, "predicted": predicted, "frontier": frontier, "costs": cost}


def judged(task: Task, runs: dict, target: float):
    """The fixed-batch frontier to ``target`` through the grid's runs (each batch at its tuned LR)
    and the costs of an update the times are modelled at; printed. (None, costs) where the grid
    does not pin a frontier (fewer than two batches reached the target, or off the model)."""
    cost = costs(task, runs)
    fixed = {int(name.split()[1]): to_target(run, target)[0] for name, run in runs.items() if name.startswith("fixed ")}
    try:
        frontier = fit_frontier(list(fixed), list(fixed.values()))
    except InvalidValue as why:
        print(f"  no frontier: {why}")
        return None, cost
    cpu = cost["this CPU"]
    print(f"  frontier through the grid: S_min {frontier.min_updates:.0f} updates, E_min {frontier.min_samples:.0f} "
          f"samples, critical batch {frontier.critical_batch:.0f}; this CPU: {cpu.per_update * 1e3:.2f} ms an update + "
          f"{cpu.per_sample * 1e6:.1f} us a sample (one update costs {cpu.per_update / cpu.per_sample:.0f} samples), "
          f"time-optimal fixed batch {frontier.best_batch(cpu):.0f}")
    return frontier, cost


def report(task: Task, results: dict, args) -> None:
    names = list(next(iter(results.values()))["runs"])
    print(f"\n{task.name}: medians over seeds {args.seeds} of (updates, CPU seconds) to the target, and the ratio "
          "run / best fixed batch of the grid (< 1: faster than the best fixed batch)")
    rows = []
    for name in names:
        per_seed = []
        for r in results.values():
            run = r["runs"].get(name)
            if run is None:
                continue
            best_run, target = r["runs"][r["best"]], r["target"]
            best, mine = to_target(best_run, target), to_target(run, target)
            modelled = [model_seconds(run, target, c) / model_seconds(best_run, target, c) for c in r["costs"].values()]
            excess = r["frontier"].excess(mine[0], samples_to_target(run, target)) if r["frontier"] else math.nan
            per_seed.append((mine[0], mine[1], mine[0] / best[0], mine[1] / best[1], run["test"],
                             samples_to_target(run, target) / samples_to_target(best_run, target), excess, *modelled))
        reached = sum(math.isfinite(p[0]) for p in per_seed)
        med = [statistics.median(p[i] for p in per_seed) for i in range(len(per_seed[0]))]
        rows.append((name, *med, reached, len(per_seed)))
        print(f"  {name:28s} updates {med[0]:7.0f}  cpu {med[1]:6.2f} s  ratio updates {med[2]:5.2f}  samples "
              f"{med[5]:5.2f}  cpu time {med[3]:5.2f}  modelled time: this CPU {med[7]:5.2f}, accelerator-like "
              f"{med[8]:5.2f}  frontier {med[6]:5.2f}  test {med[4]:.3f}  reached {reached}/{len(per_seed)}")
    print("  (frontier: (S/S_min - 1)(E/E_min - 1) through the grid's batches, 1 on it, below 1: better than every "
          "fixed batch in updates and samples at once; modelled time: the run's updates at the fitted cost of one)")
    if args.plot:
        plot(task, results, args)
    if args.json:
        Path(args.json).write_text(json.dumps({str(seed): {"target": r["target"], "best": r["best"],
                                                           "frontier": r["frontier"] and vars(r["frontier"]),
                                                           "costs": {k: vars(c) for k, c in r["costs"].items()},
                                                           "tuned": r["tuned"], "measured": r["measured"],
                                                           "predicted": r["predicted"],
                                                           "runs": r["runs"]} for seed, r in results.items()},
                                              default=float))


def plot(task: Task, results: dict, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = results[args.seeds[0]]
    run = first["runs"].get(f"adaptive from {min(task.batches)}")
    fig, (ax, ax_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    if run is not None:
        history = run["history"]
        samples = np.cumsum([row["batch_size"] for row in history])
        ax.step(samples, [row["batch_size"] for row in history], where="post", label="adaptive run's batch")
        noise = [row["noise_scale"] for row in history]
        ax.plot(samples, noise, color="tab:orange", alpha=0.6, label="its noise scale tr(Σ)/|G|²")
    predicted = first["predicted"].get(f"adaptive from {min(task.batches)}", {})
    if predicted and run is not None:
        at = {level: next(c[0] for c in run["curve"] if c[4] >= level) for level in predicted}
        xs = [at[level] for level in predicted]
        ax.plot(xs, [p[0] for p in predicted.values()], "s--", color="tab:red",
                label="predicted best batch (the controller's goodput over the grid)")
        measured = [first["measured"].get(level, math.nan) for level in predicted]
        ax.plot(xs, measured, "o-", color="tab:green",
                label="measured best batch (the fixed batch fastest to that accuracy)")
    ax.set(xscale="linear", yscale="log", xlabel="samples trained", ylabel="batch",
           title=f"{task.name}: the controller's batch against the measured best")
    ax.legend(fontsize="small")
    for name, r in first["runs"].items():
        if name.startswith("fixed") and name != first["best"]:
            continue
        curve = r["curve"]
        ax_time.plot([c[2] for c in curve], [c[4] for c in curve], label=name)
    ax_time.axhline(first["target"], color="grey", ls=":", label="target")
    ax_time.set(xlabel="CPU seconds (training)", ylabel=task.metric_name, title=f"seed {args.seeds[0]}",
                ylim=(first["target"] - 0.15, None))
    ax_time.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(args.plot, dpi=110)
    print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
