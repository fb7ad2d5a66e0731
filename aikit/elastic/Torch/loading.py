"""Putting a checked commit into the kept objects, the same way on every rank.

The objects load in one order whatever the keyword order, so that every rank does the same and a
failure leaves what it can as it was; then each rank's random streams: rank 0 continues the saved
ones, every other rank gets its own, seeded from them and its rank. Nothing here makes a
collective: the commit was broadcast (or its shards read) before, the trace optimizer joins after.
"""

from __future__ import annotations

import copy
import hashlib
import random

import numpy as np
import torch

from aikit.elastic.Torch.trace_optim import TraceOptimizer
from aikit.runtime.Torch import random_state


def load(objects: dict, saved: dict) -> None:
    """Load every kept object of ``objects`` (by name; a plain value is replaced in the dict):
    first the objects aikit cannot check beforehand (schedulers, scalers; put back as they were
    if one fails), then models, then optimizers, then plain values (a tensor on the device of the
    one it replaces)."""
    order = {name: (2 if isinstance(obj, torch.optim.Optimizer) else 1 if isinstance(obj, torch.nn.Module)
                    else 0 if hasattr(obj, "load_state_dict") else 3, name)
             for name, obj in objects.items()}
    names = sorted(objects, key=order.get)
    unchecked = [name for name in names if order[name][0] == 0]
    before = {name: copy.deepcopy(objects[name].state_dict()) for name in unchecked}
    try:
        for name in unchecked:
            objects[name].load_state_dict(saved[name])
    except Exception:
        for name, state in before.items():
            objects[name].load_state_dict(state)
        raise
    for name in names:
        obj = objects[name]
        inner = obj.optimizer if isinstance(obj, TraceOptimizer) else obj  # its zero_grad() waits for updates
        if isinstance(inner, (torch.nn.Module, torch.optim.Optimizer)):
            inner.zero_grad(set_to_none=True)  # a step cut short leaves gradients behind
    for name in names[len(unchecked):]:
        if hasattr(objects[name], "load_state_dict"):
            objects[name].load_state_dict(saved[name])
        else:
            objects[name] = on_device_of(objects[name], saved[name])


def on_device_of(current: object, value: object) -> object:
    """``value`` read from a commit (on the CPU), on ``current``'s device where both are tensors:
    a plain tensor kept on the GPU comes back there, as the models' and optimizers' tensors do."""
    if isinstance(current, torch.Tensor) and isinstance(value, torch.Tensor):
        return value.to(current.device)
    return value


def set_rng_state(state: dict, rank: int) -> None:
    """Rank 0 continues the saved random streams; every other rank gets its own streams,
    seeded from them and its rank (workers must not draw the same dropout masks)."""
    random_state.set_state(state)
    if rank:
        digest = hashlib.sha256(state["torch"].numpy().tobytes() + rank.to_bytes(8, "little")).digest()
        seed = int.from_bytes(digest[:8], "little") >> 1
        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)
        random.seed(seed)
