"""Where this process trains: the engine, the number of processes and this process's rank.

Every PyTorch adapter asks here, so detection lives in one place. The order matters: an
initialised ``torch.distributed`` group wins, then an initialised Horovod (only when the user
imported ``horovod.torch``; aikit never imports it), then torchrun's environment variables (a
script may call ``init()`` before ``init_process_group``), and otherwise one process.
"""

from __future__ import annotations

import os
import sys

import torch

ENGINES = ("torch.distributed", "horovod", "xla", "single")


def _dist_ready() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _horovod():
    """The ``horovod.torch`` module when the user imported and initialised it, else None."""
    hvd = sys.modules.get("horovod.torch")
    if hvd is None:
        return None
    try:
        return hvd if hvd.is_initialized() else None
    except (AttributeError, ValueError):
        return None


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ValueError(
            f"environment variable {name}={value!r} is not an integer; torchrun sets it, "
            "so unset it or launch with torchrun"
        ) from None
    if number < 0:
        raise ValueError(f"environment variable {name}={value!r} must not be negative")
    return number


def engine() -> str:
    """The data-parallel engine of this process, one of :data:`ENGINES`."""
    if _dist_ready():
        return "torch.distributed"
    if _horovod() is not None:
        return "horovod"
    if "WORLD_SIZE" in os.environ:
        return "torch.distributed"
    return "single"


def world_size() -> int:
    """Number of training processes (1 for a single process, with or without DataParallel)."""
    if _dist_ready():
        return torch.distributed.get_world_size()
    hvd = _horovod()
    if hvd is not None:
        return hvd.size()
    size = _env_int("WORLD_SIZE", 1)
    if size < 1:
        raise ValueError("environment variable WORLD_SIZE='0' must be at least 1")
    return size


def rank() -> int:
    """Global rank of this process (0 for a single process)."""
    if _dist_ready():
        return torch.distributed.get_rank()
    hvd = _horovod()
    if hvd is not None:
        return hvd.rank()
    return _env_int("RANK", 0)


def local_rank() -> int:
    """Rank of this process on its machine: the GPU it should use (0 for a single process)."""
    hvd = _horovod() if not _dist_ready() else None
    if hvd is not None:
        return hvd.local_rank()
    return _env_int("LOCAL_RANK", 0)


def device_count() -> int:
    """Devices this run trains on: one per process under a multi-process engine; for a single
    process every visible GPU (``torch.nn.DataParallel`` uses them all), or 1 on CPU."""
    if engine() != "single":
        return world_size()
    return max(torch.cuda.device_count(), 1)


def is_master() -> bool:
    """True on global rank 0 only (Run:AI's AIkit Elastic Horovod glue wrongly used the local rank)."""
    return rank() == 0
