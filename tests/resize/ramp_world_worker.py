"""A balanced run (every replica the same whole micro-batches of every step) through a ramp whose
first steps do not fit two replicas: ``whole`` trains it on one process; ``first`` trains its
first steps on one process and commits; ``resume`` (under torchrun) restores that commit on the
world there is and finishes, or prints why the restore was refused. Final weights go to
``DIR/final.npz`` (rank 0)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from resize_common import loss_of, make_model, make_sgd
from torch.utils.data import DataLoader, TensorDataset

from aikit.elastic.Torch import CustomSampler, ElasticState, RootRuleOptimizer

TRACES = {"fits": [4, 4, 8, 8, 16, 8], "misfits": [4, 4, 12, 12]}  # micro-batches of 4; one epoch each
FIRST_STEPS = 2  # trained on one process before the commit: 4 and 4, one micro-batch each

mode, directory, name = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
trace = TRACES[name]
if mode == "resume":
    torch.distributed.init_process_group("gloo")
rank = torch.distributed.get_rank() if mode == "resume" else 0
rng = np.random.default_rng(0)
x, y = torch.as_tensor(rng.normal(size=(sum(trace), 64))), torch.as_tensor(rng.integers(0, 10, sum(trace)))
model = make_model()
sampler = CustomSampler(len(x), trace, minibatch_size=4, seed=5, balanced=True)
optimizer = RootRuleOptimizer(make_sgd(model), sampler, ref_batchsize=8)
state = ElasticState(directory, model=model, optimizer=optimizer, verbose=False)
if mode == "resume":
    try:
        state.restore()
    except ValueError as error:
        print(f"rank {rank} refused: {error}", flush=True)
        torch.distributed.destroy_process_group()
        sys.exit(0)
for _ in state.epochs(1):
    for xb, yb in DataLoader(TensorDataset(x, y), batch_sampler=sampler):
        loss_of(model, xb, yb).backward()
        if optimizer.step():
            state.commit()
            if mode == "first" and optimizer.updates == FIRST_STEPS:
                sys.exit(0)
print(f"rank {rank} trained {optimizer.updates} updates", flush=True)
if rank == 0:
    np.savez(directory / "final.npz", **{k: v.numpy() for k, v in model.state_dict().items()})
if mode == "resume":
    torch.distributed.destroy_process_group()
