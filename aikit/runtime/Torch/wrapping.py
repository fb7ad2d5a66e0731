"""The base of every aikit optimizer that wraps a torch optimizer: one set of groups and state.

:class:`WrappingOptimizer` is a real ``torch.optim.Optimizer`` whose ``param_groups``, ``state``
and ``defaults`` *are* the wrapped optimizer's (LR schedulers and checkpoints see the one copy),
whose state-dict hooks run, and whose step hooks run around the real update. The GA
:class:`~aikit.ga.Torch.optim.Optimizer` (and its reduce-at-update form for Horovod and torchrun
without DDP) and the trace optimizers build on it, with an
:class:`~aikit.runtime.Torch.accumulator.Accumulator` doing the arithmetic.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

from aikit.core.errors import InvalidType


def _step_with_hooks(step: Callable[..., Any]) -> Callable[..., Any]:
    """``step`` between torch's global step hooks, as ``torch.optim.Optimizer`` wraps every
    ``step``, but without its profiler record (``record_function``), which costs about as much
    as the rest of a micro-step's Python: the real update, the wrapped optimizer's own ``step``,
    keeps its record and its hooks."""

    @functools.wraps(step)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        for hook in (*_global_optimizer_pre_hooks.values(), *self._optimizer_step_pre_hooks.values()):
            result = hook(self, args, kwargs)
            if result is not None:
                args, kwargs = result
        out = step(self, *args, **kwargs)
        for hook in (*self._optimizer_step_post_hooks.values(), *_global_optimizer_post_hooks.values()):
            hook(self, args, kwargs)
        return out

    wrapper.hooked = True  # torch.optim.Optimizer._patch_step_function leaves it as it is
    return wrapper


class _Wrapped:
    """An attribute of the wrapped optimizer, read and written through the wrapper."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        inner = obj.__dict__.get("optimizer")
        return obj.__dict__[f"_base_{self.name}"] if inner is None else getattr(inner, self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        inner = obj.__dict__.get("optimizer")
        if inner is None:  # torch.optim.Optimizer.__init__, before the wrapped optimizer is set
            obj.__dict__[f"_base_{self.name}"] = value
        else:
            setattr(inner, self.name, value)


class WrappingOptimizer(torch.optim.Optimizer):
    """A ``torch.optim.Optimizer`` whose groups, state and defaults are ``optimizer``'s."""

    kind = "optimizer wrapper"  # what the errors call it
    follows_trace = False  # True for a trace optimizer: its updates follow its sampler's trace (else: the GA wrapper)
    param_groups = _Wrapped()
    state = _Wrapped()
    defaults = _Wrapped()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "step" in cls.__dict__ and not getattr(cls.step, "hooked", False):
            cls.step = _step_with_hooks(cls.step)

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise InvalidType(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if isinstance(optimizer, WrappingOptimizer):
            raise InvalidType(
                f"optimizer is already an aikit {optimizer.kind} ({type(optimizer).__name__}), which accumulates "
                f"and updates by itself: give this {self.kind} the plain torch optimizer"
            )
        # the base class sets up its hook registries (and validates the groups, here copies of them)
        super().__init__([dict(group) for group in optimizer.param_groups], optimizer.defaults)
        for name in ("param_groups", "state", "defaults"):
            self.__dict__.pop(f"_base_{name}")
        self.__dict__["optimizer"] = optimizer

    def __getattr__(self, name: str) -> Any:
        """``train()`` and ``eval()`` of a wrapped optimizer that has them (Schedule-Free's contract)."""
        inner = self.__dict__.get("optimizer")
        if name in ("train", "eval") and hasattr(inner, name):
            return getattr(inner, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # --- the GA engine's finiteness check (every subclass has an ``engine``, an Accumulator) -----------
    @property
    def skip_nonfinite(self) -> bool:
        """Whether an update with an inf/NaN gradient is skipped (else applied, as torch does)."""
        return self.engine.skip_nonfinite

    @property
    def max_skips_in_a_row(self) -> int | None:
        """Non-finite updates skipped in a row before :class:`~aikit.core.errors.TrainingFailed`."""
        return self.engine.skips.max_in_a_row

    @property
    def skipped(self) -> int:
        """Updates skipped by this object for an inf/NaN gradient, AMP's GradScaler's included."""
        self.engine.outcomes.settle()
        return self.engine.skips.skipped

    @property
    def updated(self) -> bool:
        """Whether the last ``step()`` made a real update (not skipped for inf/NaN; a fused skip read here, once)."""
        return self.engine.outcomes.settle() if self._applied_last is None else self._applied_last

    @updated.setter
    def updated(self, updated: bool | None) -> None:
        self._applied_last = updated

    @property
    def applied(self) -> int:
        """Real updates applied by this object (skips not counted): what ``UpdateScheduler`` counts."""
        self.engine.outcomes.settle()
        return self.engine.outcomes.applied

    @applied.setter
    def applied(self, count: int) -> None:
        self.engine.outcomes.settle()
        self.engine.outcomes.applied = count

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if "optimizer" not in self.__dict__:
            return super().add_param_group(param_group)  # the base __init__'s own copies
        self.optimizer.add_param_group(param_group)

    def register_step_pre_hook(self, hook: Callable[..., Any]) -> Any:
        """Step hooks run around the real update (the wrapped optimizer's ``step``)."""
        return self.optimizer.register_step_pre_hook(hook)

    def register_step_post_hook(self, hook: Callable[..., Any]) -> Any:
        return self.optimizer.register_step_post_hook(hook)


def with_state_dict_hooks(optimizer: torch.optim.Optimizer, build: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``build()`` between the hooks registered with ``optimizer.register_state_dict_pre/post_hook``."""
    for hook in optimizer._optimizer_state_dict_pre_hooks.values():
        hook(optimizer)
    state = build()
    for hook in optimizer._optimizer_state_dict_post_hooks.values():
        state = hook(optimizer, state) or state
    return state


def with_load_hooks(optimizer: torch.optim.Optimizer, state: dict[str, Any],
                    load: Callable[[dict[str, Any]], None]) -> None:
    """``load(state)`` between the hooks registered with ``optimizer.register_load_state_dict_pre/post_hook``."""
    for hook in optimizer._optimizer_load_state_dict_pre_hooks.values():
        state = hook(optimizer, state) or state
    load(state)
    for hook in optimizer._optimizer_load_state_dict_post_hooks.values():
        hook(optimizer)


@contextlib.contextmanager
def settings_put_back(param_groups: list[dict[str, Any]], keys: tuple[str, ...]) -> Iterator[None]:
    """Change the groups' ``keys`` for one update in here: the values they held are put back whatever happens."""
    saved = [{key: group[key] for key in keys if key in group} for group in param_groups]
    try:
        yield
    finally:
        for group, values in zip(param_groups, saved, strict=True):
            group.update(values)
