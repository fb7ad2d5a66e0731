"""Time per update: token-weighted GA against a hand-written torchtune-style loop.

Both train examples/gpt_stdlib.py's TinyGPT on the same micro-batches of the standard library's
sources (padded to their longest sequence, so every micro-batch holds its own number of tokens):

* ``torchtune-style``: torchtune #1917 by hand: backward on each micro-batch's mean loss times its
  token count, the counts summed (a tensor: no host sync), every gradient multiplied by 1 / total
  in one ``torch._foreach_mul_`` before the step;
* ``aikit weight=``: the seed's loop with ``with optimizer.accumulate(model, weight=tokens):`` around
  each micro-step (the weight applied to the gradient entering the model's outputs, the total
  summed at the update, one multiply there);
* ``mean of means``: the wrong loop (each micro-batch's mean loss / steps), for scale: what the
  right answer costs over the wrong one.

The loops run interleaved, update by update in a shuffled order, and the script prints the median
of this thread's CPU time per update and the ratio to the hand-written loop (aim: <= 1.02):

    python benchmarks/tokens_torch.py               # about 20 s
    python benchmarks/tokens_torch.py --rounds 60 --context 128
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from gpt_stdlib import TinyGPT, token_loss

from aikit.datasets import IGNORE, pad_batch, stdlib_text
from aikit.ga.Torch.optim import Optimizer


def torchtune_style(model, optimizer, micro_batches) -> None:
    total = 0
    for inputs, labels in micro_batches:
        loss, tokens = token_loss(model, inputs, labels)
        (loss * tokens).backward()
        total = total + tokens
    torch._foreach_mul_([p.grad for p in model.parameters()], 1 / total)
    optimizer.step()
    optimizer.zero_grad()


def aikit_tokens(model, optimizer, micro_batches) -> None:
    for inputs, labels in micro_batches:
        with optimizer.accumulate(model, weight=(labels != IGNORE).sum()):
            loss, _ = token_loss(model, inputs, labels)
            loss.backward()
        optimizer.step()


def mean_of_means(model, optimizer, micro_batches) -> None:
    for inputs, labels in micro_batches:
        loss, _ = token_loss(model, inputs, labels)
        (loss / len(micro_batches)).backward()
    optimizer.step()
    optimizer.zero_grad()


LOOPS = {"torchtune-style": torchtune_style, "aikit weight=": aikit_tokens, "mean of means": mean_of_means}


def micro_batches(steps: int, sequences: int, context: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    train, _ = stdlib_text(max_len=context, max_bytes=2_000_000)
    order = np.random.default_rng(0).permutation(len(train))[: steps * sequences]
    return [tuple(map(torch.from_numpy, pad_batch([train[i] for i in part]))) for part in np.split(order, steps)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="micro-batches per update")
    parser.add_argument("--sequences", type=int, default=8, help="sequences per micro-batch")
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    random.seed(0)
    batches = micro_batches(args.steps, args.sequences, args.context)
    tokens = [int((labels != IGNORE).sum()) for _, labels in batches]
    runs = {}
    for name in LOOPS:
        torch.manual_seed(0)
        model = TinyGPT(context=args.context, width=args.width, layers=args.layers)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        runs[name] = model, Optimizer(optimizer, args.steps) if name.startswith("aikit") else optimizer
    params = sum(p.numel() for p in runs["aikit weight="][0].parameters())
    print(f"torch {torch.__version__}, {args.threads} thread(s), TinyGPT of {params:,} parameters, {args.steps} "
          f"micro-batches of {args.sequences} sequences ({tokens} tokens), median of {args.rounds} rounds, "
          f"{args.clock} clock")
    times: dict[str, list[float]] = {name: [] for name in LOOPS}
    for name, (model, optimizer) in runs.items():  # warm up
        LOOPS[name](model, optimizer, batches)
    for _ in range(args.rounds):
        for name in random.sample(list(LOOPS), len(LOOPS)):
            model, optimizer = runs[name]
            start = clock()
            LOOPS[name](model, optimizer, batches)
            times[name].append(clock() - start)
    for a, b in zip(runs["torchtune-style"][0].parameters(), runs["aikit weight="][0].parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-4)  # the same training, float32 rounding aside
    base = statistics.median(times["torchtune-style"])
    for name, measured in times.items():
        median = statistics.median(measured)
        print(f"  {name:<16} {median * 1e3:8.2f} ms/update   ratio {median / base:.3f}")


if __name__ == "__main__":
    main()
