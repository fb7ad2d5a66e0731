"""Time per update: token-weighted GA on an FSDP2 model against hand-written FSDP2 accumulation.

    python benchmarks/fsdp_ga.py [--np 2] [--steps 4] [--updates 12]

Relaunches itself under ``torchrun --standalone --nproc-per-node N`` (gloo, CPU). Every variant
trains examples/gpt_stdlib.py's TinyGPT, each block and the root ``fully_shard``-ed, on the same
micro-batches (each rank its own sequences, so the ranks hold different numbers of tokens):

* ``hand-written``: FSDP2's documented recipe with torchtune's token weighting:
  ``model.set_requires_gradient_sync(last micro-step)``, backward on each mean loss times its
  tokens, the token count all-reduced after the last backward, the gradients multiplied by
  world / total (FSDP2 averages) before the step;
* ``aikit weight=``: ``with optimizer.accumulate(model, weight=tokens):`` around each micro-step
  (the reduce-scatter skipped on every micro-step but the last; the count's all-reduce started
  before the last backward, so it overlaps it);
* ``aikit every micro-step``: the same with ``sync_every_micro_step=True`` (a reduce-scatter per
  micro-step: sharded gradients only, ``steps`` times the communication).

Updates alternate (each after a barrier) so every variant sees the same machine load; rank 0
prints the medians, their ratio to the hand-written loop (aim: <= 1.02) and the reduce-scatters
each made per update.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(steps: int, updates: int, sequences: int, context: int) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    sys.path.insert(0, str(ROOT / "examples"))
    from gpt_stdlib import TinyGPT, token_loss

    from aikit.datasets import IGNORE, pad_batch, stdlib_text
    from aikit.ga.Torch.optim import Optimizer

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    train, _ = stdlib_text(max_len=context, max_bytes=1_000_000)
    order = np.random.default_rng(rank).permutation(len(train))[: steps * sequences]
    batches = [tuple(map(torch.from_numpy, pad_batch([train[i] for i in part]))) for part in np.split(order, steps)]

    def sharded() -> torch.nn.Module:
        torch.manual_seed(0)
        model = TinyGPT(context=context)
        for block in model.blocks:
            fully_shard(block)
        return fully_shard(model)

    scatters = {"count": 0}
    reduce_scatter = dist.reduce_scatter_single

    def counting(*args, **kwargs):
        scatters["count"] += 1
        return reduce_scatter(*args, **kwargs)

    dist.reduce_scatter_single = counting

    hand_model, ours_model, every_model = sharded(), sharded(), sharded()
    hand = torch.optim.AdamW(hand_model.parameters(), lr=1e-3)
    ours = Optimizer(torch.optim.AdamW(ours_model.parameters(), lr=1e-3), steps)
    every = Optimizer(torch.optim.AdamW(every_model.parameters(), lr=1e-3), steps, sync_every_micro_step=True)

    def update_hand() -> None:
        total = torch.zeros((), dtype=torch.int64)
        for index, (inputs, labels) in enumerate(batches):
            hand_model.set_requires_gradient_sync(index == len(batches) - 1)
            loss, tokens = token_loss(hand_model, inputs, labels)
            (loss * tokens).backward()
            total += tokens
        dist.all_reduce(total)
        torch._foreach_mul_([p.grad for p in hand_model.parameters()], world / total.double())
        hand.step()
        hand.zero_grad()

    def aikit_update(model, optimizer) -> None:
        for inputs, labels in batches:
            with optimizer.accumulate(model, weight=(labels != IGNORE).sum()):
                loss, _ = token_loss(model, inputs, labels)
                loss.backward()
            optimizer.step()

    variants = {"hand-written": update_hand, "aikit weight=": lambda: aikit_update(ours_model, ours),
                "aikit every micro-step": lambda: aikit_update(every_model, every)}
    times: dict[str, list[float]] = {name: [] for name in variants}
    per_update: dict[str, int] = {}
    for i in range(updates + 2):  # 2 warm-up updates each
        for name, update in variants.items():
            dist.barrier()
            before, start = scatters["count"], time.perf_counter()
            update()
            if i >= 2:
                times[name].append(time.perf_counter() - start)
            per_update[name] = scatters["count"] - before
    dist.reduce_scatter_single = reduce_scatter
    for a, b in zip(hand_model.parameters(), ours_model.parameters(), strict=True):
        torch.testing.assert_close(a.full_tensor(), b.full_tensor(), rtol=1e-2, atol=1e-4)  # float32 rounding aside
    if rank == 0:
        params = sum(p.numel() for p in hand_model.parameters())
        tokens = [int((labels != IGNORE).sum()) for _, labels in batches]
        print(f"{world} processes (gloo), TinyGPT of {params:,} parameters in 3 FSDP2 units, {steps} micro-batches "
              f"of {sequences} sequences per update (rank 0: {tokens} tokens), {updates} updates each")
        base = statistics.median(times["hand-written"])
        for name, measured in times.items():
            median = statistics.median(measured)
            print(f"  {name:<24} {median * 1e3:8.1f} ms/update   ratio {median / base:.3f}   "
                  f"{per_update[name]} reduce-scatters per update")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--updates", type=int, default=12)
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--context", type=int, default=64)
    args = parser.parse_args()
    if "LOCAL_RANK" in os.environ:
        return worker(args.steps, args.updates, args.sequences, args.context)
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.np),
               __file__, *sys.argv[1:]]
    sys.exit(subprocess.call(command, env=env))


if __name__ == "__main__":
    main()
