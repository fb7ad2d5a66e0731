"""Run under horovodrun: every case of hvd_case with aikit's Horovod GA; each rank saves its result.

Usage: horovodrun -np 2 -H localhost:2 --gloo python ga_worker.py OUT_DIR
"""

import contextlib
import sys
from pathlib import Path

import horovod.torch as hvd
import torch
from hvd_case import CASES, data, model

import aikit.elastic
import aikit.elastic.Torch
from aikit.core.windows import micro_batch_slices
from aikit.elastic.Torch import horovod


def train(case):
    rank = hvd.rank()
    plan = aikit.elastic.Torch.init(case.G, case.M)
    x, y = data()
    net = model(seed=100 + rank)  # ranks start apart: broadcast_state must make them equal
    inner, scheduler = case.inner(net)
    optimizer = horovod.DistributedOptimizer(inner, aikit.elastic.Torch.steps, max_grad_norm=case.max_grad_norm)
    horovod.broadcast_state(net, optimizer)
    mine, whole = micro_batch_slices(plan, rank), micro_batch_slices(plan)
    for window in case.window_indices():
        for step_slice, my_slice in zip(whole, mine, strict=True):
            if step_slice.start >= len(window):
                break  # no rank has a sample in this GA step of the short window
            idx = window[my_slice]  # clipped to the window: a short window leaves some ranks less
            declared = optimizer.accumulate(net, samples=len(idx)) if case.declare_samples else contextlib.nullcontext()
            with declared:
                if len(idx):
                    torch.nn.functional.cross_entropy(net(x[idx]), y[idx]).backward()
            optimizer.step()
            if optimizer.updated and scheduler is not None:
                scheduler.step()
        if optimizer.flush() and scheduler is not None:
            scheduler.step()
    assert optimizer.position == 0
    return {
        "params": [p.detach().clone() for p in net.parameters()],
        "plan": {name: getattr(aikit.elastic, name) for name in aikit.elastic.PUBLIC},
        "inner_steps": max((int(s.get("step", 0)) for s in inner.state.values()), default=0),
    }


if __name__ == "__main__":
    hvd.init()
    torch.save({case.name: train(case) for case in CASES}, Path(sys.argv[1]) / f"rank{hvd.rank()}.pt")
