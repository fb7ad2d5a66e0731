"""One replica of the agreement tests, under ``torchrun --nproc-per-node 2`` (gloo).

    agree_worker.py OUT

Each case builds a trace optimizer whose settings differ between the ranks, and records the
error each rank gets (or None) in OUT/rank<r>.json:

- ``trace``: rank 1 is given another trace; refused at the first ``set_epoch()`` (rank 0's
  parameters go out in that collective, and the settings with them).
- ``seed_no_broadcast``: rank 1 another seed, ``broadcast=False`` (Horovod elastic): no collective
  at ``set_epoch()``, so refused at the first update's all-reduce, before the update.
- ``same``: the same settings everywhere: no refusal, and rank 1 starts from rank 0's weights.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from aikit.elastic.Torch import CustomSampler, LinearRuleOptimizer


def case(trace: list[int], seed: int, broadcast: bool) -> tuple[str | None, list[float]]:
    rank = dist.get_rank()
    torch.manual_seed(rank)  # other initial weights on each rank
    model = torch.nn.Linear(4, 1).double()
    sampler = CustomSampler(64, trace, seed=seed, minibatch_size=8, when_exhausted="cycle")
    opt = LinearRuleOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), sampler, ref_batchsize=16,
                              broadcast=broadcast)
    try:
        opt.set_epoch(0)
        for index in sampler:
            x = torch.ones(len(index), 4, dtype=torch.float64)
            model(x).sum().backward()
            if opt.step():
                break
    except ValueError as error:
        assert opt.updates == 0 and not opt.state  # refused before any update
        return str(error), model.weight.flatten().tolist()
    return None, model.weight.flatten().tolist()


def main(out: Path) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    results = {
        "trace": case([16, 16] if rank == 0 else [16, 32], 1, True),
        "seed_no_broadcast": case([16], 1 + rank, False),
        "same": case([16], 1, True),
    }
    (out / f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
