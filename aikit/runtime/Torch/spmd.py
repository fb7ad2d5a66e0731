"""SPMD data parallelism on torch_xla: one process, one replica, every micro-batch sharded.

In torch_xla's SPMD mode (``torch_xla.runtime.use_spmd()``) one process runs one program over
every device of a mesh. A batch sharded along its first dimension on the mesh's ``"data"`` axis
is split over those devices, the parameters stay replicated, and the XLA partitioner inserts
the gradient all-reduce. So aikit treats an SPMD process as *one replica*
(:func:`aikit.runtime.Torch.distributed.spmd_devices` detects the devices): ``TraceSampler``
yields global micro-batches of ``micro_batch x devices`` samples (``micro_batch``, eth-easl's
``minibatch_size``, stays per device, as in eth-easl's scheme), the trace optimizer and the GA
wrapper make single-replica updates, and :func:`shard` (or :func:`loader`) puts each global
micro-batch on the devices, ``micro_batch`` samples each. Every micro-step has one shape, so a
trace of any number of distinct batch sizes compiles a bounded number of graphs.

A step whose global batch is not a multiple of ``micro_batch x devices`` would leave devices
without samples in its last micro-step. Such traces are refused (by ``TraceSampler``, naming
the nearest valid sizes) rather than padded: padding needs dummy samples, which BatchNorm in
training mode would average into its statistics, and masking them out of every layer is not
something a wrapper can do for an arbitrary model.

Its public path is ``aikit.elastic.Torch.spmd`` (the same module)::

    import torch_xla
    import torch_xla.runtime as xr
    from aikit.elastic.Torch import TraceOptimizer, TraceSampler, spmd

    xr.use_spmd()                        # before anything touches an XLA device
    mesh = spmd.data_mesh()              # every device on the "data" axis
    sampler = TraceSampler(data, "trace.csv", micro_batch=32)   # 32 per device
    model = make_model().to(torch_xla.device())
    optimizer = TraceOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), sampler, ref_batch_size=256)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        optimizer.set_epoch(epoch)
        for x, y in spmd.loader(DataLoader(data, batch_sampler=sampler), mesh):
            loss_fn(model(x), y).backward()
            optimizer.step()
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from aikit.core.errors import InvalidState, InvalidValue
from aikit.core.trace import Trace, multiple_problems
from aikit.core.validate import positive_int

DATA_AXIS = "data"


def data_mesh():
    """A one-axis mesh named ``"data"`` over every device of this SPMD process, made torch_xla's
    global mesh (which :func:`shard` and the device detection then use). A mesh of your own
    with a ``"data"`` axis, set with ``torch_xla.distributed.spmd.set_global_mesh``, works too."""
    import numpy as np
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    if not xr.is_spmd():
        raise InvalidState(
            "torch_xla is not in SPMD mode: call torch_xla.runtime.use_spmd() at the start of the program, "
            "before any tensor is put on an XLA device"
        )
    devices = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.arange(devices), (devices,), (DATA_AXIS,))
    xs.set_global_mesh(mesh)
    return mesh


def micro_batch(trace: Trace, per_device: int, devices: int, name: str = "micro_batch") -> int:
    """The global micro-batch an SPMD process trains per micro-step, ``per_device x devices``;
    an InvalidValue (a ValueError) naming the nearest valid sizes when a step of ``trace`` would
    not fill every device. ``name``: what the caller called the per-device micro-batch."""
    if devices == 1:
        return per_device
    unit = positive_int(per_device, name) * devices
    problems = multiple_problems(trace, unit, f"{name} x SPMD devices ({per_device} x {devices} =)")
    if problems:
        shown = "\n  ".join(problems[:10])
        more = f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else ""
        raise InvalidValue(
            f"trace {trace.source} does not fill the {devices}-device SPMD mesh in every micro-step (a step that "
            f"leaves a device without samples would need dummy samples):\n  {shown}{more}"
        )
    return unit


def _mesh(mesh):
    if mesh is not None:
        return mesh
    import torch_xla.distributed.spmd as xs

    mesh = xs.get_global_mesh()
    if mesh is None:
        raise InvalidState("no mesh: call aikit.elastic.Torch.spmd.data_mesh() first, or pass mesh=")
    return mesh


def shard(batch: Any, mesh=None) -> Any:
    """``batch`` (a tensor, or a tuple, list or dict of them) on the XLA device, every tensor
    split along its first dimension over the mesh's ``"data"`` axis."""
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.spmd as xs

    mesh = _mesh(mesh)
    devices = int(mesh.shape()[DATA_AXIS])

    def place(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dim() == 0 or tensor.shape[0] % devices:
            raise InvalidValue(
                f"a batch of shape {tuple(tensor.shape)} cannot be split over the {devices} devices of the mesh's "
                f"'{DATA_AXIS}' axis: its first dimension must be a multiple of {devices} (TraceSampler's "
                "micro-batches are)"
            )
        spec = (DATA_AXIS,) + (None,) * (tensor.dim() - 1)
        if tensor.device.type == torch_xla.device().type:
            return xs.mark_sharding(tensor, mesh, spec).global_tensor
        # from host memory, each device receives only its shard (torch_xla's MpDeviceLoader path)
        sharding = xs.ShardingSpec(mesh, spec)
        return xm.send_cpu_data_to_device([tensor.cpu()], torch_xla.device(), input_sharding=sharding)[0]

    return _map_tensors(batch, place)


def loader(batches: Iterable, mesh=None) -> Iterator:
    """Every batch of ``batches`` (e.g. a DataLoader over a TraceSampler), :func:`shard`-ed."""
    mesh = _mesh(mesh)
    for batch in batches:
        yield shard(batch, mesh)


def _map_tensors(batch: Any, function) -> Any:
    if isinstance(batch, torch.Tensor):
        return function(batch)
    if isinstance(batch, dict):
        return {key: _map_tensors(value, function) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_map_tensors(value, function) for value in batch)
    return batch
