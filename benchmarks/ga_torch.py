"""Time per update: aikit's GA wrapper against a hand-written accumulation loop.

Same model, same synthetic data, same optimizer; the loops run interleaved (in a shuffled
order every round) so machine noise hits them alike, and the script prints medians and the
ratio aikit / hand-written (aim: <= 1.02).

    python benchmarks/ga_torch.py                 # both models, 4 GA steps of 64
    python benchmarks/ga_torch.py --model mlp --rounds 30 --threads 2
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
from torch import nn

from aikit.ga.Torch.optim import Optimizer


def make_model(name: str) -> nn.Module:
    torch.manual_seed(0)
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


def bench(model_name: str, sizes: list[int], rounds: int, updates: int, clock) -> dict[str, float]:
    gen = torch.Generator().manual_seed(1)
    micro_batches = [(torch.randn(n, 1, 8, 8, generator=gen), torch.randint(0, 10, (n,), generator=gen))
                     for n in sizes]
    variants = [("hand-written", hand_written), ("aikit accumulate(samples)", aikit_weighted)]
    if len(set(sizes)) == 1:  # the seed's plain recipe is exact for equal micro-batches only
        variants.insert(1, ("aikit step()", aikit_plain))
    loops = {}
    for name, loop in variants:
        model = make_model(model_name)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        if name != "hand-written":
            opt = Optimizer(opt, len(sizes), global_batch_size=sum(sizes))
        loops[name] = (loop, model, opt)
    times: dict[str, list[float]] = {name: [] for name in loops}
    for loop, model, opt in loops.values():  # warm up
        loop(model, opt, micro_batches)
    for _ in range(rounds):
        for name in random.sample(list(loops), len(loops)):
            loop, model, opt = loops[name]
            start = clock()
            for _ in range(updates):
                loop(model, opt, micro_batches)
            times[name].append((clock() - start) / updates)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=["cnn", "mlp", "both"], default="both")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--micro-batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--updates", type=int, default=1, help="updates per timed run")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                        help="cpu: this thread's CPU time, robust to other processes on a shared machine "
                             "(meaningful with --threads 1); wall: elapsed time")
    args = parser.parse_args()
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    random.seed(0)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.steps} GA steps of {args.micro_batch}, "
          f"median of {args.rounds} rounds x {args.updates} updates, {args.clock} clock")
    even = [args.micro_batch] * args.steps
    ragged = [*even[:-1], args.micro_batch - 1]  # G - 1 samples: every micro-batch gets a hook weight
    for model_name in (["cnn", "mlp"] if args.model == "both" else [args.model]):
        for label, sizes in (("even", even), ("ragged", ragged)):
            medians = bench(model_name, sizes, args.rounds, args.updates, clock)
            base = medians["hand-written"]
            print(f"{model_name}, {label} micro-batches {sizes}:")
            for name, median in medians.items():
                print(f"  {name:<27} {median * 1e3:8.3f} ms/update   ratio {median / base:.3f}")


if __name__ == "__main__":
    main()
