"""Trains through a batch-size trace on XLA:CPU devices; prints a JSON summary.

Run by tests/trace/test_xla.py with .venv-xla's python and PJRT_DEVICE=CPU: on one device, or
with ``--replicas`` on CPU_NUM_DEVICES devices under xmp.spawn (one thread per device, each a
replica all-reducing with xm.all_reduce). The same training also runs in one process on the
plain CPU device, so the test can check XLA computes the same parameters.
"""

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch_xla
import torch_xla.debug.metrics as met
import torch_xla.distributed.xla_multiprocessing as xmp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aikit.elastic.Torch import CustomSampler, LinearRuleOptimizer

MINIBATCH, EPOCHS = 16, 4


def train(device: torch.device, sizes: list[int], data: TensorDataset) -> tuple[list[torch.Tensor], dict]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4)).to(device)
    sampler = CustomSampler(data, sizes, minibatch_size=MINIBATCH, when_exhausted="cycle")
    optimizer = LinearRuleOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), sampler,
                                    ref_batchsize=64)
    loader = DataLoader(data, batch_sampler=sampler)
    compiles, batch_sizes, updates = [], set(), 0
    print(f"replica {sampler.rank} of {sampler.num_replicas} on {device}", file=sys.stderr)
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        optimizer.set_epoch(epoch)
        for x, y in loader:
            assert x.shape[0] == MINIBATCH, x.shape
            nn.functional.cross_entropy(model(x.to(device)), y.to(device)).backward()
            updates += optimizer.step()
        batch_sizes.update(int(b) for b in optimizer.epoch_schedule.batch_sizes)
        if device.type == "xla":
            compiles.append(int(met.metric_data("CompileTime")[0]))
    params = [p.detach().cpu() for p in model.parameters()]
    return params, {"compiles_per_epoch": compiles, "distinct_batch_sizes": len(batch_sizes), "updates": updates}


def problem() -> tuple[list[int], TensorDataset]:
    rng = np.random.default_rng(0)
    sizes = (rng.integers(1, 9, size=40) * MINIBATCH).tolist()  # 16 .. 128, 8 distinct sizes
    x = torch.as_tensor(rng.normal(size=(640, 8)), dtype=torch.float32)
    return sizes, TensorDataset(x, torch.as_tensor((x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()))


def replica(index: int, out: str) -> None:
    """One device's replica under xmp.spawn; replica 0 saves what it got."""
    params, summary = train(torch_xla.device(), *problem())
    if index == 0:
        torch.save((params, summary), out)


def main() -> None:
    sizes, data = problem()
    if "--replicas" in sys.argv:
        with tempfile.TemporaryDirectory() as tmp:
            out = str(Path(tmp) / "replica0.pt")
            xmp.spawn(replica, args=(out,))
            on_xla, summary = torch.load(out)
    else:
        on_xla, summary = train(torch_xla.device(), sizes, data)
    on_cpu, _ = train(torch.device("cpu"), sizes, data)
    summary["max_abs_diff_vs_cpu"] = max(float((a - b).abs().max()) for a, b in zip(on_xla, on_cpu, strict=True))
    json.dump(summary, sys.stdout)


if __name__ == "__main__":
    main()
