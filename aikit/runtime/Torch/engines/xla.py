"""torch_xla, once the program imported it (aikit never imports it: a program on XLA devices has);
tensors on an XLA device go through it whatever else runs.

torch_xla has two data-parallel worlds:

* **Replicas** (eth-easl's multi-host scheme): every host runs its own XLA world of
  ``torch_xla.runtime.world_size()`` local replicas, and ``MY_HOST_WORLD_SIZE`` hosts
  (``MY_HOST_ORDINAL`` is this one) are joined by a gloo group over TCP among their local
  ordinal 0 processes, met at ``MY_DIST_ROOT`` (``host:port`` of host 0). Replicas: hosts x
  local; rank: host x local + local ordinal. The group is aikit's own (torch.distributed's
  default group stays the user's), made by the first collective that needs it. An all-reduce
  sums on each host, sums across hosts on ordinal 0, and shares the result on each host with a
  second local sum in which the other ordinals contribute zeros; a broadcast goes from the
  source replica to its host's ordinal 0, across the hosts, and from each ordinal 0 to its host.
  A host that stops answering ends the wait after ``AIKIT_HOST_TIMEOUT`` seconds (default 1800,
  torch.distributed's default for gloo), as a named :class:`~aikit.core.errors.CollectiveError`.
* **SPMD** (``torch_xla.runtime.use_spmd()``): one process is one replica whose every
  micro-batch is sharded over the ``"data"`` axis of the device mesh
  (:mod:`aikit.runtime.Torch.spmd`); :func:`spmd_devices` says how many devices that axis has.
  Its devices are reduced over by the partitioner, so every collective is the identity there.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from datetime import timedelta
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from aikit.core.errors import InvalidState, InvalidValue
from aikit.runtime.Torch.engines.defaults import EngineDefaults
from aikit.runtime.Torch.engines.failure import named_failure
from aikit.runtime.Torch.engines.torch_distributed import buckets

HOST_TIMEOUT = timedelta(minutes=30)  # torch.distributed's default for gloo; AIKIT_HOST_TIMEOUT overrides it


def host_timeout() -> timedelta:
    """How long the XLA hosts' gloo group waits for a peer host: ``AIKIT_HOST_TIMEOUT`` seconds,
    else :data:`HOST_TIMEOUT`."""
    value = os.environ.get("AIKIT_HOST_TIMEOUT")
    if value is None:
        return HOST_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise InvalidValue(f"environment variable AIKIT_HOST_TIMEOUT={value!r} must be a number of seconds > 0, "
                           "how long the XLA hosts' gloo group waits for a peer host")
    return timedelta(seconds=seconds)


def _runtime() -> ModuleType | None:
    """``torch_xla.runtime`` when the program imported torch_xla, else None."""
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
    xr = _runtime()
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


def _local() -> int:
    """Replicas on this host: one for an SPMD process."""
    xr = _runtime()
    return 1 if xr.is_spmd() else xr.world_size()


def _hosts_failure(what: str):
    return named_failure(what, host_timeout(), "AIKIT_HOST_TIMEOUT", lambda: hosts()[::-1])  # this host of them


class XLAEngine(EngineDefaults):
    """torch_xla's replicas over eth-easl's hosts, or one SPMD process."""

    name = "xla"
    label = name
    lazy = True

    def __init__(self) -> None:
        self._host_group: dist.ProcessGroupGloo | None = None

    def in_use(self) -> bool:
        return _runtime() is not None

    def owns(self, device: torch.device) -> bool:
        return device.type == "xla"

    def _world(self) -> tuple[int, int]:
        """(replicas, rank): one per SPMD process, or hosts x local replicas."""
        xr = _runtime()
        if xr.is_spmd():
            spmd_devices()  # refuses multi-process SPMD
            return 1, 0
        count, host = hosts()
        local = xr.world_size()
        return count * local, host * local + xr.global_ordinal()

    def world_size(self) -> int:
        return self._world()[0]

    def rank(self) -> int:
        return self._world()[1]

    def local_rank(self) -> int:
        xr = _runtime()
        return 0 if xr.is_spmd() else xr.local_ordinal()

    def device_count(self) -> int:
        return self.world_size() * spmd_devices()

    def _hosts_group(self) -> dist.ProcessGroupGloo:
        """The gloo group of the hosts' local ordinal 0 processes (eth-easl's ``init_group``)."""
        if self._host_group is None:
            count, host = hosts()
            root = os.environ.get("MY_DIST_ROOT", "")
            address, _, port = root.rpartition(":")
            if not address or not port.isdigit():
                raise InvalidState(
                    f"MY_HOST_WORLD_SIZE={count} needs MY_DIST_ROOT=host:port of host 0 for the gloo group that "
                    f"joins the hosts, got {root!r}"
                )
            timeout = host_timeout()
            with _hosts_failure(f"joining the XLA hosts' gloo group at MY_DIST_ROOT={root}"):
                store = dist.TCPStore(address, int(port), count, is_master=host == 0, timeout=timeout)
                self._host_group = dist.ProcessGroupGloo(dist.PrefixStore("aikit-hosts", store), host, count, timeout)
        return self._host_group

    def _across_hosts(self, tensors: list[torch.Tensor], collective, what: str) -> None:
        """Run ``collective(group, flat_cpu_buffer)`` over the hosts' group on a copy of
        ``tensors`` (one flat host-memory buffer per dtype) and write the result back to their
        device."""
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

        for bucket in buckets(tensors):
            flat = _flatten_dense_tensors([tensor.detach().cpu() for tensor in bucket])
            group = self._hosts_group()
            with _hosts_failure(f"{what} across the XLA hosts"):
                collective(group, flat).wait()
            for tensor, result in zip(bucket, _unflatten_dense_tensors(flat, bucket), strict=True):
                tensor.copy_(result.to(tensor.device))

    def all_reduce_sum_(self, tensors: list[torch.Tensor]) -> None:
        import torch_xla.core.xla_model as xm
        import torch_xla.runtime as xr

        local = _local()
        if local > 1:
            xm.all_reduce(xm.REDUCE_SUM, tensors)
        if hosts()[0] > 1:
            if xr.global_ordinal() == 0:
                self._across_hosts(tensors, lambda group, flat: group.allreduce(flat), "an all-reduce")
            else:
                for tensor in tensors:
                    tensor.zero_()
            if local > 1:
                xm.all_reduce(xm.REDUCE_SUM, tensors)

    def broadcast_(self, tensors: list[torch.Tensor], src: int) -> None:
        import torch_xla.core.xla_model as xm
        import torch_xla.runtime as xr

        local = _local()
        src_host, src_local = divmod(src, local)
        if local > 1:  # the source's value to its host's ordinal 0 (other hosts: overwritten below)
            xm.collective_broadcast(tensors, root_ordinal=src_local)
        if hosts()[0] > 1:
            if xr.global_ordinal() == 0:
                self._across_hosts(tensors, lambda group, flat: group.broadcast(flat, src_host), "a broadcast")
            if local > 1:
                xm.collective_broadcast(tensors, root_ordinal=0)

    def broadcast_object(self, obj: Any, what: str, src: int) -> Any:
        raise InvalidState(
            f"{what} over torch_xla's replicas: aikit's XLA collectives carry tensors only; broadcast "
            "the object's tensors with aikit.runtime.Torch.collectives.broadcast_"
        )

    def can_start_all_reduce(self) -> bool:
        return False

    def start_all_reduce_sum_(self, tensor: torch.Tensor, name: str) -> Callable[[], None]:
        raise InvalidState(f"the all-reduce of {name}: torch_xla cannot start one that overlaps the work that "
                           "follows (can_start_all_reduce() says so): sum it with all_reduce_sum_")

    def mark_step(self, device: torch.device) -> None:
        if self.owns(device):
            import torch_xla.core.xla_model as xm

            xm.mark_step()


XLA = XLAEngine()
