"""Runs under ``torchrun --nproc-per-node 2`` (gloo): DDP + the GA wrapper on a tiny model.

Each rank writes its final parameters (float64) and the all-reduces its DDP communication
hook counted to ``<out>/rank<r>.json``; tests/torch/test_ddp.py compares them with a
single-process big-batch run built from the same helpers below.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

SCENARIOS = {
    # name: (global batch, max per device, optimizer, use accumulate(samples=...), loss reduction)
    "even": (16, 4, "sgd", True, "mean"),  # 2 GA steps of 4 samples per rank
    "ragged": (11, 3, "adam", True, "mean"),  # steps [3, 3] then [3, 2]: ranks hold different counts
    "plain": (16, 4, "sgd", False, "mean"),  # the seed recipe: backward + step(), no context manager
    "empty": (3, 1, "adam", True, "mean"),  # steps [1, 1] then [1, 0]: rank 1 joins with an empty batch
    # Run:AI's AIkit's arithmetic: a summed loss, reduction="sum" (DDP averages: weights x world)
    "sum": (16, 4, "sgd", False, "sum"),
}
UPDATES = 3


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3)).double()


def make_optimizer(name: str, params) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.01)
    return torch.optim.Adam(params, lr=0.01, weight_decay=0.01)


def make_data(global_batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The samples of every update, identical on every rank and in the test."""
    gen = torch.Generator().manual_seed(1)
    return [
        (torch.randn(global_batch, 5, generator=gen, dtype=torch.float64),
         torch.randint(0, 3, (global_batch,), generator=gen))
        for _ in range(UPDATES)
    ]


def loss_fn(net, x, y, reduction: str = "mean") -> torch.Tensor:
    return torch.nn.functional.cross_entropy(net(x), y, reduction=reduction)


def run(name: str) -> dict:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    import aikit.elastic.Torch
    from aikit.core.plan import micro_batch_slices
    from aikit.elastic.Torch import distributed
    from aikit.ga.Torch.optim import Optimizer

    global_batch, max_batch, opt_name, weighted, reduction = SCENARIOS[name]
    plan = aikit.elastic.Torch.init(global_batch, max_batch)
    rank = distributed.rank()
    model = DistributedDataParallel(make_model())
    counts = {"allreduce_rounds": 0, "bucket_calls": 0}

    def counting_allreduce(state, bucket):
        state["bucket_calls"] += 1
        state["allreduce_rounds"] += bucket.is_last()
        return default_hooks.allreduce_hook(None, bucket)

    model.register_comm_hook(counts, counting_allreduce)
    optimizer = Optimizer(make_optimizer(opt_name, model.parameters()), aikit.elastic.Torch.steps,
                          reduction=reduction)
    for x, y in make_data(global_batch):
        for piece in micro_batch_slices(plan, rank):
            xm, ym = x[piece], y[piece]
            if weighted:
                with optimizer.accumulate(model, samples=len(xm)):
                    loss_fn(model, xm, ym).backward()
            else:
                optimizer.zero_grad()
                loss_fn(model, xm, ym, reduction).backward()
            optimizer.step()
    return {
        "params": [p.detach().tolist() for p in model.module.parameters()],
        "steps": plan.steps,
        "master": aikit.elastic.Torch.master,
        "gpus": aikit.elastic.Torch.gpus,
        "local_sizes": list(plan.device_batch_sizes(rank)),
        **counts,
    }


def main(out: str) -> None:
    torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank()
    results = {name: run(name) for name in SCENARIOS}
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
