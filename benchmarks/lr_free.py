"""aikit's no-tune path against the LR-free optimizers users pick instead (issue 27).

Two tasks, each at equal optimizer-step budgets (AutoLRS's range test and trials counted):

* ``mnist1d``: MNIST-1D (offline, ``mnist1d``) and the MNIST-1D paper's CNN, batch 100, as in
  ``benchmarks/autolrs_mnist1d.py``;
* ``lm``: a small byte-level transformer language model (2 pre-norm blocks, width 64, context 32,
  batch 32) on real text, the Python standard library's sources (``aikit.datasets.stdlib_text``);
  validation loss in nats per byte.

Contenders (each over ``--seeds`` seeds, at budgets ``B`` and ``3B``):

* ``AutoLRS SGD`` / ``AutoLRS AdamW``: aikit's AutoLRS with its defaults and ``total_steps``
  (a range test of a tenth of the budget, a ramp to its LR, the LR held, a cosine anneal over
  the last 40 %);
* ``AutoLRS ... 2 stages``: the same with ``stages=2``, a searched stage after the held one
  (the default before this benchmark showed it does not pay at these budgets);
* ``SF-AdamW`` / ``SF-SGD``: Schedule-Free with its defaults (lr 0.0025 / 1.0), evaluated in its
  ``eval()`` mode; ``... README``: the README's advice (AdamW 1-10x the scheduled LR: 0.01 with a
  5 % warmup; SGD 10-50x: the SGD LR 0.1 x 10 with a 5 % warmup);
* ``Prodigy``: lr 1 and its defaults; ``Prodigy d_coef``: ``d_coef=0.5`` with bias correction and
  ``safeguard_warmup`` (its README's advice for a capped estimate);
* ``cosine grid``: AdamW with a cosine schedule at 4 peak LRs, the best median per budget: the
  ceiling (its grid's cost not counted).

Prints per task and budget the median final validation loss (and accuracy on MNIST-1D), the
median steps to a target (the ceiling's median final loss + 10 %), each method's ratio of
median final loss to aikit's default (AutoLRS; > 1: aikit's default is better) and whether
aikit's default is at least as good as the better of Schedule-Free and Prodigy (defaults).
``--plot PATH`` draws the medians. ``--quick`` (one seed, MNIST-1D, the 1x budget) runs in about
a minute on one idle core; the whole protocol (3 seeds, both tasks, B and 3B) in about an hour::

    python benchmarks/lr_free.py --quick
    python benchmarks/lr_free.py [--seeds 3] [--budget-mnist1d 300] [--budget-lm 300] [--plot lr_free.png]
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
from autolrs_digits import batches  # sibling scripts: benchmarks run as python benchmarks/NAME.py
from autolrs_mnist1d import ConvBase, mnist1d
from prodigyopt import Prodigy
from schedulefree import AdamWScheduleFree, SGDScheduleFree
from torch import nn

from aikit.autolrs.Torch import AutoLRS
from aikit.datasets import stdlib_text

COSINE_PEAKS = (1e-3, 3e-3, 1e-2, 3e-2)  # AdamW peaks of the ceiling's grid
DEFAULT = "AutoLRS AdamW"  # aikit's default no-tune path, compared with the peers


class MNIST1D:
    name, batch = "mnist1d", 100

    def __init__(self) -> None:
        self.x, self.y, self.xv, self.yv, _, _ = mnist1d()

    def model(self) -> nn.Module:
        return ConvBase()

    def stream(self, seed: int):
        for index in batches(len(self.y), seed, self.batch):
            yield self.x[index], self.y[index]

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        return nn.functional.cross_entropy(model(batch[0]), batch[1])

    def evaluate(self, model: nn.Module) -> tuple[float, float]:
        with torch.no_grad():
            logits = model(self.xv)
        return nn.functional.cross_entropy(logits, self.yv).item(), (logits.argmax(1) == self.yv).float().mean().item()


class TinyLM(nn.Module):
    def __init__(self, width: int = 64, context: int = 32, layers: int = 2) -> None:
        super().__init__()
        self.embed, self.position = nn.Embedding(256, width), nn.Parameter(torch.zeros(context, width))
        layer = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, 256)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(context), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        h = self.embed(tokens) + self.position[:n]
        return self.head(self.norm(self.blocks(h, mask=self.mask[:n, :n], is_causal=True)))


class LanguageModel:
    name, batch, context = "lm", 32, 32

    def __init__(self) -> None:
        train, val = stdlib_text(max_len=256, max_bytes=400_000)
        self.train = torch.from_numpy(np.concatenate(train))
        val = torch.from_numpy(np.concatenate(val))
        starts = np.random.default_rng(0).integers(0, len(val) - self.context - 1, 128)
        self.val = torch.stack([val[s:s + self.context + 1] for s in starts])

    def model(self) -> nn.Module:
        return TinyLM(context=self.context)

    def stream(self, seed: int):
        rng = np.random.default_rng(seed)
        while True:
            starts = rng.integers(0, len(self.train) - self.context - 1, self.batch)
            yield torch.stack([self.train[s:s + self.context + 1] for s in starts])

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        return nn.functional.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())

    def evaluate(self, model: nn.Module) -> tuple[float, float]:
        with torch.no_grad():
            return self.loss(model, self.val).item(), math.nan


def methods(budget: int) -> dict[str, Callable]:
    """name -> (params -> optimizer, how the LR is driven)."""
    warmup = budget // 20
    sgd = lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9)  # noqa: E731
    adamw = lambda p: torch.optim.AdamW(p, lr=1e-3)  # noqa: E731
    table = {
        "AutoLRS SGD": (sgd, {}),
        "AutoLRS AdamW": (adamw, {}),
        "AutoLRS SGD 2 stages": (sgd, {"stages": 2}),
        "AutoLRS AdamW 2 stages": (adamw, {"stages": 2}),
        "SF-AdamW": (lambda p: AdamWScheduleFree(p), None),
        "SF-AdamW README": (lambda p: AdamWScheduleFree(p, lr=0.01, warmup_steps=warmup), None),
        "SF-SGD": (lambda p: SGDScheduleFree(p), None),
        "SF-SGD README": (lambda p: SGDScheduleFree(p, lr=1.0, warmup_steps=warmup), None),
        "Prodigy": (lambda p: Prodigy(p), None),
        "Prodigy d_coef": (lambda p: Prodigy(p, d_coef=0.5, use_bias_correction=True, safeguard_warmup=True), None),
    }
    for peak in COSINE_PEAKS:
        table[f"cosine {peak:g}"] = (lambda p, peak=peak: torch.optim.AdamW(p, lr=peak), peak)
    return table


def run(task, seed: int, budget: int, make, drive, every: int) -> dict:
    """``budget`` optimizer steps, search included; validation loss every ``every`` steps on the
    model that is kept (Schedule-Free in its eval() mode)."""
    torch.manual_seed(seed)
    model = task.model()
    optimizer = make(model.parameters())
    schedule_free = hasattr(optimizer, "train") and "train_mode" in optimizer.param_groups[0]
    autolrs = None
    if isinstance(drive, dict):
        autolrs = AutoLRS(model, optimizer, lambda: task.evaluate(model)[0], total_steps=budget, seed=seed, **drive)
    if schedule_free:
        optimizer.train()
    curve: dict[int, float] = {}
    stream = task.stream(seed)
    for step in range(1, budget + 1):
        if isinstance(drive, float):  # a cosine to 0 over the budget
            optimizer.param_groups[0]["lr"] = drive * 0.5 * (1 + math.cos(math.pi * (step - 1) / budget))
        optimizer.zero_grad()
        loss = task.loss(model, next(stream))
        loss.backward()
        optimizer.step()
        if autolrs is not None:
            autolrs.on_train_batch_end(loss)
            if not autolrs.kept:
                continue
        if step % every == 0 or step == budget:
            if schedule_free:
                optimizer.eval()
            curve[step] = task.evaluate(model)[0]
            if schedule_free:
                optimizer.train()
    if schedule_free:
        optimizer.eval()
    val_loss, val_acc = task.evaluate(model)
    return {"curve": curve, "loss": val_loss if math.isfinite(val_loss) else math.inf, "acc": val_acc}


def steps_to(curve: dict[int, float], target: float) -> float:
    return next((step for step, loss in sorted(curve.items()) if loss <= target), math.inf)


def compare(task, seeds: list[int], budget: int, every: int, only: set[str] | None = None) -> dict[str, dict]:
    """Every method's runs and medians (``only``: those methods alone; ``cosine`` names the grid)."""
    results = {}
    for name, (make, drive) in methods(budget).items():
        if only is not None and name not in only and not (name.startswith("cosine") and "cosine" in only):
            continue
        runs = [run(task, seed, budget, make, drive, every) for seed in seeds]
        results[name] = {"runs": runs, "loss": statistics.median(r["loss"] for r in runs),
                         "acc": statistics.median(r["acc"] for r in runs)}
    cosines = [name for name in results if name.startswith("cosine")]
    if not cosines:  # no ceiling, so no target: steps to it are not counted
        for result in results.values():
            result["steps"] = math.nan
        results["_target"] = math.nan
        return results
    best = min(cosines, key=lambda name: results[name]["loss"])
    results["cosine grid (ceiling)"] = results.pop(best) | {"peak": best}
    for name in cosines:
        results.pop(name, None)
    target = results["cosine grid (ceiling)"]["loss"] * 1.10
    for result in results.values():
        result["steps"] = statistics.median(steps_to(r["curve"], target) for r in result["runs"])
    results["_target"] = target
    return results


def report(task_name: str, budget: int, results: dict) -> bool | None:
    target = results.pop("_target")
    default = results[DEFAULT]["loss"] if DEFAULT in results else math.nan
    print(f"\n{task_name}, {budget} steps (target: validation loss <= {target:.4f}, the ceiling's + 10 %)")
    print(f"  {'method':28s} {'val loss':>9s} {'val acc':>8s} {'steps to target':>16s} {'loss / aikit':>13s}  per seed")
    for name, r in results.items():
        label = name if "peak" not in r else f"{name} [{r['peak']}]"
        seeds = " ".join(f"{run['loss']:.4f}" for run in r["runs"])
        print(f"  {label:28s} {r['loss']:9.4f} {r['acc']:8.3f} {r['steps']:16} {r['loss'] / default:13.3f}  {seeds}")
    peers = {name: r["loss"] for name, r in results.items() if name in ("SF-AdamW", "SF-SGD", "Prodigy")}
    if not peers or DEFAULT not in results:  # --methods left them out: no verdict
        return None
    best_peer = min(peers, key=peers.get)
    wins = default <= peers[best_peer]
    print(f"  {DEFAULT} {default:.4f} vs the better peer with defaults, {best_peer} {peers[best_peer]:.4f}: "
          f"{'at least as good' if wins else 'WORSE'} (ratio {peers[best_peer] / default:.3f})")
    return wins


def plot(path: str, table: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(table), figsize=(6 * len(table), 5), squeeze=False)
    for ax, ((task_name, budget), results) in zip(axes[0], table.items(), strict=True):
        names = [n for n in results if not n.startswith("_")]
        ax.barh(names, [results[n]["loss"] for n in names])
        ax.set_title(f"{task_name}, {budget} steps: median final validation loss")
        ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budget-mnist1d", type=int, default=300, help="the 1x budget; 3x is run too")
    parser.add_argument("--budget-lm", type=int, default=300)
    parser.add_argument("--every", type=int, default=25, help="validation every this many steps")
    parser.add_argument("--tasks", default="mnist1d,lm")
    parser.add_argument("--scales", default="1,3", help="budgets as multiples of the 1x budget")
    parser.add_argument("--quick", action="store_true", help="one seed, MNIST-1D, the 1x budget: about a minute")
    parser.add_argument("--plot", default=None)
    parser.add_argument("--methods", default=None,
                        help="only these methods, comma-separated names as printed ('cosine': the ceiling's grid), "
                             "e.g. 'AutoLRS AdamW'; the verdict needs AutoLRS AdamW and the peers")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.tasks, args.scales = 1, "mnist1d", "1"
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)  # AutoLRS's INFO/WARNING lines: the table is the output
    seeds = list(range(args.seeds))
    only = None if args.methods is None else {name.strip() for name in args.methods.split(",")}
    if only is not None and (unknown := only - set(methods(1)) - {"cosine"}):
        parser.error(f"unknown --methods {sorted(unknown)}; known: {', '.join(methods(1))}, cosine")
    start, verdicts, table = time.time(), {}, {}
    for task_name in args.tasks.split(","):
        task = {"mnist1d": MNIST1D, "lm": LanguageModel}[task_name]()
        base = getattr(args, f"budget_{task_name}")
        for budget in (base * int(scale) for scale in args.scales.split(",")):
            results = compare(task, seeds, budget, args.every, only)
            table[task_name, budget] = dict(results)
            verdicts[task_name, budget] = report(task_name, budget, results)
    print(f"\n{DEFAULT} at least as good as the better peer (median of {args.seeds} seeds): "
          + ", ".join(f"{t} {b}: {'-' if v is None else 'yes' if v else 'no'}" for (t, b), v in verdicts.items())
          + f"  ({time.time() - start:.0f} s)")
    if args.plot:
        plot(args.plot, table)


if __name__ == "__main__":
    main()
