"""Time per update: aikit's GA wrapper against a hand-written accumulation loop.

Same model, same synthetic data, same optimizer; the loops run interleaved (in a shuffled
order every round) so machine noise hits them alike, and the script prints the median of each
round's ratio aikit / hand-written (aim: <= 1.01), and the hand-written loop's own ratio to a
second run of itself in the same round: the resolution.

    python benchmarks/ga_torch.py                 # the CNN, the MLP and the tiny model, 4 GA steps of 64
    python benchmarks/ga_torch.py --model mlp --rounds 30 --threads 2
    python benchmarks/ga_torch.py --rounds 60 --updates 3 --save benchmarks/results/ga_torch.json  # the docs' figures
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch
from torch import nn

from aikit.ga.Torch.optim import Optimizer


def make_model(name: str) -> nn.Module:
    torch.manual_seed(0)
    if name == "tiny":  # almost no arithmetic: its time per update is the loops' own Python
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    if name == "mlp":  # many parameters per FLOP: the worst case for per-parameter overhead
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                             nn.Linear(1024, 10))
    return nn.Sequential(  # the main job's CNN
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10),
    )


def hand_written(model, opt, micro_batches):
    """The textbook loop: scale each loss by its share n/G (1/k when even), step and zero
    every k micro-batches."""
    total = sum(len(x) for x, _ in micro_batches)
    for x, y in micro_batches:
        (nn.functional.cross_entropy(model(x), y) * (len(x) / total)).backward()
    opt.step()
    opt.zero_grad()


def aikit_plain(model, opt, micro_batches):
    """Seed 002's recipe: backward and step() on every micro-batch."""
    for x, y in micro_batches:
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def aikit_weighted(model, opt, micro_batches):
    """accumulate(samples=...): each micro-batch weighted by its samples (ragged-exact)."""
    for x, y in micro_batches:
        with opt.accumulate(model, samples=len(x)):
            nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def bench(model_name: str, sizes: list[int], rounds: int, updates: int, clock) -> dict[str, tuple[float, float]]:
    """Median over the rounds of each loop's time per update relative to the hand-written one's
    in the same round, and of the difference in microseconds. Every loop trains the same model
    with the same torch optimizer (each aikit loop through its own wrapper of it), so that only
    the code path differs: no loop's tensors sit elsewhere in memory. The hand-written loop runs
    twice per round, and the ratio of the two is what the machine's noise alone makes (the
    benchmark's resolution)."""
    gen = torch.Generator().manual_seed(1)
    micro_batches = [(torch.randn(n, 1, 8, 8, generator=gen), torch.randint(0, 10, (n,), generator=gen))
                     for n in sizes]
    model = make_model(model_name)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    wrapped = lambda: Optimizer(opt, len(sizes), global_batch_size=sum(sizes))  # noqa: E731
    loops = {"hand-written": (hand_written, opt), "hand-written again (resolution)": (hand_written, opt)}
    if len(set(sizes)) == 1:  # the seed's plain recipe is exact for equal micro-batches only
        loops["aikit step()"] = (aikit_plain, wrapped())
    loops["aikit accumulate(samples)"] = (aikit_weighted, wrapped())
    for loop, optimizer in loops.values():  # warm up
        loop(model, optimizer, micro_batches)
    ratios: dict[str, list[float]] = {name: [] for name in loops}
    extra: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(rounds):
        times = {}
        for name in random.sample(list(loops), len(loops)):
            loop, optimizer = loops[name]
            start = clock()
            for _ in range(updates):
                loop(model, optimizer, micro_batches)
            times[name] = (clock() - start) / updates
        for name, seconds in times.items():
            ratios[name].append(seconds / times["hand-written"])
            extra[name].append((seconds - times["hand-written"]) * 1e6)
    return {name: (statistics.median(ratios[name]), statistics.median(extra[name])) for name in loops}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=["cnn", "mlp", "tiny", "both", "all"], default="all",
                        help="both: the CNN and the MLP; tiny: a model with almost no arithmetic, whose "
                             "difference in microseconds is the wrapper's own Python per update; all: the three")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--micro-batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--updates", type=int, default=1, help="updates per timed run")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                        help="cpu: this thread's CPU time, robust to other processes on a shared machine "
                             "(meaningful with --threads 1); wall: elapsed time")
    parser.add_argument("--save", type=Path, help="write the ratios as JSON (benchmarks/results/ga_torch.json)")
    args = parser.parse_args()
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    random.seed(0)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.steps} GA steps of {args.micro_batch}, "
          f"median of {args.rounds} rounds x {args.updates} updates, {args.clock} clock")
    even = [args.micro_batch] * args.steps
    ragged = [*even[:-1], args.micro_batch - 1]  # G - 1 samples: every micro-batch gets a hook weight
    models = {"both": ["cnn", "mlp"], "all": ["cnn", "mlp", "tiny"]}.get(args.model, [args.model])
    results: dict[str, dict[str, dict[str, float]]] = {}
    for model_name in models:
        for label, sizes in (("even", even), ("ragged", ragged)):
            medians = bench(model_name, sizes, args.rounds, args.updates, clock)
            results[f"{model_name} {label}"] = {name: {"ratio": ratio, "extra_us": extra}
                                                for name, (ratio, extra) in medians.items() if name != "hand-written"}
            print(f"{model_name}, {label} micro-batches {sizes}: time per update / the hand-written loop's")
            for name, (ratio, extra) in medians.items():
                if name != "hand-written":
                    print(f"  {name:<33} {ratio:.3f}   {extra:+7.1f} us per update")
    if args.save:
        settings = {key: getattr(args, key) for key in ("rounds", "updates", "steps", "micro_batch", "threads")}
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(json.dumps({"settings": settings, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
