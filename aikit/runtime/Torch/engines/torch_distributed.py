"""torch.distributed (gloo on CPU, NCCL on GPU): torchrun's processes, one replica each.

In use once the program called ``init_process_group`` (detection's first engine); launched
before that when torchrun's ``WORLD_SIZE`` is set, with the world and the rank read from
torchrun's variables and every collective refused (the replicas would train apart). A failed
wait on a peer ends after the process group's timeout (``init_process_group(timeout=...)``),
as a named :class:`~aikit.core.errors.CollectiveError`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from aikit.core.errors import InvalidState, InvalidValue
from aikit.runtime.Torch.engines.defaults import EngineDefaults
from aikit.runtime.Torch.engines.failure import named_failure


def torchrun_variable(name: str, default: int) -> int:
    """torchrun's environment variable ``name`` as a non-negative integer, ``default`` when unset."""
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise InvalidValue(
            f"environment variable {name}={value!r} is not an integer; torchrun sets it, "
            "so unset it or launch with torchrun"
        ) from None
    if number < 0:
        raise InvalidValue(f"environment variable {name}={value!r} must not be negative")
    return number


def process_group_timeout(group: dist.ProcessGroup | None = None) -> timedelta | None:
    """The timeout of a torch.distributed process group (the default one when None), or None
    where the backend does not say."""
    pg = group or dist.group.WORLD
    for device in ("cpu", "cuda"):
        try:
            return pg._get_backend(torch.device(device)).options._timeout
        except (AttributeError, RuntimeError, ValueError):
            continue
    return None


def buckets(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Tensors grouped by (device, dtype), so each group travels as one flat buffer."""
    groups: dict[tuple, list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault((tensor.device, tensor.dtype), []).append(tensor)
    return list(groups.values())


def _failure(what: str):
    return named_failure(f"{what} over torch.distributed", process_group_timeout(), "init_process_group(timeout=...)",
                         lambda: (TORCH_DISTRIBUTED.rank(), TORCH_DISTRIBUTED.world_size()))


class TorchDistributedEngine(EngineDefaults):
    """torch.distributed's default process group."""

    name = "torch.distributed"
    label = name

    def in_use(self) -> bool:
        return dist.is_available() and dist.is_initialized()

    def launched(self) -> bool:
        return "WORLD_SIZE" in os.environ

    def world_size(self) -> int:
        if self.in_use():
            return dist.get_world_size()
        size = torchrun_variable("WORLD_SIZE", 1)
        if size < 1:
            raise InvalidValue("environment variable WORLD_SIZE='0' must be at least 1")
        return size

    def rank(self) -> int:
        return dist.get_rank() if self.in_use() else torchrun_variable("RANK", 0)

    def local_rank(self) -> int:
        return torchrun_variable("LOCAL_RANK", 0)

    def device_count(self) -> int:
        return self.world_size()

    def _replicas(self) -> int:
        """The replicas a collective runs over, refused while only torchrun's variables say so."""
        if not dist.is_initialized():
            raise InvalidState(
                f"this process runs under torchrun (WORLD_SIZE={self.world_size()}) but no process group "
                "is initialised: call torch.distributed.init_process_group('gloo' or 'nccl') before training, "
                "or the replicas would train apart"
            )
        return dist.get_world_size()

    def all_reduce_sum_(self, tensors: list[torch.Tensor]) -> None:
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

        if self._replicas() == 1:
            return
        for bucket in buckets(tensors):
            flat = _flatten_dense_tensors(bucket)
            with _failure(f"an all-reduce of {len(bucket)} tensor(s)"):
                dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            for tensor, reduced in zip(bucket, _unflatten_dense_tensors(flat, bucket), strict=True):
                tensor.copy_(reduced)

    def broadcast_(self, tensors: list[torch.Tensor], src: int) -> None:
        if self._replicas() == 1:
            return
        with _failure(f"a broadcast of {len(tensors)} tensor(s) from rank {src}"):
            for tensor in tensors:
                dist.broadcast(tensor, src=src)

    def broadcast_object(self, obj: Any, what: str, src: int) -> Any:
        self._replicas()
        box = [obj]
        with _failure(what):
            dist.broadcast_object_list(box, src=src)
        return box[0]

    def can_start_all_reduce(self) -> bool:
        return dist.is_initialized() and dist.get_world_size() > 1

    def start_all_reduce_sum_(self, tensor: torch.Tensor, name: str) -> Callable[[], None]:
        work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, async_op=True)

        def wait() -> None:
            with _failure(f"the all-reduce of {name}"):
                work.wait()

        return wait


TORCH_DISTRIBUTED = TorchDistributedEngine()
