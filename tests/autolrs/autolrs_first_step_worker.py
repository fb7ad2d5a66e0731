"""One rank of ``torchrun --nproc-per-node 2`` (gloo, TORCH_DISTRIBUTED_DEBUG=DETAIL, which
refuses collectives that differ between the ranks): AutoLRS's constructor is local and its
first step checks the replicas began alike.

1. Each rank builds an AutoLRS with ``design=0`` and its own seed, so their first trial LRs
   differ, and steps once: both must refuse (InvalidValue), in the same collectives.
2. Rank 1 alone builds a second AutoLRS (never stepped): a constructor with a collective
   would pair with rank 0's next one and the ranks' collectives would differ from there.
3. Both build the AutoLRS they train with and take 30 steps.
4. Rank 0's val_fn returns 'abc' at its 2nd call (rank 1's a number): both ranks raise at the
   same step (rank 0 the refusal naming val_fn, rank 1 a TrainingFailed pointing at rank 0), then
   both train on at the same LRs.
5. The loss is NaN at every step: both ranks raise TrainingFailed at the same step.

What each rank saw goes to ``<out>/rank<r>.json`` for tests/autolrs/test_autolrs_ddp.py.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"

import torch
import torch.distributed as dist
from torch import nn

from aikit.autolrs.Torch import AutoLRS
from aikit.core.errors import AikitError, InvalidValue


def net_and_optimizer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).double()
    return model, torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    x = torch.randn(400, 4, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    y = x.sum(1, keepdim=True).sin()

    def train(autolrs, model, optimizer, steps, scale=1.0):
        lrs = []
        for step in range(steps):
            lrs.append(optimizer.param_groups[0]["lr"])
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x[step * 8:][:8]), y[step * 8:][:8]) * scale
            loss.backward()
            optimizer.step()
            autolrs.on_train_batch_end(loss)
        return lrs

    model, optimizer = net_and_optimizer()
    differing = AutoLRS(model, optimizer, lambda: 0.0, 1e-3, 1.0, tau=15, trials=3, trial_ratio=5, design=0,
                        seed=rank)
    first_lr, refusal = optimizer.param_groups[0]["lr"], None
    try:
        train(differing, model, optimizer, 1)
    except InvalidValue as error:
        refusal = str(error)

    if rank == 1:
        spare, spare_optimizer = net_and_optimizer()
        AutoLRS(spare, spare_optimizer, lambda: 0.0, 1e-3, 1.0, tau=15, trials=3, trial_ratio=5)
    model, optimizer = net_and_optimizer()
    autolrs = AutoLRS(model, optimizer, lambda: 0.0, 1e-3, 1.0, tau=15, trials=3, trial_ratio=5, seed=rank)
    step_lrs = train(autolrs, model, optimizer, 30)
    result = {"first_lr": first_lr, "refusal": refusal, "step_lrs": step_lrs,
              "history_lrs": [r.lr for r in autolrs.controller.history]}

    def until_raised(autolrs, model, optimizer, steps, scale=1.0):
        for step in range(steps):
            try:
                train(autolrs, model, optimizer, 1, scale)
            except AikitError as error:
                return [step, type(error).__name__, str(error)]
        return None

    calls = []
    model, optimizer = net_and_optimizer()
    answers = lambda: (calls.append(1), "abc" if rank == 0 and len(calls) == 2 else 0.5 / len(calls))[1]  # noqa: E731
    autolrs = AutoLRS(model, optimizer, answers, 1e-3, 1.0, tau=40, tau_max=40, trials=2, val_tau=1, val_points=4,
                      seed=rank)
    result["val_refusal"] = until_raised(autolrs, model, optimizer, 30)
    result["after_refusal_lrs"] = train(autolrs, model, optimizer, 20)
    model, optimizer = net_and_optimizer()
    autolrs = AutoLRS(model, optimizer, lambda: 0.0, 1e-3, 1.0, tau=15, trials=3, trial_ratio=5, seed=rank)
    result["nan_refusal"] = until_raised(autolrs, model, optimizer, 60, scale=math.nan)
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
