"""Elastic PyTorch training: ``init(global_batch_size, max_device_batch)`` plans the run.

The device count comes from where the script runs (see :mod:`aikit.runtime.Torch.distributed`,
also importable as ``aikit.elastic.Torch.distributed``, as :mod:`aikit.runtime.Torch.spmd` is as
``aikit.elastic.Torch.spmd``) or from ``gpus=``; the core plan decides GA steps and
micro-batches, and this module then has ``steps``, ``batch_size``, ``global_batch_size``,
``gpus``, ``master`` and ``plan``. ``init(G, "auto", trial=step)`` finds the largest per-device
batch that fits (:mod:`aikit.elastic.Torch.auto_batch`).
"""

from __future__ import annotations

from aikit.optional import torch  # noqa: F401  isort: skip  (first: a missing torch names its extra)
import sys
from collections.abc import Callable, Iterable
from typing import Any

import aikit.ga.Torch  # noqa: F401  (the seed writes aikit.ga.Torch.optim.Optimizer after this import)
from aikit.core.errors import InvalidState, InvalidValue
from aikit.core.plan import Plan, devices_here, make_plan, nearest_even_batches
from aikit.core.validate import positive_int
from aikit.elastic.Torch.adaptive import AdaptiveOptimizer, AdaptiveSampler
from aikit.elastic.Torch.auto_batch import AutoBatch, find_device_batch
from aikit.elastic.Torch.eth_easl import (  # eth-easl's variable batch size, by its names (the edge)
    AdaScaleOptimizer,
    ConstantOptimizer,
    CustomOptimizer,
    CustomSampler,
    LinearRuleMomentumOptimizer,
    LinearRuleOptimizer,
    RootRuleOptimizer,
    SeesawOptimizer,
)
from aikit.elastic.Torch.resize import ElasticState
from aikit.elastic.Torch.sampler import TraceSampler
from aikit.elastic.Torch.trace_optim import TraceOptimizer
from aikit.runtime.originals import max_device_batch_of
from aikit.runtime.process import PUBLIC, publish
from aikit.runtime.Torch import distributed, spmd

__all__ = [
    "AdaScaleOptimizer",
    "AdaptiveOptimizer",
    "AdaptiveSampler",
    "AutoBatch",
    "ConstantOptimizer",
    "CustomOptimizer",
    "CustomSampler",
    "ElasticState",
    "LinearRuleMomentumOptimizer",
    "LinearRuleOptimizer",
    "RootRuleOptimizer",
    "SeesawOptimizer",
    "TraceOptimizer",
    "TraceSampler",
    "distributed",
    "init",
    "spmd",
    "summary",
]


def init(global_batch_size: int, max_device_batch: int | str | None = None, gpus: int | None = None,
         policy: str = "ragged", *, max_gpu_batch_size: int | None = None,
         trial: Callable[[int], Any] | None = None, candidates: Iterable[int] | None = None) -> Plan:
    """Plan how ``global_batch_size`` samples per update run here, at most
    ``max_device_batch`` per device (Run:AI's AIkit Elastic's ``max_gpu_batch_size``, accepted by
    that name too), and publish the plan on this module. Under torch_xla's
    SPMD the devices are the mesh's data axis and the split must be even (one shard shape);
    each GA step then feeds ``batch_size x gpus`` samples, sharded by
    :func:`aikit.runtime.Torch.spmd.shard`.

    ``gpus`` picks how many of the devices found to use (one process with several GPUs, for
    DataParallel); more than this machine has is refused: ``aikit plan --gpus N`` or
    :func:`aikit.core.plan.make_plan` plan for another machine.

    ``max_device_batch="auto"`` finds it: ``trial(batch)`` (one forward and backward of yours at
    that per-device batch, on the largest inputs the run will see) runs at each plan's device
    batch (or each of ``candidates``), largest first, until one does not run out of memory; every
    replica runs the smallest any found (:mod:`aikit.elastic.Torch.auto_batch`; the search is
    logged and kept as ``aikit.elastic.Torch.search``)."""
    g = positive_int(global_batch_size, "global_batch_size")
    auto = isinstance(max_device_batch, str) and max_device_batch.strip().lower() == "auto"
    if auto and max_device_batch != "auto":
        raise InvalidValue(f"max_device_batch={max_device_batch!r}: write max_device_batch='auto' (lower case, with "
                           "trial=, a function that runs one forward and backward of yours at a per-device batch it "
                           "is given)")
    m = g if auto else max_device_batch_of(max_device_batch, max_gpu_batch_size)
    processes = distributed.world_size()
    if processes > 1 and gpus is not None and positive_int(gpus, "gpus") != processes:
        raise InvalidValue(
            f"gpus={gpus} but this run has {processes} processes ({distributed.engine()}): "
            f"every process is one device, so leave gpus=None or launch {gpus} processes"
        )
    devices = devices_here(gpus, distributed.device_count(), distributed.current().label, g, m)
    found = {}
    if auto:
        m, found["search"] = find_device_batch(g, devices, policy, trial, candidates)
    elif trial is not None or candidates is not None:
        raise InvalidValue(f"trial= and candidates= are for max_device_batch='auto', but max_device_batch={m}: "
                           "leave them out, or pass max_device_batch='auto'")
    plan = make_plan(g, m, devices, policy=policy, rank=distributed.rank())
    if processes > 1 and plan.num_replicas != processes:
        launch = f"launch {plan.num_replicas} process{'es' if plan.num_replicas > 1 else ''}"
        fix = (f"use global_batch_size {processes} or more, or {launch}" if g < processes  # no policy can help
               else f"{launch} or use policy 'ragged'")
        raise InvalidValue(
            f"the plan uses {plan.num_replicas} of the {processes} processes (policy {policy!r}, "
            f"global_batch_size {plan.global_batch_size}), but every process of a "
            f"{distributed.engine()} run must train on at least one sample per update: {fix}"
        )
    if distributed.spmd_devices() > 1 and not (plan.is_even and plan.num_replicas == devices):
        below, above = nearest_even_batches(plan.global_batch_size, plan.max_device_batch, devices)
        raise InvalidValue(
            f"global_batch_size {plan.global_batch_size} does not split evenly over the {devices} devices of the "
            f"SPMD mesh with at most {plan.max_device_batch} samples each (every device gets one shard of the "
            f"same shape): use global_batch_size {below} or {above}"
        )
    publish(plan, sys.modules[__name__], **found)
    return plan


def summary() -> str:
    """The plan in a few readable lines, and the engine it runs on."""
    plan = sys.modules[__name__].__dict__.get("plan")
    if plan is None:
        raise InvalidState("call aikit.elastic.Torch.init(global_batch_size, max_device_batch) first")
    return f"{plan.summary()}\n  engine: {distributed.engine()} ({distributed.world_size()} process(es))"


def __getattr__(name: str):
    if name in (*PUBLIC, "plan"):
        raise AttributeError(
            f"aikit.elastic.Torch.{name} is set by init(): call "
            "aikit.elastic.Torch.init(global_batch_size, max_device_batch) first"
        )
    raise AttributeError(f"module 'aikit.elastic.Torch' has no attribute {name!r}")
