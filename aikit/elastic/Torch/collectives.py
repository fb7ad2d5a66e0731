"""The collectives trace-driven training needs, over whichever engine is running.

The engine is torch_xla when the tensors live on an XLA device; otherwise the one
:mod:`aikit.elastic.Torch.distributed` detects: ``torch.distributed`` (gloo on CPU, NCCL on
GPU), Horovod when the program initialised it, or a single process with nothing to do.
No engine is imported here unless it is in use.

Multi-host TPU follows eth-easl's variable batch size emulation: every host runs its own XLA
world of local devices, and the hosts are joined by a gloo group over TCP among their local
ordinal 0 processes, configured by
``MY_HOST_WORLD_SIZE``, ``MY_HOST_ORDINAL`` and ``MY_DIST_ROOT`` (``host:port`` of host 0).
An all-reduce then sums on each host, sums across hosts on ordinal 0, and shares the result
on each host with a second local sum in which the other ordinals contribute zeros.
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict

import torch
import torch.distributed as dist

from aikit.elastic.Torch import distributed


def _hosts() -> tuple[int, int]:
    """(number of hosts, this host's ordinal) from eth-easl's variable batch size environment variables."""
    hosts, host = int(os.environ.get("MY_HOST_WORLD_SIZE", "1")), int(os.environ.get("MY_HOST_ORDINAL", "0"))
    if hosts < 1 or not 0 <= host < hosts:
        raise ValueError(
            f"MY_HOST_ORDINAL={host} must lie in 0..MY_HOST_WORLD_SIZE-1 and MY_HOST_WORLD_SIZE={hosts} be "
            ">= 1: set them to this host's index and the number of hosts"
        )
    return hosts, host


def engine(device: torch.device | str | None = None) -> str:
    """The engine collectives on ``device`` go through: "xla" for tensors on an XLA device, else
    :func:`aikit.elastic.Torch.distributed.engine` ("torch.distributed", "horovod", "single")."""
    if device is not None and torch.device(device).type == "xla":
        return "xla"
    return distributed.engine()


def world(device: torch.device | str | None = None) -> tuple[int, int]:
    """(replicas, this replica's rank): torch_xla's world (times the hosts of eth-easl's multi-host scheme)
    when ``device`` is an XLA device or, with no device given, torch_xla is imported; else the
    world of :mod:`aikit.elastic.Torch.distributed`."""
    if engine(device) == "xla" or (device is None and "torch_xla" in sys.modules):
        import torch_xla.runtime as xr

        hosts, host = _hosts()
        local = xr.world_size()
        return hosts * local, host * local + xr.global_ordinal()
    return distributed.world_size(), distributed.rank()


def _buckets(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Tensors grouped by (device, dtype), so each group travels as one flat buffer."""
    groups: dict[tuple, list[torch.Tensor]] = defaultdict(list)
    for tensor in tensors:
        groups[tensor.device, tensor.dtype].append(tensor)
    return list(groups.values())


def _torch_all_reduce_(tensors: list[torch.Tensor], group=None) -> None:
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    for bucket in _buckets(tensors):
        flat = _flatten_dense_tensors(bucket)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        for tensor, reduced in zip(bucket, _unflatten_dense_tensors(flat, bucket), strict=True):
            tensor.copy_(reduced)


_host_group_ready = False


def _init_host_group() -> None:
    """Join the hosts' local ordinal 0 processes in a gloo group (eth-easl's ``init_group``)."""
    global _host_group_ready
    if not _host_group_ready:
        hosts, host = _hosts()
        root = os.environ.get("MY_DIST_ROOT")
        if not root:
            raise RuntimeError(
                f"MY_HOST_WORLD_SIZE={hosts} needs MY_DIST_ROOT=host:port of host 0 for the gloo group "
                "that joins the hosts"
            )
        dist.init_process_group("gloo", init_method=f"tcp://{root}", world_size=hosts, rank=host)
        _host_group_ready = True


def _xla_all_reduce_(tensors: list[torch.Tensor]) -> None:
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    local = xr.world_size()
    if local > 1:
        xm.all_reduce(xm.REDUCE_SUM, tensors)
    if _hosts()[0] > 1:
        if xr.global_ordinal() == 0:
            _init_host_group()
            on_cpu = [tensor.cpu() for tensor in tensors]
            _torch_all_reduce_(on_cpu)
            for tensor, reduced in zip(tensors, on_cpu, strict=True):
                tensor.copy_(reduced.to(tensor.device))
        else:
            for tensor in tensors:
                tensor.zero_()
        if local > 1:
            xm.all_reduce(xm.REDUCE_SUM, tensors)


def _horovod():
    import horovod.torch as hvd  # only reached when the program initialised it

    return hvd


def _checked(kind: str) -> str:
    if kind == "torch.distributed" and not dist.is_initialized():
        raise RuntimeError(
            f"this process runs under torchrun (WORLD_SIZE={distributed.world_size()}) but no process group "
            "is initialised: call torch.distributed.init_process_group('gloo' or 'nccl') before training, "
            "or the replicas would train apart"
        )
    return kind


def all_reduce_sum_(tensors: list[torch.Tensor]) -> None:
    """Replace every tensor by its sum over all replicas, in place.

    Every replica must pass tensors of the same shapes in the same order.
    """
    if not tensors:
        return
    kind = _checked(engine(tensors[0].device))
    if kind == "xla":
        _xla_all_reduce_(tensors)
    elif kind == "horovod" and _horovod().size() > 1:
        _horovod().grouped_allreduce_(tensors, op=_horovod().Sum)
    elif kind == "torch.distributed" and dist.get_world_size() > 1:
        _torch_all_reduce_(tensors)


def broadcast_(tensors: list[torch.Tensor], src: int = 0) -> None:
    """Overwrite every tensor with replica ``src``'s value, in place: replicas start equal."""
    if not tensors:
        return
    kind = _checked(engine(tensors[0].device))
    if kind == "xla":
        import torch_xla.core.xla_model as xm
        import torch_xla.runtime as xr

        if _hosts()[0] > 1:
            raise NotImplementedError("broadcast across TPU hosts is not supported: seed every host's model alike")
        if xr.world_size() > 1:
            xm.collective_broadcast(tensors, root_ordinal=src)
    elif kind == "horovod" and _horovod().size() > 1:
        for tensor in tensors:
            _horovod().broadcast_(tensor, root_rank=src)
    elif kind == "torch.distributed" and dist.get_world_size() > 1:
        for tensor in tensors:
            dist.broadcast(tensor, src=src)


def mark_step(device: torch.device | str) -> None:
    """Cut the lazy XLA graph here (a no-op elsewhere), so each step compiles to one cached graph."""
    if torch.device(device).type == "xla":
        import torch_xla.core.xla_model as xm

        xm.mark_step()
