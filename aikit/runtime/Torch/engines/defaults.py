"""What an engine does where it has nothing of its own: an engine subclasses :class:`EngineDefaults`
and writes only what differs (see :class:`aikit.runtime.Torch.engines.Engine` for what each means)."""

from __future__ import annotations

import torch


class EngineDefaults:
    """Detected only once in use, owning no device, tracing nothing lazily, with no elastic state
    of its own, one world for every update (every update committed)."""

    lazy = False
    per_update = False

    def launched(self) -> bool:
        return False

    def owns(self, device: torch.device) -> bool:
        return False

    def mark_step(self, device: torch.device) -> None:
        pass

    def resizing(self) -> None:
        return None

    def keep_whole(self, kind: type) -> None:
        pass

    def membership(self) -> tuple[int, int]:
        return self.world_size(), self.rank()

    def commit(self) -> bool:
        return True
