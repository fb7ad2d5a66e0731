"""Run under torchrun (gloo, no DDP): every case of tests/horovod/hvd_case.py with
``aikit.ga.Torch.optim.Optimizer(..., reduce=True)``; each rank saves its result.

Usage: torchrun --standalone --nproc-per-node 2 reduce_worker.py OUT_DIR
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "horovod"))
from hvd_case import CASES, train

if __name__ == "__main__":
    dist.init_process_group("gloo")
    torch.save({case.name: train(case, "torch.distributed") for case in CASES},
               Path(sys.argv[1]) / f"rank{dist.get_rank()}.pt")
    dist.destroy_process_group()
