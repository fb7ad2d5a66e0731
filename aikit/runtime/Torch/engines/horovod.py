"""Horovod (``horovodrun``): one replica per process, once the program imported and initialised
``horovod.torch`` (aikit never imports it).

Its errors pass through unnamed: ``hvd.elastic.run`` acts on its own ``HorovodInternalError``.
Under ``horovodrun --min-np/--max-np`` (``HOROVOD_ELASTIC=1``) Horovod re-forms the world itself:
an elastic state follows its protocol through :class:`HorovodResizing`, and its
``hvd.elastic.TorchState`` keeps the objects that :meth:`HorovodEngine.keep_whole` names by their
whole ``state_dict``.
"""

from __future__ import annotations

import copy
import os
import queue
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from aikit.runtime.Torch.engines.defaults import EngineDefaults


def horovod_torch() -> ModuleType | None:
    """The ``horovod.torch`` module when the user imported and initialised it, else None."""
    hvd = sys.modules.get("horovod.torch")
    if hvd is None:
        return None
    try:
        return hvd if hvd.is_initialized() else None
    except (AttributeError, ValueError):
        return None


class _WholeState:
    """``hvd.elastic.TorchState``'s handler for an object kept whole: its ``state_dict`` saved,
    restored, and synced from rank 0 (where Horovod's handler for a torch optimizer would call
    ``broadcast_optimizer_state``, which steps a fresh optimizer on zero gradients)."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.save()

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)

    def sync(self) -> None:
        if HOROVOD.world_size() > 1:
            self.value.load_state_dict(HOROVOD.broadcast_object(self.value.state_dict(), "a sync", 0))

    def set_value(self, value: Any) -> None:
        self.value = value
        self.save()


class HorovodEngine(EngineDefaults):
    """Horovod's collectives over its ranks."""

    name = "horovod"
    label = name

    def in_use(self) -> bool:
        return horovod_torch() is not None

    @staticmethod
    def _hvd() -> ModuleType:
        return sys.modules["horovod.torch"]

    def world_size(self) -> int:
        return self._hvd().size()

    def rank(self) -> int:
        return self._hvd().rank()

    def local_rank(self) -> int:
        return self._hvd().local_rank()

    def device_count(self) -> int:
        return self.world_size()

    def all_reduce_sum_(self, tensors: list[torch.Tensor]) -> None:
        hvd = self._hvd()
        if hvd.size() > 1:
            hvd.grouped_allreduce_(tensors, op=hvd.Sum)

    def broadcast_(self, tensors: list[torch.Tensor], src: int) -> None:
        hvd = self._hvd()
        if hvd.size() > 1:
            for tensor in tensors:
                hvd.broadcast_(tensor, root_rank=src)

    def broadcast_object(self, obj: Any, what: str, src: int) -> Any:
        return self._hvd().broadcast_object(obj, root_rank=src)

    def can_start_all_reduce(self) -> bool:
        return self._hvd().size() > 1

    def start_all_reduce_sum_(self, tensor: torch.Tensor, name: str) -> Callable[[], None]:
        hvd = self._hvd()
        handle = hvd.allreduce_async_(tensor, op=hvd.Sum, name=name)
        return lambda: hvd.synchronize(handle)

    def resizing(self) -> HorovodResizing | None:
        return HorovodResizing(self._hvd()) if os.environ.get("HOROVOD_ELASTIC") == "1" else None

    def keep_whole(self, kind: type) -> None:
        """Put a handler for ``kind`` first in Horovod's state-handler registry (its documented
        extension point), before its own handler for any torch optimizer."""
        from horovod.torch.elastic import state

        registry = state.get_handler_registry()
        if not any(handler is _WholeState and known is kind for known, handler in registry):
            state.set_handler_registry([(kind, _WholeState), *registry])


class HorovodResizing:
    """Horovod elastic's side of one elastic state: Horovod's own ``State``, whose host-update
    bookkeeping its driver notifies through the elastic state."""

    def __init__(self, hvd: ModuleType) -> None:
        from horovod.common.elastic import State

        self._state = State(bcast_object=hvd.broadcast_object, get_rank=hvd.rank)

    def hosts_updated(self, timestamp: Any, update: Any) -> None:
        self._state.on_hosts_updated(timestamp, update)

    def reset(self) -> None:
        self._state._host_messages = queue.Queue()

    def check_hosts(self) -> None:
        self._state.check_host_updates()


HOROVOD = HorovodEngine()
