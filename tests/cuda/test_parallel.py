"""The parallel wrappers on one device: DataParallel on one GPU (the seed's recipe, planned by
``init``), and a world of one process (NCCL on CUDA, gloo on the CPU) through DDP and FSDP2 with
token weights and clipping: each equals the big batch, and the gradients sync once per update."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from gpu_case import (
    big_batch_run,
    exact,
    first_update_gradient,
    gradient_tolerance,
    mlp,
    regression,
    relative_error,
    token_batches,
    token_loss,
    token_model,
    tokens,
    tolerance,
    twin,
    whole,
)

import aikit.elastic.Torch
from aikit.core.plan import micro_batch_slices
from aikit.ga.Torch.optim import Optimizer

pytestmark = pytest.mark.cuda

UPDATES = 2


def test_dataparallel_on_one_gpu_follows_the_plan_and_equals_the_big_batch(cuda_device):
    plan = aikit.elastic.Torch.init(32, 8)  # one process with GPUs: a device per GPU
    assert plan.gpus == aikit.elastic.Torch.gpus == torch.cuda.device_count()
    assert plan.steps * plan.batch_size * plan.gpus == 32
    with exact(cuda_device) as dtype:
        x, y = regression(32 * UPDATES, cuda_device, dtype)
        model = mlp(cuda_device, dtype)
        reference = twin(model)
        inner = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        first = first_update_gradient(inner)
        optimizer = Optimizer(inner, aikit.elastic.Torch.steps)
        parallel = torch.nn.DataParallel(model)
        step = plan.batch_size * plan.gpus  # what the seed's loader yields: DataParallel scatters it
        for start in range(0, len(x), step):
            F.mse_loss(parallel(x[start:start + step]), y[start:start + step]).backward()
            optimizer.step()
        assert optimizer.applied == UPDATES
        updates = [[(x[i:i + 32], y[i:i + 32])] for i in range(0, len(x), 32)]
        expected = big_batch_run(reference, torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9),
                                 updates, F.mse_loss)
    assert relative_error(first, expected) < gradient_tolerance(dtype)
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want, **tolerance(dtype))


def train_one_world(device, dtype, wrap):
    """Two updates of ``init(8, 2)``'s plan (4 micro-steps of 2 sequences on a world of one),
    token-weighted, clipped, over ``wrap(model)``; returns the model, the reference, both first
    gradients and what ``after_micro_step(wrapped)`` saw after each micro-step."""
    plan = aikit.elastic.Torch.init(8, 2)
    assert (plan.gpus, plan.steps) == (1, 4)
    updates = [token_batches(device, dtype, micro_batches=1, sequences=8, seed=seed) for seed in range(UPDATES)]
    model = token_model(device, dtype)
    reference = twin(model)
    wrapped, after_micro_step = wrap(model)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = first_update_gradient(inner)
    optimizer = Optimizer(inner, plan.steps, max_grad_norm=1.0)
    seen = []
    for ((x, labels),) in updates:
        for piece in micro_batch_slices(plan, dist.get_rank()):
            with optimizer.accumulate(wrapped, weight=tokens(labels[piece])):
                token_loss(wrapped(x[piece]), labels[piece]).backward()
            seen.append(after_micro_step(wrapped))
            optimizer.step()
        assert optimizer.updated
    expected = big_batch_run(reference, torch.optim.AdamW(reference.parameters(), lr=1e-2), updates, token_loss,
                             max_grad_norm=1.0)
    return model, reference, first, expected, seen


def test_ddp_on_a_world_of_one_all_reduces_once_per_update_and_equals_the_big_batch(device, world_of_one):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    def wrap(model):
        ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        counted = {"all_reduces": 0}

        def counting(state, bucket):
            state["all_reduces"] += bucket.is_last()
            return default_hooks.allreduce_hook(None, bucket)

        ddp.register_comm_hook(counted, counting)
        return ddp, lambda _: counted["all_reduces"]

    with exact(device) as dtype:
        model, reference, first, expected, seen = train_one_world(device, dtype, wrap)
    assert seen == [0, 0, 0, 1, 1, 1, 1, 2]  # no_sync on every micro-step but an update's last
    assert relative_error(first, expected) < gradient_tolerance(dtype)
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want, **tolerance(dtype))


def test_fsdp2_on_a_world_of_one_syncs_once_per_update_and_equals_the_big_batch(device, world_of_one):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    def wrap(model):
        mesh = init_device_mesh(device.type, (1,))
        fully_shard(model.block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        # a sharded gradient appears only when FSDP2 reduces: kept unsharded until the update's last
        return model, lambda m: sum(p.grad is not None for p in m.parameters())

    with exact(device) as dtype:
        model, reference, first, expected, seen = train_one_world(device, dtype, wrap)
    params = len(list(model.parameters()))
    assert seen == [0, 0, 0, params] * UPDATES  # set_requires_gradient_sync(False) but on an update's last
    assert relative_error(first, expected) < gradient_tolerance(dtype)
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(whole(got), want, **tolerance(dtype))
