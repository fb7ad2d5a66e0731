"""Run under horovodrun: every case of hvd_case with aikit's Horovod GA; each rank saves its result.

Usage: horovodrun -np 2 -H localhost:2 --gloo python ga_worker.py OUT_DIR
"""

import sys
from pathlib import Path

import horovod.torch as hvd
import torch
from hvd_case import CASES, train

if __name__ == "__main__":
    hvd.init()
    torch.save({case.name: train(case) for case in CASES}, Path(sys.argv[1]) / f"rank{hvd.rank()}.pt")
