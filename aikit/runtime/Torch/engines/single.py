"""One process, detected when no other engine is in use or launched: one replica, with every
visible GPU (``torch.nn.DataParallel`` uses them all), and collectives that change nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from aikit.runtime.Torch.engines.defaults import EngineDefaults
from aikit.runtime.Torch.engines.torch_distributed import torchrun_variable


class SingleEngine(EngineDefaults):
    """One replica. Its rank and local rank are 0, or ``RANK`` and ``LOCAL_RANK`` where a
    launcher set them without ``WORLD_SIZE`` (as aikit has always read them)."""

    name = "single"
    label = "one process"

    def in_use(self) -> bool:
        return False

    def launched(self) -> bool:
        return True  # what is left: the last engine detection asks

    def world_size(self) -> int:
        return 1

    def rank(self) -> int:
        return torchrun_variable("RANK", 0)

    def local_rank(self) -> int:
        return torchrun_variable("LOCAL_RANK", 0)

    def device_count(self) -> int:
        return max(torch.cuda.device_count(), 1)

    def all_reduce_sum_(self, tensors: list[torch.Tensor]) -> None:
        pass

    def broadcast_(self, tensors: list[torch.Tensor], src: int) -> None:
        pass

    def broadcast_object(self, obj: Any, what: str, src: int) -> Any:
        return obj

    def can_start_all_reduce(self) -> bool:
        return False

    def start_all_reduce_sum_(self, tensor: torch.Tensor, name: str) -> Callable[[], None]:
        return lambda: None  # a sum over one replica: the tensor as it is


SINGLE = SingleEngine()
