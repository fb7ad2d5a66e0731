"""One rank of a 2-process run of the torch LRFinder: a DDP model under ``torchrun
--nproc-per-node 2`` (gloo), an FSDP2 model (``fully_shard``) under torchrun, Horovod's
``DistributedOptimizer`` under ``horovodrun -np 2 --gloo``, or a model on XLA:CPU in eth-easl's
two-host scheme (.venv-xla, MY_HOST_WORLD_SIZE=2) whose optimizer averages the gradients over
aikit's collectives first. aikit must detect each engine on its own.

The ranks start from different LRs and read different data. Every criterion call is
recorded (loss, samples, training or validating) with the LRs every optimizer step used, and
written with the history to ``<out>/rank<r>.json`` for tests/lr_finder/test_lr_finder_replicas.py.
Usage: torchrun --standalone --nproc-per-node 2 lr_finder_replicas_worker.py OUT_DIR [fsdp]
       horovodrun -np 2 -H localhost:2 --gloo python lr_finder_replicas_worker.py OUT_DIR horovod
       MY_HOST_WORLD_SIZE=2 MY_HOST_ORDINAL=h MY_DIST_ROOT=... python lr_finder_replicas_worker.py OUT_DIR xla
(the XLA environment has no matplotlib: there the worker neither plots nor writes a CSV)
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aikit.ga.Torch.optim import Optimizer as GAOptimizer
from aikit.lr_finder.Torch import LRFinder
from aikit.runtime.Torch import collectives, distributed


def loader(samples: int, seed: int, batch_size: int) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 3, generator=g, dtype=torch.float64)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True) ** 2), batch_size=batch_size)


def model_and_optimizer(engine: str, rank: int, accumulation_steps: int, ga_steps: int | None = None):
    """The same weights on every rank, its gradients averaged over the ranks by the engine
    (under torchrun, optionally through aikit's GA optimizer of ``ga_steps``)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1)).double()
    if engine == "xla":
        import torch_xla

        model.to(torch_xla.device())
        optimizer = torch.optim.SGD(model.parameters(), lr=[1e-4, 1e-3][rank], momentum=0.9)

        def average_gradients(opt, args, kwargs):
            gradients = [p.grad for p in model.parameters()]
            collectives.all_reduce_sum_(gradients)
            for gradient in gradients:
                gradient.div_(2)

        optimizer.register_step_pre_hook(average_gradients)
        return model, optimizer
    if engine == "horovod":
        import horovod.torch as hvd

        optimizer = torch.optim.SGD(model.parameters(), lr=[1e-4, 1e-3][rank], momentum=0.9)
        return model, hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                               backward_passes_per_step=accumulation_steps)
    if engine == "fsdp":
        from torch.distributed.fsdp import fully_shard

        model = fully_shard(model)
    else:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=[1e-4, 1e-3][rank], momentum=0.9)
    return model, optimizer if ga_steps is None else GAOptimizer(optimizer, ga_steps)


def whole(tensor: torch.Tensor) -> list[float]:
    """A parameter's values, gathered from its shards under FSDP2."""
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach().flatten().tolist()


def scenario(out: Path, engine: str, rank: int, name: str, val: DataLoader | None, accumulation_steps: int,
             ga_steps: int | None = None) -> dict:
    model, optimizer = model_and_optimizer(engine, rank, accumulation_steps, ga_steps)
    calls = []
    # the LR of the step after each criterion call, once per step (Horovod's optimizer runs the
    # step hooks twice: for its own class and for the torch class it extends)
    step_lrs = {}

    def record_lr(opt, args, kwargs):
        step_lrs.setdefault(len(calls), opt.param_groups[0]["lr"])

    optimizer.register_step_pre_hook(record_lr)

    def criterion(outputs, labels):
        loss = nn.functional.mse_loss(outputs, labels)
        calls.append({"loss": loss.item(), "samples": len(labels), "training": torch.is_grad_enabled()})
        return loss

    start = [whole(p) for p in model.parameters()]
    reduce_scatters = []  # FSDP2's, per range-test iteration: one per update, not per micro-batch
    scatter = dist.reduce_scatter_single if engine == "fsdp" else None
    if scatter is not None:
        dist.reduce_scatter_single = lambda *args, **kwargs: (reduce_scatters.append(len(calls)),
                                                              scatter(*args, **kwargs))[1]
    finder = LRFinder(model, optimizer, criterion)
    finder.range_test(loader(64, 10 + rank, 4), val_loader=val, end_lr=0.1, num_iter=6, smooth_f=0,
                      accumulation_steps=accumulation_steps, diverge_th=math.inf, progress_bar=False)
    if scatter is not None:
        dist.reduce_scatter_single = scatter
    ax, lr = (None, None) if engine == "xla" else finder.plot(skip_start=0, skip_end=0)
    if engine != "xla":
        finder.to_csv(out / f"{name}_rank{rank}.csv")
    return {
        "history": finder.history,
        "calls": calls,
        "step_lrs": list(step_lrs.values()),
        "drew": ax is not None,
        "suggested": lr,
        "weights": [whole(p) for p in model.parameters()],
        "reset_to_start": finder.reset() or [whole(p) for p in model.parameters()] == start,
        "reduce_scatters": reduce_scatters,
    }


def main(out: Path, engine: str) -> None:
    if engine == "horovod":
        import horovod.torch as hvd

        hvd.init()
    elif engine == "xla":
        import torch_xla  # noqa: F401  (imported: aikit detects XLA)
    else:
        dist.init_process_group("gloo")
    rank = distributed.rank()
    assert (distributed.engine(), distributed.world_size()) == ("torch.distributed" if engine == "fsdp" else engine, 2)
    results = {
        "train": scenario(out, engine, rank, "train", None, accumulation_steps=2),
        # rank 0 validates on 10 samples, rank 1 on 6: the loss is the mean over all 16
        "val": scenario(out, engine, rank, "val", loader([10, 6][rank], 20 + rank, 4), accumulation_steps=1),
    }
    if engine == "torch.distributed":  # through aikit's GA optimizer: the same updates as accumulation_steps=2
        results["ga"] = scenario(out, engine, rank, "ga", None, accumulation_steps=1, ga_steps=2)
    (out / f"rank{rank}.json").write_text(json.dumps(results))
    if engine in ("torch.distributed", "fsdp"):
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "torch.distributed")
