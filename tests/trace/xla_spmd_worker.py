"""SPMD data parallel on XLA:CPU: one process, CPU_NUM_DEVICES virtual devices on a "data" mesh.
Run by tests/trace/test_xla_replicas.py with .venv-xla's python and PJRT_DEVICE=CPU.

Saves (NumPy, no pickle) what aikit detected, the errors for a trace and a plan that do not
fill the mesh, the sharding of a micro-batch, the parameters after every epoch of trace
training, the samples trained, the compilations after every epoch, and the parameters after
one update of the GA wrapper planned by ``aikit.elastic.Torch.init``.
Usage: python xla_spmd_worker.py OUT_FILE SEED
"""

import sys
from pathlib import Path

import numpy as np
import torch
import torch_xla
import torch_xla.debug.metrics as met
import torch_xla.runtime as xr
from torch import nn
from torch.utils.data import DataLoader
from trace_common import MINIBATCH, make_model
from xla_hosts_worker import float32_data

import aikit.elastic.Torch as elastic
from aikit.elastic.Torch import CustomSampler, LinearRuleOptimizer, distributed, spmd
from aikit.ga.Torch.optim import Optimizer

EPOCHS = 3


def spmd_trace(seed: int, devices: int, steps: int = 24) -> list[int]:
    """Global batches of 1..3 micro-steps, each micro-step MINIBATCH samples per device."""
    return (np.random.default_rng(seed).integers(1, 4, size=steps) * MINIBATCH * devices).tolist()


def error(call) -> str:
    try:
        call()
    except ValueError as raised:
        return str(raised)
    return ""


def main(out: Path, seed: int) -> None:
    xr.use_spmd()
    mesh = spmd.data_mesh()
    devices, device = xr.global_runtime_device_count(), torch_xla.device()
    data = float32_data()
    result = {"detected": np.array([distributed.engine() == "xla", distributed.world_size(), distributed.rank(),
                                    distributed.spmd_devices(), distributed.device_count()])}
    unit = MINIBATCH * devices
    result["trace_error"] = np.array(error(lambda: CustomSampler(data, [unit, unit + MINIBATCH],
                                                                  minibatch_size=MINIBATCH)))
    result["plan_error"] = np.array(error(lambda: elastic.init(2 * unit + 1, MINIBATCH)))

    # 1. trace training: single-replica updates on global micro-batches sharded over the mesh
    model = make_model(seed=0).float().to(device)
    sampler = CustomSampler(data, spmd_trace(seed, devices), minibatch_size=MINIBATCH, seed=seed,
                            when_exhausted="cycle")
    result["trace"] = np.array(sampler.schedule.trace.sizes)
    result["sampler"] = np.array([sampler.num_replicas, sampler.rank, sampler.minibatch_size, sampler.devices])
    optimizer = LinearRuleOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3),
                                    sampler, ref_batchsize=32)
    samples, compiles, shapes = [], [], set()
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        optimizer.set_epoch(epoch)
        for x, y in DataLoader(data, batch_sampler=sampler):
            samples.extend((epoch, sampler.step, int(i)) for i in y[:, 1].tolist())
            x, y = spmd.shard((x, y), mesh)  # (reading a sharded slice back would compile every time)
            shapes.add(tuple(x.shape))
            if "sharding" not in result:
                result["sharding"] = np.array(torch_xla._XLAC._get_xla_sharding_spec(x))
            nn.functional.mse_loss(model(x), y[:, :1]).backward()
            optimizer.step()
        compiles.append((met.metric_data("CompileTime") or [0])[0])
        for i, p in enumerate(model.parameters()):
            result[f"epoch{epoch}_param{i}"] = p.detach().cpu().numpy()
    result["samples"], result["compiles"] = np.array(samples), np.array(compiles)
    result["shapes"], result["updates"] = np.array(sorted(shapes)), np.array(optimizer.updates)

    # 2. the GA wrapper as init() plans it: 2 steps of MINIBATCH per device, sharded
    plan = elastic.init(2 * unit, MINIBATCH)
    result["plan"] = np.array([plan.steps, plan.batch_size, plan.gpus])
    model = make_model(seed=0).float().to(device)
    ga = Optimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), elastic.steps)
    batches = DataLoader(data, batch_size=elastic.batch_size * elastic.gpus)
    for (x, y), _ in zip(spmd.loader(batches, mesh), range(elastic.steps), strict=False):
        nn.functional.mse_loss(model(x), y[:, :1]).backward()
        ga.step()
        ga.zero_grad()
    for i, p in enumerate(model.parameters()):
        result[f"ga_param{i}"] = p.detach().cpu().numpy()
    np.savez(out, **result)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
