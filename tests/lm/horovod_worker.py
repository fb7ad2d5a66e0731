"""Run under horovodrun: the cases of lm_case.py on aikit's Horovod DistributedOptimizer; each
rank saves its results.

Usage: horovodrun -np 2 -H localhost:2 --gloo python horovod_worker.py OUT_DIR
"""

import sys
from pathlib import Path

import horovod.torch as hvd
import torch
from lm_case import run_all

if __name__ == "__main__":
    hvd.init()
    torch.save(run_all(("horovod",), hvd.size()), Path(sys.argv[1]) / f"rank{hvd.rank()}.pt")
