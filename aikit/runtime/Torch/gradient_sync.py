"""How a wrapped model syncs its gradients over replicas: one place, by model type.

DistributedDataParallel (and FSDP1) all-reduce in every backward unless it runs inside their
``no_sync()``; FSDP2 (``torch.distributed.fsdp.fully_shard``) reduce-scatters in every backward
unless ``set_requires_gradient_sync(False)``; a plain model syncs nothing. :func:`sync_skipper`
gives the context in which a backward syncs nothing, for the micro-steps of an update before its
last.

Between FSDP2's reduce-scatters the gradients accumulate in its unsharded parameters, out of the
optimizer's reach (its parameters are the shards): :func:`accumulates_out_of_reach` says so, and
the GA engine then weighs micro-batches at the model's outputs
(:mod:`aikit.runtime.Torch.output_weights`) rather than in ``.grad``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

try:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor
except ImportError:  # a torch built without distributed
    FSDPModule = DTensor = None


def is_fsdp2(model: torch.nn.Module | None) -> bool:
    """Whether ``model`` is a ``fully_shard`` module (FSDP2)."""
    return FSDPModule is not None and isinstance(model, FSDPModule)


def sync_skipper(model: torch.nn.Module | None) -> Callable[[], contextlib.AbstractContextManager] | None:
    """The context in which a backward of ``model`` syncs no gradients (DDP's ``no_sync``,
    FSDP2's ``set_requires_gradient_sync(False)``), or None where the model's backward syncs
    none anyway (a plain model, or no model)."""
    if is_fsdp2(model):
        return lambda: _fsdp2_no_sync(model)
    return getattr(model, "no_sync", None)


@contextlib.contextmanager
def _fsdp2_no_sync(model: torch.nn.Module) -> Iterator[None]:
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def is_shard(param: torch.Tensor) -> bool:
    """Whether ``param`` is a sharded parameter (FSDP2's DTensor): its ``.grad`` is set at the
    reduce-scatter, not by the micro-steps' backwards before it."""
    return DTensor is not None and isinstance(param, DTensor)


def accumulates_out_of_reach(model: torch.nn.Module | None) -> bool:
    """Whether ``model``'s gradients accumulate between syncs where the optimizer's ``.grad``
    is not (FSDP2's unsharded gradients): weights must be applied before they get there."""
    return is_fsdp2(model)
