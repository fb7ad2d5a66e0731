"""Adaptive global batch (aikit's goodput controller) against the best fixed batch, on MNIST-1D.

MNIST-1D (``mnist1d``, generated offline: 3,500 train / 500 validation / 1,000 test sequences),
the paper's small CNN (``benchmarks/autolrs_mnist1d.py``), SGD with momentum 0.9, one CPU thread
as the "device", which holds at most ``--max-device`` samples per micro-batch (a batch up to that
runs in one pass, as a user would run it; larger ones accumulate). Every run trains ``--epochs``
epochs' worth of samples; the validation accuracy is measured every ``--eval-every`` samples with
the clock paused, so wall times count training only. Each of ``--seeds`` repeats it all.

* **Fixed grid**: global batches ``--batches``, each with LRs ``g * sqrt(B / 100)`` for ``g`` in
  ``--lrs`` (its tuned LR is the grid point that reaches the target in the fewest updates), through
  ``CustomSampler(max_device_batch=...)`` + ``ConstantOptimizer`` (the engine of the adaptive run).
* **Adaptive**: ``AdaptiveSampler(ref_batch_size=--base, max_batch=--max-batch,
  max_device_batch=--max-device)`` and ``AdaptiveOptimizer``, one run per LR rule of ``--rules``
  (default AdaScale's gain), from the tuned LR of the base batch (default: the grid's smallest): a
  user who starts small and lets aikit grow it. ``--also-from`` adds runs from other batches of
  the grid, each from its own tuned LR (the first rule): how much the start matters.
* **AdaptDL 0.2.11** side by side where it imports (``--adaptdl-path``: folders holding adaptdl
  and its dependencies, outside the shared environment, joined with ``os.pathsep``),
  ``AdaptiveDataLoader.autoscale_batch_size`` with accumulation and ``local_bsz_bounds`` up to
  ``--max-device``, from the same LR, in a subprocess.

Target: the best fixed run's final validation accuracy minus ``--below`` points. Prints, per seed,
updates and wall seconds to the target and final test accuracy for each run; then the medians
over seeds of best-fixed / adaptive (> 1: adaptive is better), the adaptive machinery's overhead
at the base batch, and the predicted time to target on 8 devices from the throughput model the
first seed's adaptive run fitted (assumptions printed: see ``eight_devices``). ``--plot`` draws
that run's batch, noise scale and LR. The run docs/adaptive.md reports, about 10 minutes::

    nice -n 10 python benchmarks/adaptive_mnist1d.py --epochs 30 --rules adascale sqrt linear \
        --also-from 64 128 --timing-repeats 5 --plot docs/adaptive_mnist1d.png
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch
from autolrs_mnist1d import ConvBase, mnist1d  # a sibling script: benchmarks run as python benchmarks/NAME.py
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aikit.core.goodput import ThroughputModel
from aikit.core.gradient_noise import gain
from aikit.core.plan import make_plan
from aikit.elastic.Torch import AdaptiveOptimizer, AdaptiveSampler, ConstantOptimizer, CustomSampler


class Clock:
    """Training seconds: ``perf_counter`` with the evaluations taken out."""

    def __init__(self) -> None:
        self.paused, self.start = 0.0, time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.start - self.paused

    def pause(self):
        clock = self

        class Paused:
            def __enter__(self):
                self.t = time.perf_counter()

            def __exit__(self, *_):
                clock.paused += time.perf_counter() - self.t

        return Paused()


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    return accuracy


def train(data, model, sampler, optimizer, epochs: int, eval_every: int, clock: Clock) -> dict:
    """Train ``epochs`` epochs' worth of samples; the curve ``(samples, updates, seconds, accuracy)``."""
    x, y, xv, yv, xt, yt = data
    dataset = TensorDataset(x, y)
    curve, samples, updates, next_eval = [], 0, 0, eval_every
    budget = epochs * len(x)
    epoch = 0
    while samples < budget:
        sampler.set_epoch(epoch)
        optimizer.set_epoch(epoch)
        for xb, yb in DataLoader(dataset, batch_sampler=sampler):
            nn.functional.cross_entropy(model(xb), yb).backward()
            optimizer.step()
            samples += len(xb)
            if optimizer.updated or optimizer.micro == 0:
                updates = optimizer.updates
                if samples >= next_eval:
                    with clock.pause():
                        curve.append((samples, updates, clock(), evaluate(model, xv, yv)))
                    next_eval += eval_every
                if samples >= budget:
                    break
        epoch += 1
    if not curve or curve[-1][0] != samples:
        with clock.pause():
            curve.append((samples, optimizer.updates, clock(), evaluate(model, xv, yv)))
    return {"curve": curve, "test": evaluate(model, xt, yt)}


def fixed_run(data, batch: int, lr: float, args, seed: int) -> dict:
    torch.manual_seed(seed)
    model = ConvBase()
    sampler = CustomSampler(len(data[0]), batch, max_device_batch=args.max_device, seed=seed)
    optimizer = ConstantOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9), sampler)
    return train(data, model, sampler, optimizer, args.epochs, args.eval_every, Clock())


def adaptive_run(data, lr: float, args, seed: int, rule: str = "adascale", base: int | None = None
                 ) -> tuple[dict, AdaptiveSampler, AdaptiveOptimizer]:
    torch.manual_seed(seed)
    model, clock = ConvBase(), Clock()
    sampler = AdaptiveSampler(len(data[0]), ref_batch_size=base or args.base, max_batch=args.max_batch,
                              max_device_batch=args.max_device, seed=seed, noise_every=getattr(args, "noise_every", 4),
                              min_estimates=getattr(args, "min_estimates", None))
    optimizer = AdaptiveOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9), sampler, rule,
                                  clock=clock)
    return train(data, model, sampler, optimizer, args.epochs, args.eval_every, clock), sampler, optimizer


ADAPTDL_WORKER = r"""
import json, os, sys, tempfile, time, torch
sys.path.insert(0, {bench!r})
os.environ["ADAPTDL_CHECKPOINT_PATH"] = tempfile.mkdtemp()
import adaptdl.torch as adl
from torch import nn
from torch.utils.data import TensorDataset
from autolrs_mnist1d import ConvBase, mnist1d
from adaptive_mnist1d import evaluate
torch.set_num_threads(1)
x, y, xv, yv, xt, yt = mnist1d()
adl.init_process_group("gloo")
torch.manual_seed({seed})
model = ConvBase()
optimizer = torch.optim.SGD(model.parameters(), lr={lr}, momentum=0.9)
ddp = adl.AdaptiveDataParallel(model, optimizer)
loader = adl.AdaptiveDataLoader(TensorDataset(x, y), batch_size={base}, shuffle=True)
loader.autoscale_batch_size({max_batch}, local_bsz_bounds=({low}, {max_device}), gradient_accumulation=True)
curve, samples, updates, paused, start, next_eval, budget = [], 0, 0, 0.0, time.perf_counter(), {every}, {budget}
for epoch in adl.remaining_epochs_until(10**6):
    for xb, yb in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(ddp(xb), yb).backward()
        optimizer.step()
        samples += len(xb)
        updates += loader._elastic.is_optim_step()
        if samples >= next_eval:
            t = time.perf_counter()
            curve.append((samples, updates, t - start - paused, evaluate(model, xv, yv)))
            paused += time.perf_counter() - t
            next_eval += {every}
        if samples >= budget:
            break
    if samples >= budget:
        break
print("RESULT " + json.dumps({{"curve": curve, "test": evaluate(model, xt, yt)}}))
"""


def adaptdl_run(lr: float, args, seed: int) -> tuple[dict | None, str]:
    """AdaptDL 0.2.11 in a subprocess with ``--adaptdl-path`` first on its path; (result, why not)."""
    if not args.adaptdl_path:
        return None, "no --adaptdl-path given"
    code = ADAPTDL_WORKER.format(bench=str(Path(__file__).parent), seed=seed, lr=lr, base=args.base,
                                 max_batch=args.max_batch, low=max(1, args.base // 4), max_device=args.max_device,
                                 every=args.eval_every,
                                 budget=args.epochs * 3500)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([args.adaptdl_path, *sys.path]), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=3600)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:]), ""
    return None, (done.stderr.strip().splitlines() or ["no output"])[-1]


def to_target(run: dict, target: float) -> tuple[float, float]:
    """(updates, seconds) at the first evaluation at or above ``target`` (inf if never)."""
    for _, updates, seconds, accuracy in run["curve"]:
        if accuracy >= target:
            return updates, seconds
    return math.inf, math.inf


def eight_devices(fit: ThroughputModel, noise_scales: list[float], base_updates: float, fixed: dict[int, float],
                  args, parameters: int) -> tuple[float, float, int, list[int]]:
    """Predicted seconds to the target on 8 devices: ``(best fixed, adaptive, best fixed batch, batches)``.

    An update of ``B`` takes its 8-device plan's GA steps x (per micro-step + per sample x
    micro-batch) at this device's fitted speed, plus a ring all-reduce of the float32 gradients
    (``2 (N-1)/N`` of them over ``bandwidth``, ``2 (N-1)`` latencies). A fixed batch needs the
    updates it needed here. The adaptive run is Pollux's controller on that 8-device throughput
    model: every update it takes the batch of best goodput (changing only for more than 5 %), and
    is worth AdaScale's gain in base-batch updates; it reaches the target when those add up to
    the base batch's updates to target, the noise scale following the measured one by progress.
    """
    devices = 8
    per_micro, per_sample, per_update = fit.coefficients()
    all_reduce = 2 * (devices - 1) / devices * parameters * 4 / args.bandwidth + 2 * (devices - 1) * args.latency

    def seconds(batch: int) -> float:
        plan = make_plan(batch, args.max_device, devices)
        return plan.steps * (per_micro + per_sample * plan.batch_size) + per_update + all_reduce

    fixed_seconds = {b: updates * seconds(b) for b, updates in fixed.items() if math.isfinite(updates)}
    best_batch = min(fixed_seconds, key=fixed_seconds.get)
    base = args.base
    candidates = range(base, args.max_batch + 1, devices)
    progress, total, batch, chosen = 0.0, 0.0, base, []
    while progress < base_updates:
        phi = noise_scales[min(int(progress), len(noise_scales) - 1)]
        phi = phi if math.isfinite(phi) else 0.0

        def goodput(b: int, phi: float = phi) -> float:
            return b / seconds(b) * gain(phi, 1.0, b, base) * base / b

        best = max(candidates, key=goodput)
        if goodput(best) > 1.05 * goodput(batch):
            batch = best
        chosen.append(batch)
        total += seconds(batch)
        progress += gain(phi, 1.0, batch, base)
    return fixed_seconds[best_batch], total, best_batch, chosen


def one_seed(data, args, seed: int) -> dict:
    """The grid, its target, the adaptive run from the base batch's tuned LR and AdaptDL, for one seed."""
    fixed = {}
    for batch in args.batches:
        for g in args.lrs:
            lr = g * math.sqrt(batch / 100)  # the grid is of LRs at batch 100, sqrt-scaled
            fixed[batch, lr] = fixed_run(data, batch, lr, args, seed)
    best_final = max(run["curve"][-1][3] for run in fixed.values())
    target = best_final - args.below / 100
    # a batch's tuned LR: the fewest updates to the target (exact, where its seconds are noisy and each update of
    # one batch costs the same at any LR), else the best final accuracy
    tuned = {b: min((to_target(run, target)[0], -run["curve"][-1][3], lr) for (bb, lr), run in fixed.items()
                    if bb == b)[2] for b in args.batches}
    base_lr = tuned[args.base]
    starts = [(args.base, rule) for rule in args.rules] + [(base, args.rules[0]) for base in args.also_from]
    adaptive = {f"{rule} from {base}": adaptive_run(data, tuned[base], args, seed, rule, base) for base, rule in starts}
    _, sampler, optimizer = adaptive[f"{args.rules[0]} from {args.base}"]
    adl, why = adaptdl_run(base_lr, args, seed)

    print(f"\nseed {seed}: target validation accuracy {target:.3f} (best fixed final {best_final:.3f} - "
          f"{args.below} points)")
    print(f"{'run':36s} {'updates':>8s} {'seconds':>8s} {'final test':>10s}")
    rows = {f"fixed {b} (lr {tuned[b]:.3f})": fixed[b, tuned[b]] for b in args.batches}
    rows.update({f"aikit adaptive, {label}": run for label, (run, _, _) in adaptive.items()})
    if adl is not None:
        rows["AdaptDL 0.2.11"] = adl
    for name, run in rows.items():
        updates, seconds = to_target(run, target)
        print(f"{name:36s} {updates:8.0f} {seconds:8.1f} {run['test']:10.3f}")
    if adl is None:
        print(f"AdaptDL 0.2.11 not run: {why}")
    batches = sampler.controller.batches
    print(f"adaptive batches: {batches[0]} .. {max(batches)}, {len(sampler.controller.changes)} changes, "
          f"{len(batches)} updates in all", flush=True)
    best = min((r for n, r in rows.items() if n.startswith("fixed")), key=lambda r: to_target(r, target)[1])
    return {"target": target, "rows": rows, "best": best, "adaptdl": adl, "tuned": tuned,
            **{f"aikit adaptive, {label}": run for label, (run, _, _) in adaptive.items()},
            "fixed": fixed, "sampler": sampler, "optimizer": optimizer, "base_lr": base_lr}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--base", type=int, help="the batch the adaptive run starts at, with its tuned LR "
                                                 "(default: the smallest of --batches)")
    parser.add_argument("--max-device", type=int, default=1024, help="most samples one device holds per micro-batch")
    parser.add_argument("--max-batch", type=int, default=1024)
    parser.add_argument("--rules", nargs="+", default=["adascale"], choices=["adascale", "sqrt", "linear"],
                        help="the adaptive runs' LR rules, one run each (the first is timed, plotted and predicted)")
    parser.add_argument("--also-from", type=int, nargs="*", default=[],
                        help="more batches of --batches for adaptive runs to start from, each with its tuned LR")
    parser.add_argument("--lrs", type=float, nargs="+", default=[0.063, 0.089, 0.126], help="LR at batch 100")
    parser.add_argument("--eval-every", type=int, default=700, help="samples between validations")
    parser.add_argument("--below", type=float, default=2.0, help="target: best fixed final accuracy less these points")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--adaptdl-path", default=os.environ.get("AIKIT_ADAPTDL_PATH"))
    parser.add_argument("--bandwidth", type=float, default=1.25e9, help="bytes/s between devices (10 Gbit/s)")
    parser.add_argument("--latency", type=float, default=50e-6, help="seconds per all-reduce hop")
    parser.add_argument("--timing-repeats", type=int, default=3, help="alternated runs timing the overhead")
    parser.add_argument("--timing-epochs", type=int, default=2)
    parser.add_argument("--plot", help="save the first seed's adaptive batch / noise scale / LR plot here")
    parser.add_argument("--json", help="write every curve here")
    args = parser.parse_args()
    args.base = min(args.batches) if args.base is None else args.base
    for base in (args.base, *args.also_from):
        if base not in args.batches:
            parser.error(f"--base/--also-from {base} must be one of --batches: an adaptive run starts from its "
                         "tuned LR")
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", UserWarning)
    data = mnist1d()
    seeds = {seed: one_seed(data, args, seed) for seed in args.seeds}

    # medians over the seeds: best fixed / adaptive (> 1: adaptive better); a run that never reached the target
    # counts as infinitely slow
    print(f"\nover seeds {args.seeds}, best fixed of the grid / aikit adaptive (> 1: adaptive better), medians:")
    labels = [f"aikit adaptive, {rule} from {args.base}" for rule in args.rules]
    for who in (*labels, *(f"aikit adaptive, {args.rules[0]} from {base}" for base in args.also_from), "adaptdl"):
        runs = [(r["best"], r[who], r["target"]) for r in seeds.values() if r[who] is not None]
        if not runs:
            continue
        ratios = [[b / a if a < math.inf else 0.0 for b, a in zip(to_target(best, t), to_target(run, t), strict=True)]
                  for best, run, t in runs]
        reached = sum(to_target(run, t)[0] < math.inf for _, run, t in runs)
        name = who if who != "adaptdl" else "AdaptDL 0.2.11"
        print(f"  {name:34s} updates {statistics.median(r[0] for r in ratios):.2f}, wall time "
              f"{statistics.median(r[1] for r in ratios):.2f}, final test accuracy "
              f"{statistics.median(b['test'] / run['test'] for b, run, _ in runs):.3f}; target reached in "
              f"{reached} of {len(runs)} seeds")

    first = seeds[args.seeds[0]]
    sampler, optimizer, base_lr = first["sampler"], first["optimizer"], first["base_lr"]
    # the adaptive machinery's cost: the base batch fixed and adaptive (no change allowed), alternated
    if args.timing_repeats:
        timing = argparse.Namespace(**{**vars(args), "epochs": args.timing_epochs, "eval_every": 10**9,
                                       "max_batch": args.base})
        per_sample = {"fixed": [], "adaptive": []}
        for repeat in range(args.timing_repeats):
            for name in ("fixed", "adaptive"):
                run = (fixed_run(data, args.base, base_lr, timing, repeat) if name == "fixed"
                       else adaptive_run(data, base_lr, timing, repeat, args.rules[0])[0])
                samples, _, seconds, _ = run["curve"][-1]
                per_sample[name].append(seconds / samples)
        ratio = statistics.median(per_sample["adaptive"]) / statistics.median(per_sample["fixed"])
        print(f"\nseconds per sample at batch {args.base}, adaptive (its noise measured every fourth update) / fixed, "
              f"median of {args.timing_repeats} alternated runs of {args.timing_epochs} epochs: {ratio:.2f}")

    # 8 devices, from the throughput model the first seed's adaptive run fitted on this one
    fit, params = sampler.controller.throughput, sum(p.numel() for p in ConvBase().parameters())
    fixed_updates = {b: to_target(first["fixed"][b, first["tuned"][b]], first["target"])[0] for b in args.batches}
    if math.isfinite(fixed_updates[args.base]):
        noise_scales = [row["noise_scale"] for row in optimizer.history]
        fixed_8, adaptive_8, batch_8, chosen = eight_devices(fit, noise_scales, fixed_updates[args.base],
                                                             fixed_updates, args, params)
        per_micro, per_sample_cost, per_update = fit.coefficients()
        print("\npredicted on 8 devices, each as fast as this one (fitted: "
              f"{per_micro * 1e3:.2f} ms per micro-step + {per_sample_cost * 1e6:.1f} us per sample + "
              f"{per_update * 1e3:.2f} ms per update), a ring all-reduce of {params} float32 gradients at "
              f"{args.bandwidth / 1e9:.2f} GB/s and {args.latency * 1e6:.0f} us a hop, fixed batches needing the "
              "updates they needed here, the adaptive batch chosen by goodput on that model with each update worth "
              f"AdaScale's gain and the noise scale measured here: best fixed (batch {batch_8}) {fixed_8:.2f} s, "
              f"adaptive {adaptive_8:.2f} s in {len(chosen)} updates (batches {min(chosen)}..{max(chosen)}), "
              f"ratio {fixed_8 / adaptive_8:.2f}")
    else:
        print(f"\n8-device prediction skipped: batch {args.base} never reached the target")
    if args.plot:
        from aikit.plot_adaptive import plot_adaptive

        plot_adaptive(optimizer.history, args.plot, title="aikit adaptive batch: MNIST-1D CNN")
        print(f"plot: {args.plot}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            seed: {"target": r["target"], "runs": r["rows"], "batches": r["sampler"].controller.batches,
                   "history": r["optimizer"].history} for seed, r in seeds.items()}))


if __name__ == "__main__":
    main()
