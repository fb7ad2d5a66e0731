"""LR schedulers that advance once per real update: :class:`UpdateScheduler` (also
``aikit.ga.Torch.optim.UpdateScheduler``), as Accelerate prepares schedulers."""

from __future__ import annotations

from typing import Any

from aikit.core.errors import InvalidType


class UpdateScheduler:
    """An LR scheduler that advances once per real update of the aikit optimizer it schedules.

    ``UpdateScheduler(torch.optim.lr_scheduler.StepLR(optimizer, 30))``: the training loop then
    calls ``scheduler.step()`` after every ``optimizer.step()``, as for a plain optimizer, and
    the steps between updates (and an update AMP skipped) do nothing, as with Accelerate's
    prepared scheduler. Everything else is the wrapped scheduler's.
    """

    def __init__(self, scheduler: Any) -> None:
        optimizer = getattr(scheduler, "optimizer", None)
        if optimizer is None or not hasattr(scheduler, "step"):
            raise InvalidType(
                f"UpdateScheduler wraps a torch LR scheduler built on the aikit optimizer, got {scheduler!r:.60} (a "
                f"{type(scheduler).__name__}): build one first, e.g. UpdateScheduler(torch.optim.lr_scheduler."
                "CosineAnnealingLR(optimizer, T_max=updates))"
            )
        if not hasattr(optimizer, "applied"):
            raise InvalidType(
                f"UpdateScheduler schedules an aikit optimizer (GA or trace), but {type(scheduler).__name__} "
                f"was built on {type(optimizer).__name__}: build it on the aikit optimizer"
            )
        self.scheduler = scheduler
        self._seen = optimizer.applied

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Advance the scheduler once per update applied since the last call: none between
        updates, several where a trace optimizer's idle replica made several in one call."""
        applied = self.scheduler.optimizer.applied
        for _ in range(applied - self._seen):
            self.scheduler.step(*args, **kwargs)
        self._seen = applied

    def __getattr__(self, name: str) -> Any:
        if name == "scheduler":
            raise AttributeError(name)
        return getattr(self.scheduler, name)

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)
