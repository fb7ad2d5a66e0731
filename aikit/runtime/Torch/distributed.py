"""Where this process trains: the engine, the number of replicas, this replica's rank, and
the devices one replica spans.

Every PyTorch adapter asks here, so detection lives in one place; users read it as
``aikit.elastic.Torch.distributed`` (the same module). The order matters: an
initialised ``torch.distributed`` group wins, then an initialised Horovod (only when the user
imported ``horovod.torch``; aikit never imports it), then torch_xla (only when the user
imported it), then torchrun's environment variables (a script may call ``init()`` before
``init_process_group``), and otherwise one process.

torch_xla has two data-parallel worlds:

* **Replicas** (eth-easl's multi-host scheme): every host runs its own XLA world of
  ``torch_xla.runtime.world_size()`` local replicas, and ``MY_HOST_WORLD_SIZE`` hosts
  (``MY_HOST_ORDINAL`` is this one) are joined over gloo (see
  :mod:`aikit.runtime.Torch.collectives`). Replicas: hosts x local; rank: host x local +
  local ordinal.
* **SPMD** (``torch_xla.runtime.use_spmd()``): one process is one replica whose every
  micro-batch is sharded over the ``"data"`` axis of the device mesh
  (:mod:`aikit.runtime.Torch.spmd`); :func:`spmd_devices` says how many devices that axis has.
"""

from __future__ import annotations

import os
import sys

import torch

from aikit.core.errors import InvalidValue

ENGINES = ("torch.distributed", "horovod", "xla", "single")


def _dist_ready() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def horovod():
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
        raise InvalidValue(
            f"environment variable {name}={value!r} is not an integer; torchrun sets it, "
            "so unset it or launch with torchrun"
        ) from None
    if number < 0:
        raise InvalidValue(f"environment variable {name}={value!r} must not be negative")
    return number


def _xla_runtime():
    """``torch_xla.runtime`` when the program imported torch_xla, else None (aikit never
    imports it: a program on XLA devices has)."""
    if "torch_xla" not in sys.modules:
        return None
    import torch_xla.runtime as xr

    return xr


def hosts() -> tuple[int, int]:
    """(hosts, this host's ordinal) of eth-easl's multi-host scheme, from ``MY_HOST_WORLD_SIZE``
    and ``MY_HOST_ORDINAL`` ((1, 0) when unset)."""
    count, host = os.environ.get("MY_HOST_WORLD_SIZE", "1"), os.environ.get("MY_HOST_ORDINAL", "0")
    if not (count.isdigit() and host.isdigit() and 0 <= int(host) < int(count)):
        raise InvalidValue(
            f"MY_HOST_WORLD_SIZE={count!r} and MY_HOST_ORDINAL={host!r}: set them to the number of hosts (>= 1) "
            "and this host's index in 0..hosts-1"
        )
    return int(count), int(host)


def spmd_devices() -> int:
    """Devices an SPMD process shards each micro-batch over: the ``"data"`` axis of the global
    mesh (:func:`aikit.runtime.Torch.spmd.data_mesh` sets it), else every device; 1 outside
    SPMD."""
    xr = _xla_runtime()
    if xr is None or not xr.is_spmd():
        return 1
    if hosts()[0] > 1 or xr.process_count() > 1:
        raise InvalidValue(
            f"SPMD over {xr.process_count()} processes and MY_HOST_WORLD_SIZE={hosts()[0]} hosts: aikit's SPMD "
            "mode is one process over its local devices; use the multi-host scheme (one XLA world per host, "
            "without use_spmd()) to train on several hosts"
        )
    import torch_xla.distributed.spmd as xs

    mesh = xs.get_global_mesh()
    if mesh is None or "data" not in (mesh.axis_names or ()):
        return xr.global_runtime_device_count()
    return int(mesh.shape()["data"])


def _xla_world() -> tuple[int, int]:
    """(replicas, rank) of torch_xla: one per SPMD process, or hosts x local replicas."""
    xr = _xla_runtime()
    if xr.is_spmd():
        spmd_devices()  # refuses multi-process SPMD
        return 1, 0
    count, host = hosts()
    local = xr.world_size()
    return count * local, host * local + xr.global_ordinal()


def engine() -> str:
    """The data-parallel engine of this process, one of :data:`ENGINES`."""
    if _dist_ready():
        return "torch.distributed"
    if horovod() is not None:
        return "horovod"
    if _xla_runtime() is not None:
        return "xla"
    if "WORLD_SIZE" in os.environ:
        return "torch.distributed"
    return "single"


def world_size() -> int:
    """Number of replicas: training processes (1 for a single process, with or without
    DataParallel, and for an SPMD process), or XLA replicas over all hosts."""
    if _dist_ready():
        return torch.distributed.get_world_size()
    hvd = horovod()
    if hvd is not None:
        return hvd.size()
    if _xla_runtime() is not None:
        return _xla_world()[0]
    size = _env_int("WORLD_SIZE", 1)
    if size < 1:
        raise InvalidValue("environment variable WORLD_SIZE='0' must be at least 1")
    return size


def rank() -> int:
    """Global rank of this process (0 for a single process)."""
    if _dist_ready():
        return torch.distributed.get_rank()
    hvd = horovod()
    if hvd is not None:
        return hvd.rank()
    if _xla_runtime() is not None:
        return _xla_world()[1]
    return _env_int("RANK", 0)


def local_rank() -> int:
    """Rank of this process on its machine: the GPU it should use (0 for a single process)."""
    hvd = horovod() if not _dist_ready() else None
    if hvd is not None:
        return hvd.local_rank()
    if not _dist_ready() and _xla_runtime() is not None:
        return 0 if _xla_runtime().is_spmd() else _xla_runtime().local_ordinal()
    return _env_int("LOCAL_RANK", 0)


def device_count() -> int:
    """Devices this run trains on: one per process under a multi-process engine, one per XLA
    replica, the mesh's data axis under SPMD; for a single process every visible GPU
    (``torch.nn.DataParallel`` uses them all), or 1 on CPU."""
    if engine() == "xla":
        return world_size() * spmd_devices()
    if engine() != "single":
        return world_size()
    return max(torch.cuda.device_count(), 1)
