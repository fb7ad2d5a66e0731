"""aikit's LR range test against torch-lr-finder 0.2.2, side by side in one run.

Both finders train the same model from the same weights on the same synthetic data with the
same seed; the runs alternate so that drift in the machine hits both alike. Prints the ratio
of median wall times (aikit / torch-lr-finder; below 1 means aikit is faster) and whether the
loss and LR histories are identical to the bit.

torch-lr-finder is not a dependency of aikit: if it is not importable it is installed, without
its dependencies, into a private directory (``--cache``) and put on ``sys.path``.

    python benchmarks/lr_finder_torch.py [--repeats 7] [--num-iter 100]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import os
import statistics
import subprocess
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aikit.lr_finder.Torch import LRFinder as AikitFinder

PIN = "torch-lr-finder==0.2.2"


def original_finder(cache: str):
    """torch-lr-finder's LRFinder, installed privately under ``cache`` when needed."""
    try:
        from torch_lr_finder import LRFinder
    except ImportError:
        if not os.path.isdir(os.path.join(cache, "torch_lr_finder")):
            subprocess.run(
                [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", cache, PIN],
                check=True,
            )
        sys.path.insert(0, cache)
        from torch_lr_finder import LRFinder
    return LRFinder


def make_problem(samples: int, features: int, classes: int, batch_size: int):
    """A synthetic classification set and an MLP, both from fixed seeds."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(samples, features, generator=generator)
    y = (x @ torch.randn(features, classes, generator=generator)).argmax(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(features, 128), nn.ReLU(), nn.Linear(128, classes))
    train = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True)
    val = DataLoader(TensorDataset(x[:512], y[:512]), batch_size=256)
    return model, train, val


def run(finder_class, model, weights, case, train, val, num_iter) -> tuple[float, float, dict]:
    """One range test from ``weights``; returns (wall seconds, CPU seconds, history)."""
    model.load_state_dict(weights)
    optimizer = case["optimizer"](model.parameters())
    finder = finder_class(model, optimizer, nn.CrossEntropyLoss())
    torch.manual_seed(1)  # the loader's shuffle
    sink = io.StringIO()
    start, cpu_start = time.perf_counter(), time.process_time()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        finder.range_test(
            train,
            val_loader=val if case["val"] else None,
            end_lr=case["end_lr"],
            num_iter=num_iter,
            accumulation_steps=case["accumulation_steps"],
        )
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    history = copy.deepcopy(finder.history)
    finder.reset()
    return seconds, cpu_seconds, history


def case(optimizer, end_lr, val=False, accumulation_steps=1) -> dict:
    return {"optimizer": optimizer, "end_lr": end_lr, "val": val, "accumulation_steps": accumulation_steps}


CASES = {
    "sgd": case(lambda p: torch.optim.SGD(p, lr=1e-5, momentum=0.9), end_lr=10),
    "adam, accumulation 2": case(lambda p: torch.optim.Adam(p, lr=1e-6), end_lr=1, accumulation_steps=2),
    "sgd, val loader": case(lambda p: torch.optim.SGD(p, lr=1e-4), end_lr=10, val=True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--num-iter", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: immune to other processes competing for the cores)")
    parser.add_argument("--cache", default=os.path.expanduser("~/.cache/aikit/torch-lr-finder-0.2.2"))
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    original = original_finder(args.cache)
    model, train, val = make_problem(4096, 64, 10, args.batch_size)
    weights = copy.deepcopy(model.state_dict())
    for finder_class in (AikitFinder, original):  # warm up: lazy imports, allocator, caches
        run(finder_class, model, weights, CASES["sgd"], train, val, 5)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.num_iter} iterations, "
          f"batch {args.batch_size}, {args.repeats} alternating repeats per finder")
    print("medians; ratio = aikit / torch-lr-finder (wall clock, and CPU time of this process)")
    print(f"{'case':<22} {'aikit s':>8} {'orig s':>8} {'wall ratio':>10} {'CPU ratio':>10}  identical histories")
    for name, case in CASES.items():
        wall, cpu = {"aikit": [], "original": []}, {"aikit": [], "original": []}
        histories = {}
        for repeat in range(args.repeats):
            order = [("aikit", AikitFinder), ("original", original)]
            for label, finder_class in order if repeat % 2 == 0 else order[::-1]:
                seconds, cpu_seconds, history = run(finder_class, model, weights, case, train, val, args.num_iter)
                wall[label].append(seconds)
                cpu[label].append(cpu_seconds)
                histories.setdefault(label, history)
                if history != histories[label]:
                    raise SystemExit(f"{label} is not deterministic across repeats in case {name!r}")
        ours, theirs = statistics.median(wall["aikit"]), statistics.median(wall["original"])
        cpu_ratio = statistics.median(cpu["aikit"]) / statistics.median(cpu["original"])
        same = histories["aikit"] == histories["original"]
        print(f"{name:<22} {ours:8.3f} {theirs:8.3f} {ours / theirs:10.3f} {cpu_ratio:10.3f}  {same} "
              f"({len(histories['aikit']['loss'])} vs {len(histories['original']['loss'])} points)")


if __name__ == "__main__":
    main()
