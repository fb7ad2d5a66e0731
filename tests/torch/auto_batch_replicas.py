"""Run by tests/torch/test_auto_batch.py under torchrun (2 gloo processes): each rank searches
under its own address-space limit (``RLIMIT_AS``: rank 1 has less memory than rank 0), so
torch's CPU allocator truly fails at different sizes; ``init(G, "auto")`` must give both the
same plan, the smallest size any rank found. Each rank writes its findings to ``OUT/rank<r>.json``."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from auto_batch_case import G, data, limit, loss_of, model

import aikit.elastic.Torch as elastic

BUDGETS = {0: 24 * 2**20, 1: 8 * 2**20}  # address space beyond what the process holds


def main(out: Path) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    net = model()
    x, y = data()

    def trial(batch: int) -> None:
        net.zero_grad(set_to_none=True)
        loss_of(net, x[:batch], y[:batch]).backward()
        net.zero_grad(set_to_none=True)

    elastic.init(G, "auto", trial=lambda batch: None)  # warm: every module and gloo's buffers before the limit
    limit(True, BUDGETS[rank])
    plan = elastic.init(G, "auto", trial=trial)
    limit(False)
    own = max((size for size, fitted, _ in elastic.search.tries if fitted), default=None)
    found = {"plan": [plan.global_batch_size, plan.steps, plan.device_batch], "own": own,
             "tries": [[size, fitted] for size, fitted, _ in elastic.search.tries]}
    (out / f"rank{rank}.json").write_text(json.dumps(found))
    dist.destroy_process_group()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    main(Path(sys.argv[1]))
