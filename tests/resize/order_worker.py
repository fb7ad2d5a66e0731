"""One replica of the issue-12 scenarios, under ``torchrun --nproc-per-node 2`` (gloo).

    order_worker.py OUT_DIR

1. *start small*: trace [8, 16, 16] with micro-batches of 8, so rank 1 has nothing in the first
   step; ``ElasticState.restore()`` from an empty directory, then one epoch with a StepLR in an
   ``UpdateScheduler`` stepped after every ``step()`` (rank 1 makes two updates in some calls).
2. *resume where a replica is idle*: trace [16, 8, 16, 8, 16]; for every commit point and every
   order of the kept objects, a run whose last commit is that one is dropped (a kill right after
   the commit: fresh objects with other weights) and resumed by ``restore()`` to the epoch's end.

Each rank saves what it ended with; the test compares the ranks with each other, with an
uninterrupted run (bit for bit) and with single-process big-batch SGD.
"""

from __future__ import annotations

import itertools
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from aikit.elastic.Torch import CustomSampler, LinearRuleOptimizer
from aikit.elastic.Torch.resize import ElasticState
from aikit.ga.Torch.optim import UpdateScheduler

N, MINIBATCH, REF = 64, 8, 16
START_SMALL, IDLE_STEPS = [8, 16, 16], [16, 8, 16, 8, 16]


def data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    return torch.randn(N, 4, generator=gen, dtype=torch.float64), torch.randn(N, 1, generator=gen, dtype=torch.float64)


def net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1)).double()


def build(directory: Path, trace: list[int], order: tuple[str, ...], seed: int):
    model = net(seed)
    sampler = CustomSampler(N, trace, minibatch_size=MINIBATCH, seed=1, when_exhausted="cycle")
    opt = LinearRuleOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), sampler, ref_batchsize=REF)
    objects = {"model": model, "optimizer": opt, "note": "fresh"}
    state = ElasticState(directory, verbose=False, **{name: objects[name] for name in order})
    return model, opt, state


def train(model, opt, state, x, y, last_commit: int | None = None, scheduler=None) -> None:
    """One epoch, committing after every update up to ``last_commit``: the run then goes on
    as if killed right after that commit (its later work is dropped with its objects).
    ``scheduler`` is stepped after every ``opt.step()``, as in a loop written for plain torch."""
    for _ in state.epochs(1):
        for batch in opt.sampler:
            torch.nn.functional.mse_loss(model(x[batch]), y[batch]).backward()
            updated = opt.step()
            if scheduler is not None:
                scheduler.step()
            if updated and (last_commit is None or opt.updates <= last_commit):
                state.note = f"update {opt.updates}"
                state.commit()


def params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def main(out: Path) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=20))
    rank = dist.get_rank()
    x, y = data()
    result = {}

    model, opt, state = build(out / "start_small", START_SMALL, ("model", "optimizer", "note"), seed=rank)
    scheduler = UpdateScheduler(torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5))
    assert state.restore() is False  # rank 1 joins step 0, in which it is idle, here
    train(model, opt, state, x, y, scheduler=scheduler)
    result["start_small"] = params(model)

    order = ("model", "optimizer", "note")
    model, opt, state = build(out / "uninterrupted", IDLE_STEPS, order, seed=rank)
    state.restore()
    train(model, opt, state, x, y)
    result["uninterrupted"] = params(model)
    for commit in range(1, len(IDLE_STEPS)):
        for order in itertools.permutations(("model", "optimizer", "note")):
            directory = out / f"resume_{commit}_{'_'.join(order)}"
            model, opt, state = build(directory, IDLE_STEPS, order, seed=rank)
            state.restore()
            train(model, opt, state, x, y, last_commit=commit)
            model, opt, state = build(directory, IDLE_STEPS, order, seed=10 + rank)  # killed and restarted
            assert state.restore() is True and state.note == f"update {commit}"
            train(model, opt, state, x, y)
            result[f"resume_{commit}_{'_'.join(order)}"] = params(model)
    torch.save(result, out / f"rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
