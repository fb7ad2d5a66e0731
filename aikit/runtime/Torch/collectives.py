"""The collectives aikit's adapters need (sum and broadcast in place), over whichever engine is running.

Tensors go through the engine :func:`aikit.runtime.Torch.engines.current` finds for their device:
torch_xla for tensors on an XLA device, otherwise the engine of this process
(:mod:`aikit.runtime.Torch.distributed`): TorchFT's replica groups (every update its own
quorum: :func:`membership`, :func:`commit`), torch.distributed (gloo on CPU, NCCL on GPU), Horovod
when the program initialised it, torch_xla's replicas over eth-easl's hosts or one SPMD process,
or a single process with nothing to do. No engine is imported here unless it is in use.

A collective waits for every peer. When one is gone or cannot be reached, a torch.distributed
collective fails after at most the process group's timeout, and the XLA hosts' group after
``AIKIT_HOST_TIMEOUT`` seconds: either as a :class:`~aikit.core.errors.CollectiveError` naming
the collective, the rank, the time waited and the timeout
(:func:`aikit.runtime.Torch.engines.failure.named_failure`). Horovod's
errors pass through unchanged: ``hvd.elastic.run`` acts on its own ``HorovodInternalError``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

from aikit.core.errors import UpdateAborted
from aikit.runtime.Torch import distributed, engines

T = TypeVar("T")


def engine(device: torch.device | str | None = None) -> str:
    """The name of the engine collectives on ``device`` go through: torch_xla's for tensors on an
    XLA device, else :func:`aikit.runtime.Torch.distributed.engine`."""
    return engines.current(device).name


def world(device: torch.device | str | None = None) -> tuple[int, int]:
    """(replicas, this replica's rank), as :mod:`aikit.runtime.Torch.distributed` detects them
    (``device`` is accepted for callers that have one; the world does not depend on it)."""
    return distributed.world_size(), distributed.rank()


def lazy(device: torch.device | str) -> bool:
    """Whether collectives on ``device`` run in a lazily traced graph (XLA): the update then cuts
    the graph before it reduces, reduces even on one replica, and reads nothing from the device
    to branch on (:attr:`aikit.runtime.Torch.engines.Engine.lazy`)."""
    return engines.current(device).lazy


def membership(device: torch.device | str | None = None) -> tuple[int, int]:
    """(replicas, this replica's rank) for the update about to be dealt: :func:`world`, or where
    every update has its own world (TorchFT), the update's quorum (:attr:`Engine.per_update`)."""
    return engines.current(device).membership()


def commit(device: torch.device | str | None = None) -> bool:
    """Whether the update just summed over the replicas may be applied: True, except where a
    quorum decides (TorchFT's ``should_commit()``); asked once per update, after its sum."""
    return engines.current(device).commit()


def reduce_and_commit(device: torch.device | str, reduce: Callable[[], T]) -> tuple[bool, T | None]:
    """``reduce()`` (an update's sum over the replicas), then whether the update may be applied
    (:func:`commit`): a sum that failed where a quorum decides (TorchFT: a replica group lost in
    the middle) is an update decided and not committed. Returns (committed, what ``reduce`` gave)."""
    try:
        summed = reduce()
        return commit(device), summed
    except UpdateAborted:  # raised after the engine decided the update
        return False, None


def per_update(device: torch.device | str | None = None) -> bool:
    """Whether every update has its own world (TorchFT): then no update is joined ahead of its quorum."""
    return engines.current(device).per_update


def all_reduce_sum_(tensors: list[torch.Tensor]) -> None:
    """Replace every tensor by its sum over all replicas, in place.

    Every replica must pass tensors of the same shapes in the same order.
    """
    if tensors:
        engines.current(tensors[0].device).all_reduce_sum_(tensors)


def can_start_all_reduce(device: torch.device | str) -> bool:
    """Whether :func:`start_all_reduce_sum_` works for tensors on ``device``: Horovod or
    torch.distributed with more than one replica (not XLA, nor a single process)."""
    return engines.current(device).can_start_all_reduce()


def start_all_reduce_sum_(tensor: torch.Tensor, name: str) -> Callable[[], None]:
    """Start replacing ``tensor`` by its sum over all replicas, in place, without waiting (where
    :func:`can_start_all_reduce`); returns the function that waits for it.

    ``name`` identifies the all-reduce to Horovod, which matches them across ranks by name;
    torch.distributed matches them by order: every replica must start the same ones in the
    same order."""
    return engines.current(tensor.device).start_all_reduce_sum_(tensor, name)


def broadcast_(tensors: list[torch.Tensor], src: int = 0) -> None:
    """Overwrite every tensor with replica ``src``'s value, in place: replicas start equal."""
    if tensors:
        engines.current(tensors[0].device).broadcast_(tensors, src)


def broadcast_object(obj: Any, what: str = "a broadcast of a Python object", src: int = 0) -> Any:
    """Replica ``src``'s ``obj`` on every replica (torch.distributed or Horovod; a single
    process gets ``obj`` back). ``what`` names it in a :class:`CollectiveError`."""
    if distributed.world_size() == 1:
        return obj
    return engines.current().broadcast_object(obj, what, src)


def mark_step(device: torch.device | str) -> None:
    """Cut the lazy XLA graph here (a no-op elsewhere), so each step compiles to one cached graph:
    only the engine that owns ``device`` has a graph to cut (asked at every micro-step, so no
    detection of the process's engine)."""
    engine = engines.owner(device)
    if engine is not None:
        engine.mark_step(torch.device(device))


def broadcast_gathering_(tensors: list[torch.Tensor], row: list[int], src: int = 0) -> list[list[int]]:
    """:func:`broadcast_` ``tensors`` from replica ``src`` and gather every replica's ``row``
    (numbers in 0..255, the same count on every replica), in one all-reduce: the other replicas
    add zeros to ``src``'s tensors (exact), and each fills its own row of a table of zeros.
    Returns the rows by rank. How replicas compare their settings without another round trip
    (:mod:`aikit.core.agreement`)."""
    replicas, rank = world()
    if not tensors or replicas == 1:
        broadcast_(tensors, src)
        return [list(row)]
    first = tensors[0]
    dtype = first.dtype if first.is_floating_point() else torch.float32
    table = torch.zeros(replicas, len(row), dtype=dtype, device=first.device)
    table[rank] = torch.tensor(row, dtype=dtype)
    if rank != src:
        for tensor in tensors:
            tensor.zero_()
    all_reduce_sum_([*tensors, table])
    return table.to(torch.int64).tolist()
