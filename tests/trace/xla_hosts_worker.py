"""One host of eth-easl's multi-host XLA scheme: a real process owning one XLA:CPU device, joined
to the other host over gloo. Run by tests/trace/test_xla_replicas.py with .venv-xla's python and
PJRT_DEVICE=CPU, CPU_NUM_DEVICES=1, MY_HOST_WORLD_SIZE=2, MY_HOST_ORDINAL, MY_DIST_ROOT.

Saves (NumPy, no pickle) what aikit detected, the results of a bare broadcast and all-reduce,
the parameters after every epoch of training through a cycling random trace, the samples this
host trained on, the compilations after every epoch, and the parameters of a second run that
stops in the middle of a step, is rebuilt from its state dicts, and finishes.
Usage: python xla_hosts_worker.py OUT_DIR SEED
"""

import sys
from pathlib import Path

import numpy as np
import torch
import torch_xla
import torch_xla.debug.metrics as met
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from trace_common import MINIBATCH, dataset, make_model, random_trace

from aikit.elastic.Torch import CustomSampler, LinearRuleOptimizer
from aikit.runtime.Torch import collectives, distributed

EPOCHS = 3


def float32_data() -> TensorDataset:
    x, y = dataset().tensors
    return TensorDataset(x.float(), y.float())  # the index column stays exact in float32


def build(seed: int, device: torch.device, data: TensorDataset, sizes: list[int], trace_seed: int):
    model = make_model(seed=seed).float().to(device)  # seeded per host: the hosts start apart
    with torch.no_grad():  # replica 0's weights everywhere (the optimizer may broadcast again: harmless)
        collectives.broadcast_(list(model.parameters()))
    sampler = CustomSampler(data, sizes, minibatch_size=MINIBATCH, seed=trace_seed, when_exhausted="cycle")
    inner = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    return model, sampler, LinearRuleOptimizer(inner, sampler, ref_batchsize=32)


def on_cpu(value):
    """A state dict with every tensor copied to host memory (what a checkpoint would hold)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, dict):
        return {key: on_cpu(item) for key, item in value.items()}
    if isinstance(value, list):
        return [on_cpu(item) for item in value]
    return value


def train_epoch(model, sampler, optimizer, data, device, epoch, samples=None, stop=None) -> bool:
    """One epoch (or up to ``stop(optimizer)``); returns True when it stopped early."""
    sampler.set_epoch(epoch)
    optimizer.set_epoch(epoch)
    for x, y in DataLoader(data, batch_sampler=sampler):
        if samples is not None:
            samples.extend((epoch, sampler.step, int(i)) for i in y[:, 1].tolist())
        nn.functional.mse_loss(model(x.to(device)), y[:, :1].to(device)).backward()
        optimizer.step()
        if stop is not None and stop(optimizer):
            return True
    return False


def main(out: Path, seed: int) -> None:
    device = torch_xla.device()
    rank = distributed.rank()
    data, sizes = float32_data(), random_trace(seed, len(dataset()))
    result = {"detected": np.array([distributed.engine() == "xla", distributed.world_size(), rank,
                                    distributed.device_count()])}

    # the bare collectives: the broadcast from replica 1 (not the gloo root), and a sum
    values = [torch.full((3,), float(rank + 1)).to(device), torch.tensor([10.0 * (rank + 1)]).to(device)]
    collectives.broadcast_(values, src=1)
    result["broadcast"] = torch.cat([v.cpu() for v in values]).numpy()
    total = [torch.tensor([rank + 1.0, 2.0]).to(device)]
    collectives.all_reduce_sum_(total)
    result["all_reduce"] = total[0].cpu().numpy()

    # 1. through the trace, uninterrupted
    model, sampler, optimizer = build(rank, device, data, sizes, seed)
    result["sampler_world"] = np.array([sampler.num_replicas, sampler.rank])
    samples, compiles = [], []
    for epoch in range(EPOCHS):
        train_epoch(model, sampler, optimizer, data, device, epoch, samples)
        compiles.append((met.metric_data("CompileTime") or [0])[0])
        for i, p in enumerate(model.parameters()):
            result[f"epoch{epoch}_param{i}"] = p.detach().cpu().numpy()
    result["samples"] = np.array(samples)
    result["compiles"] = np.array(compiles)
    result["updates"] = np.array(optimizer.updates)

    # 2. stop after the first micro-batch of a step both hosts have at least two of, rebuild
    # everything from the state dicts, finish: the same parameters
    plan = sampler.schedule.epoch(1)
    step = next(s for s in range(len(plan)) if plan.micro_batches_per_step[s] >= 4)
    model, sampler, optimizer = build(rank, device, data, sizes, seed)
    train_epoch(model, sampler, optimizer, data, device, 0)
    stopped = train_epoch(model, sampler, optimizer, data, device, 1,
                          stop=lambda o: (o.step_index, o.micro_step) == (step, 1))
    assert stopped
    saved = on_cpu({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
    model, sampler, optimizer = build(100 + rank, device, data, sizes, seed)  # a fresh process would
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    for epoch in range(1, EPOCHS):
        train_epoch(model, sampler, optimizer, data, device, epoch)
    for i, p in enumerate(model.parameters()):
        result[f"resumed_param{i}"] = p.detach().cpu().numpy()
    result["resumed_at"] = np.array([1, step, 1])
    np.savez(out / f"host{rank}.npz", **result)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
