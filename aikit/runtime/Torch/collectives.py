"""The collectives aikit's adapters need (sum and broadcast in place), over whichever engine is running.

The engine is torch_xla when the tensors live on an XLA device; otherwise the one
:mod:`aikit.runtime.Torch.distributed` detects: ``torch.distributed`` (gloo on CPU, NCCL on
GPU), Horovod when the program initialised it, or a single process with nothing to do.
No engine is imported here unless it is in use.

Multi-host XLA follows eth-easl's scheme: every host runs its own XLA world of local devices,
and the hosts are joined by a gloo group over TCP among their local ordinal 0 processes,
configured by ``MY_HOST_WORLD_SIZE``, ``MY_HOST_ORDINAL`` and ``MY_DIST_ROOT`` (``host:port`` of
host 0). The group is aikit's own (not torch.distributed's default group, which stays the
user's), made by the first collective that needs it. An all-reduce sums on each host, sums
across hosts on ordinal 0, and shares the result on each host with a second local sum in which
the other ordinals contribute zeros; a broadcast goes from the source replica to its host's
ordinal 0, across the hosts, and from each ordinal 0 to its host.

An SPMD process is one replica (its devices are reduced over by the partitioner), so every
collective here is the identity there.

A collective waits for every peer. When one is gone (its process killed, its host down) or
cannot be reached (its link down), a torch.distributed collective fails after at most the
process group's timeout (``init_process_group(timeout=...)``; at once when the peer's
connection closes), and the XLA hosts' group after ``AIKIT_HOST_TIMEOUT`` seconds (default
1800, torch.distributed's default for gloo). Either failure is raised as a
:class:`~aikit.core.errors.CollectiveError` naming the collective, the rank, the time waited
and the timeout, with the engine's error as its cause. Horovod's errors pass through
unchanged: ``hvd.elastic.run`` acts on its own ``HorovodInternalError``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import timedelta

import torch
import torch.distributed as dist

from aikit.core.errors import AikitError, CollectiveError, InvalidState, InvalidValue
from aikit.runtime.Torch import distributed

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


def _reason(error: BaseException) -> str:
    text = str(error)
    if "Timed out" in text or "timed out" in text or "Timeout" in text:
        return "no answer within the timeout: a peer is stuck, or its host or its link is down"
    if any(words in text for words in ("closed by peer", "Connection reset", "Broken pipe", "Connection refused")):
        return "a peer's connection closed: its process or its host died"
    return "a peer failed"


@contextlib.contextmanager
def named_failure(what: str, timeout: timedelta | None, setting: str) -> Iterator[None]:
    """Raise a failure of the collective ``what`` inside the block as a :class:`CollectiveError`
    that names it, this rank, the time it waited, the ``timeout`` bounding the wait and the
    ``setting`` that sets it (the engine's error is its cause)."""
    started = time.monotonic()
    try:
        yield
    except RuntimeError as error:
        if isinstance(error, AikitError):
            raise
        waited = time.monotonic() - started
        bound = f"{timeout.total_seconds():g} s" if timeout is not None else "not known"
        raise CollectiveError(
            f"{what} failed on rank {distributed.rank()} of {distributed.world_size()} after {waited:.1f} s: "
            f"{_reason(error)} (the wait is bounded by {setting}, {bound} here; docs/resize.md, Several hosts). "
            f"The engine said: {str(error).strip()[:500]}"
        ) from error


def _torch_failure(what: str):
    return named_failure(f"{what} over torch.distributed", process_group_timeout(),
                         "init_process_group(timeout=...)")


def engine(device: torch.device | str | None = None) -> str:
    """The engine collectives on ``device`` go through: "xla" for tensors on an XLA device, else
    :func:`aikit.runtime.Torch.distributed.engine`."""
    if device is not None and torch.device(device).type == "xla":
        return "xla"
    return distributed.engine()


def world(device: torch.device | str | None = None) -> tuple[int, int]:
    """(replicas, this replica's rank), as :mod:`aikit.runtime.Torch.distributed` detects them
    (``device`` is accepted for callers that have one; the world does not depend on it)."""
    return distributed.world_size(), distributed.rank()


def _buckets(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Tensors grouped by (device, dtype), so each group travels as one flat buffer."""
    groups: dict[tuple, list[torch.Tensor]] = defaultdict(list)
    for tensor in tensors:
        groups[tensor.device, tensor.dtype].append(tensor)
    return list(groups.values())


def _torch_all_reduce_(tensors: list[torch.Tensor]) -> None:
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    for bucket in _buckets(tensors):
        flat = _flatten_dense_tensors(bucket)
        with _torch_failure(f"an all-reduce of {len(bucket)} tensor(s)"):
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        for tensor, reduced in zip(bucket, _unflatten_dense_tensors(flat, bucket), strict=True):
            tensor.copy_(reduced)


_host_group: dist.ProcessGroupGloo | None = None


def _hosts_group() -> dist.ProcessGroupGloo:
    """The gloo group of the hosts' local ordinal 0 processes (eth-easl's ``init_group``)."""
    global _host_group
    if _host_group is None:
        hosts, host = distributed.hosts()
        root = os.environ.get("MY_DIST_ROOT", "")
        address, _, port = root.rpartition(":")
        if not address or not port.isdigit():
            raise InvalidState(
                f"MY_HOST_WORLD_SIZE={hosts} needs MY_DIST_ROOT=host:port of host 0 for the gloo group that "
                f"joins the hosts, got {root!r}"
            )
        timeout = host_timeout()
        with _hosts_failure(f"joining the XLA hosts' gloo group at MY_DIST_ROOT={root}"):
            store = dist.TCPStore(address, int(port), hosts, is_master=host == 0, timeout=timeout)
            _host_group = dist.ProcessGroupGloo(dist.PrefixStore("aikit-hosts", store), host, hosts, timeout)
    return _host_group


def _hosts_failure(what: str):
    return named_failure(what, host_timeout(), "AIKIT_HOST_TIMEOUT")


def _across_hosts(tensors: list[torch.Tensor], collective, what: str) -> None:
    """Run ``collective(flat_cpu_buffer)`` over the host group on a copy of ``tensors`` (one
    flat host-memory buffer per dtype) and write the result back to their device."""
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    for bucket in _buckets(tensors):
        flat = _flatten_dense_tensors([tensor.detach().cpu() for tensor in bucket])
        group = _hosts_group()
        with _hosts_failure(f"{what} across the XLA hosts"):
            collective(group, flat).wait()
        for tensor, result in zip(bucket, _unflatten_dense_tensors(flat, bucket), strict=True):
            tensor.copy_(result.to(tensor.device))


def _xla_all_reduce_(tensors: list[torch.Tensor]) -> None:
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    local = 1 if xr.is_spmd() else xr.world_size()
    if local > 1:
        xm.all_reduce(xm.REDUCE_SUM, tensors)
    if distributed.hosts()[0] > 1:
        if xr.global_ordinal() == 0:
            _across_hosts(tensors, lambda group, flat: group.allreduce(flat), "an all-reduce")
        else:
            for tensor in tensors:
                tensor.zero_()
        if local > 1:
            xm.all_reduce(xm.REDUCE_SUM, tensors)


def _xla_broadcast_(tensors: list[torch.Tensor], src: int) -> None:
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    local = 1 if xr.is_spmd() else xr.world_size()
    src_host, src_local = divmod(src, local)
    if local > 1:  # the source's value to its host's ordinal 0 (other hosts: overwritten below)
        xm.collective_broadcast(tensors, root_ordinal=src_local)
    if distributed.hosts()[0] > 1:
        if xr.global_ordinal() == 0:
            _across_hosts(tensors, lambda group, flat: group.broadcast(flat, src_host), "a broadcast")
        if local > 1:
            xm.collective_broadcast(tensors, root_ordinal=0)


def _checked(kind: str) -> str:
    if kind == "torch.distributed" and not dist.is_initialized():
        raise InvalidState(
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
    kind, hvd = _checked(engine(tensors[0].device)), distributed.horovod()
    if kind == "xla":
        _xla_all_reduce_(tensors)
    elif kind == "horovod" and hvd.size() > 1:
        hvd.grouped_allreduce_(tensors, op=hvd.Sum)
    elif kind == "torch.distributed" and dist.get_world_size() > 1:
        _torch_all_reduce_(tensors)


def can_start_all_reduce(device: torch.device | str) -> bool:
    """Whether :func:`start_all_reduce_sum_` works for tensors on ``device``: Horovod or
    torch.distributed with more than one replica (not XLA, nor a single process)."""
    kind = engine(device)
    if kind == "horovod":
        return distributed.horovod().size() > 1
    return kind == "torch.distributed" and dist.is_initialized() and dist.get_world_size() > 1


def start_all_reduce_sum_(tensor: torch.Tensor, name: str) -> Callable[[], None]:
    """Start replacing ``tensor`` by its sum over all replicas, in place, without waiting (where
    :func:`can_start_all_reduce`); returns the function that waits for it.

    ``name`` identifies the all-reduce to Horovod, which matches them across ranks by name;
    torch.distributed matches them by order: every replica must start the same ones in the
    same order."""
    if engine(tensor.device) == "horovod":
        hvd = distributed.horovod()
        handle = hvd.allreduce_async_(tensor, op=hvd.Sum, name=name)
        return lambda: hvd.synchronize(handle)
    work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, async_op=True)

    def wait() -> None:
        with _torch_failure(f"the all-reduce of {name}"):
            work.wait()

    return wait


def broadcast_(tensors: list[torch.Tensor], src: int = 0) -> None:
    """Overwrite every tensor with replica ``src``'s value, in place: replicas start equal."""
    if not tensors:
        return
    kind, hvd = _checked(engine(tensors[0].device)), distributed.horovod()
    if kind == "xla":
        _xla_broadcast_(tensors, src)
    elif kind == "horovod" and hvd.size() > 1:
        for tensor in tensors:
            hvd.broadcast_(tensor, root_rank=src)
    elif kind == "torch.distributed" and dist.get_world_size() > 1:
        with _torch_failure(f"a broadcast of {len(tensors)} tensor(s) from rank {src}"):
            for tensor in tensors:
                dist.broadcast(tensor, src=src)


def broadcast_object(obj, what: str = "a broadcast of a Python object", src: int = 0):
    """Replica ``src``'s ``obj`` on every replica (torch.distributed or Horovod; a single
    process gets ``obj`` back). ``what`` names it in a :class:`CollectiveError`."""
    if distributed.world_size() == 1:
        return obj
    if _checked(distributed.engine()) == "horovod":
        return distributed.horovod().broadcast_object(obj, root_rank=src)
    box = [obj]
    with _torch_failure(what):
        dist.broadcast_object_list(box, src=src)
    return box[0]


def mark_step(device: torch.device | str) -> None:
    """Cut the lazy XLA graph here (a no-op elsewhere), so each step compiles to one cached graph."""
    if torch.device(device).type == "xla":
        import torch_xla.core.xla_model as xm

        xm.mark_step()


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
