"""Where a commit's tensors land in the kept objects, in the world that restores it.

A model sharded with FSDP2 holds DTensors: its commit is sharded (every rank writes its shards,
:mod:`aikit.elastic.Torch.sharded`), and restoring one reads, for each tensor, this rank's part
of it as the kept object lays it out now, in a world of any size. A replicated commit restored
into a sharded model gives each rank its part of the whole tensors rank 0 sent (a run that
outgrew DDP goes on with FSDP2). The tensor a saved entry loads into is its *template*: its
shape is checked before anything loads, its layout decides what this rank reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from aikit.core.errors import CheckpointError, InvalidValue
from aikit.elastic.Torch import checkpoint, sharded
from aikit.elastic.Torch.encoding import ShardedRef, resolve_refs, sharded_refs
from aikit.runtime.Torch.wrapping import WrappingOptimizer


def holds_dtensors(objects: Iterable) -> bool:
    """Whether a kept model or optimizer holds DTensors (a model sharded with FSDP2): then
    every rank writes its shards. The same answer on every rank (one model)."""
    dtensor = sharded.dtensor_type()
    return bool(dtensor) and any(isinstance(t, dtensor) for obj in objects for t in _tensors_of(obj))


def _tensors_of(obj) -> Iterator[torch.Tensor]:
    """A kept model's parameters and buffers, or a kept optimizer's parameters."""
    if isinstance(obj, torch.nn.Module):
        yield from obj.parameters()
        yield from obj.buffers()
    elif isinstance(obj, torch.optim.Optimizer):
        yield from (p for group in obj.param_groups for p in group["params"])


def template_at(obj, path: tuple) -> torch.Tensor | None:
    """The tensor of ``obj`` whose layout an entry at ``path`` of its saved state takes (sharded
    or whole): a model's entry of the same name, an optimizer state's parameter; None if none."""
    if isinstance(obj, torch.nn.Module) and len(path) == 1:
        return obj.state_dict().get(path[0])
    if isinstance(obj, torch.optim.Optimizer):
        inner = obj.optimizer if isinstance(obj, WrappingOptimizer) else obj
        rest = path[1:] if isinstance(obj, WrappingOptimizer) and path[:1] == ("optimizer",) else path
        params = [p for group in inner.param_groups for p in group["params"]]
        if len(rest) == 3 and rest[0] == "state" and isinstance(rest[1], int) and 0 <= rest[1] < len(params):
            return params[rest[1]]
    return None


def shard_template(obj, path: tuple, ref: ShardedRef) -> torch.Tensor:
    """The tensor of ``obj`` a sharded entry at ``path`` of its saved state loads into (its
    layout, sharded or whole, decides what this rank reads); refused when there is none or its
    shape differs."""
    have = template_at(obj, path)
    if have is None:
        raise InvalidValue(f"the checkpoint holds a sharded tensor at {list(path)}, where this object has none to "
                           "load it into: keep the same model and optimizer")
    if tuple(have.shape) != tuple(ref.shape) and isinstance(obj, torch.nn.Module):
        raise InvalidValue(f"{path[0]} has shape {tuple(ref.shape)} in the checkpoint, {tuple(have.shape)} here")
    if tuple(have.shape) != tuple(ref.shape):
        raise InvalidValue(f"the optimizer state {path[-1]!r} of parameter {path[-2]} has shape {tuple(ref.shape)} "
                           f"in the checkpoint, its parameter {tuple(have.shape)}")
    return have


def read_shards(payload: dict, objects: dict, directory: Path) -> dict:
    """This rank's part of every sharded tensor of ``payload`` (checked), read into new
    tensors laid out as the kept ``objects``' are now (any world size, sharded or not): the
    payload with them in place. Nothing kept changes here; a corrupt shard on any rank is a
    :class:`CheckpointError` on every rank (a collective)."""
    index = payload["sharded"]
    destinations = {}
    for name, obj in objects.items():
        for path, ref in sharded_refs(payload["objects"][name]):
            destinations[ref.key] = torch.empty_like(shard_template(obj, path, ref), dtype=ref.dtype)
    if not isinstance(index, dict) or set(destinations) - set(index.get("tensors", {})):
        raise CheckpointError(f"the checkpoint {checkpoint.newest_file(directory)} names shards its index does not "
                              "list")
    folder = directory / checkpoint.folder_name(index.get("directory"))
    sharded.load(destinations, folder, index)
    return {**payload, "objects": resolve_refs(payload["objects"], destinations)}


def laid_out(payload: dict, objects: dict) -> dict:
    """A replicated commit's whole tensors laid out as the kept ``objects``' DTensors are now (a
    run that outgrew DDP goes on sharded with FSDP2): each rank takes its part of the tensor
    rank 0 sent it, with no collective. The payload as it was when nothing kept is sharded."""
    dtensor = sharded.dtensor_type()
    if not dtensor or not holds_dtensors(objects.values()):
        return payload
    from torch.distributed.tensor import distribute_tensor  # loaded already: the model holds DTensors

    def place(obj, value, path: tuple):
        if isinstance(value, torch.Tensor) and not isinstance(value, dtensor):
            template = template_at(obj, path)
            if isinstance(template, dtensor) and tuple(template.shape) == tuple(value.shape):
                return distribute_tensor(value, template.device_mesh, template.placements, src_data_rank=None)
            return value
        if isinstance(value, dict):
            out = type(value)((key, place(obj, item, (*path, key))) for key, item in value.items())
            if hasattr(value, "_metadata"):
                out._metadata = value._metadata
            return out
        if type(value) in (list, tuple):
            return type(value)(place(obj, item, (*path, index)) for index, item in enumerate(value))
        return value

    placed = {name: place(objects[name], state, ()) if name in objects else state
              for name, state in payload["objects"].items()}
    return {**payload, "objects": placed}
