"""Where this process trains: the engine, the number of replicas, this replica's rank, and
the devices one replica spans.

Every PyTorch adapter asks here; users read it as ``aikit.elastic.Torch.distributed`` (the same
module). The answers are those of the engine :func:`current` detects
(:mod:`aikit.runtime.Torch.engines`: an initialised torch.distributed group, then an initialised
Horovod, then torch_xla, then torchrun's environment variables, else one process); the hosts of
eth-easl's multi-host XLA scheme and the devices of an XLA SPMD process are torch_xla's, as
the engine package hands them over (:func:`hosts`, :func:`spmd_devices`).
"""

from __future__ import annotations

from types import ModuleType

from aikit.runtime.Torch import engines
from aikit.runtime.Torch.engines import current, horovod_torch, hosts, spmd_devices  # noqa: F401  (public here too)

ENGINES = tuple(each.name for each in engines.ENGINES)
"""The names :func:`engine` returns, in the order detection asks."""


def horovod() -> ModuleType | None:
    """The ``horovod.torch`` module when the user imported and initialised it, else None."""
    return horovod_torch()


def engine() -> str:
    """The data-parallel engine of this process, one of :data:`ENGINES`."""
    return current().name


def world_size() -> int:
    """Number of replicas: training processes (1 for a single process, with or without
    DataParallel, and for an SPMD process), or XLA replicas over all hosts."""
    return current().world_size()


def rank() -> int:
    """Global rank of this process (0 for a single process)."""
    return current().rank()


def local_rank() -> int:
    """Rank of this process on its machine: the GPU it should use (0 for a single process)."""
    return current().local_rank()


def device_count() -> int:
    """Devices this run trains on: one per process under a multi-process engine, one per XLA
    replica, the mesh's data axis under SPMD; for a single process every visible GPU
    (``torch.nn.DataParallel`` uses them all), or 1 on CPU."""
    return current().device_count()
