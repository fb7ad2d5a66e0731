"""One rank of ``torchrun --nproc-per-node 2`` (gloo): AutoLRS on a DDP model.

The ranks read different data and (to prove rank 0 decides) rank 1's controller is seeded
differently. Every step's LR, each validation call and the final weights go to
``<out>/rank<r>.json`` for tests/autolrs/test_autolrs_ddp.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from aikit.autolrs.Torch import AutoLRS


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).double())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(400, 4, generator=g, dtype=torch.float64)
    y = x.sum(1, keepdim=True).sin()
    step_lrs, val_calls = [], []
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: step_lrs.append(opt.param_groups[0]["lr"]))

    def val_fn() -> float:
        with torch.no_grad():
            loss = nn.functional.mse_loss(model(x[:50]), y[:50])
        val_calls.append(len(step_lrs))
        return loss.item()

    autolrs = AutoLRS(model, optimizer, val_fn, 1e-3, 1.0, tau=20, tau_max=40, trials=3, trial_ratio=5,
                      val_points=4, seed=rank)
    for step in range(2 * (3 * 4 + 20) + 10):  # two stages (the second scored on validation), then some
        xb, yb = x[(step * 8) % 392:][:8], y[(step * 8) % 392:][:8]
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        optimizer.step()
        autolrs.on_train_batch_end(loss)
    result = {
        "step_lrs": step_lrs,
        "val_calls": val_calls,
        "history_lrs": [r.lr for r in autolrs.controller.history],
        "weights": [p.detach().flatten().tolist() for p in model.parameters()],
    }
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
