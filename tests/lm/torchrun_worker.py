"""Run under torchrun (gloo): every case of lm_case.py on DDP, FSDP2 and the reduce-at-update
optimizer (FSDP2 alone on 3 processes), and the trace run; each rank saves its results.

Usage: torchrun --standalone --nproc-per-node 2 torchrun_worker.py OUT_DIR
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from lm_case import run_all, train_trace

if __name__ == "__main__":
    dist.init_process_group("gloo")
    results = run_all(("ddp", "fsdp", "reduce"), dist.get_world_size())
    results["trace"] = train_trace()
    torch.save(results, Path(sys.argv[1]) / f"rank{dist.get_rank()}.pt")
    dist.destroy_process_group()
