"""The one torch GA engine: gradients accumulate in ``.grad``, then one update.

:class:`WrappingOptimizer` is the base of every aikit optimizer that wraps a torch optimizer
(the GA :class:`~aikit.ga.Torch.optim.Optimizer`, its reduce-at-update form for Horovod and
torchrun without DDP, and the trace optimizers): a real ``torch.optim.Optimizer`` whose
``param_groups``, ``state`` and ``defaults`` *are* the wrapped optimizer's (LR schedulers and
checkpoints see the one copy), whose state-dict hooks run, and whose step hooks run around the
real update.

:class:`Accumulator` owns the arithmetic every one of them applies, with weights from
:mod:`aikit.core.ga`: per micro-batch weights relative to a unit (a gradient hook only for the
micro-batches whose size differs), then at the update one multiply, the optional sum over
replicas (idle replicas add zeros; a parameter no replica touched keeps no gradient), AMP
unscaling, clipping and the wrapped optimizer's ``step()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


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
    param_groups = _Wrapped()
    state = _Wrapped()
    defaults = _Wrapped()

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if isinstance(optimizer, WrappingOptimizer):
            raise TypeError(
                f"optimizer is already an aikit {optimizer.kind} ({type(optimizer).__name__}), which accumulates "
                f"and updates by itself: give this {self.kind} the plain torch optimizer"
            )
        # the base class sets up its hook registries (and validates the groups, here copies of them)
        super().__init__([dict(group) for group in optimizer.param_groups], optimizer.defaults)
        for name in ("param_groups", "state", "defaults"):
            self.__dict__.pop(f"_base_{name}")
        self.__dict__["optimizer"] = optimizer

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if "optimizer" not in self.__dict__:
            return super().add_param_group(param_group)  # the base __init__'s own copies
        self.optimizer.add_param_group(param_group)

    def register_step_pre_hook(self, hook: Callable[..., Any]) -> Any:
        """Step hooks run around the real update (the wrapped optimizer's ``step``)."""
        return self.optimizer.register_step_pre_hook(hook)

    def register_step_post_hook(self, hook: Callable[..., Any]) -> Any:
        return self.optimizer.register_step_post_hook(hook)

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def _run_state_dict_hooks(self, build: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """``build()`` between the hooks registered with ``register_state_dict_pre/post_hook``."""
        for hook in self._optimizer_state_dict_pre_hooks.values():
            hook(self)
        state = build()
        for hook in self._optimizer_state_dict_post_hooks.values():
            state = hook(self, state) or state
        return state

    def _run_load_hooks(self, state: dict[str, Any], load: Callable[[dict[str, Any]], None]) -> None:
        """``load(state)`` between the hooks registered with ``register_load_state_dict_pre/post_hook``."""
        for hook in self._optimizer_load_state_dict_pre_hooks.values():
            state = hook(self, state) or state
        load(state)
        for hook in self._optimizer_load_state_dict_post_hooks.values():
            hook(self)


class Accumulator:
    """Weighted gradient accumulation in ``.grad`` and the one update of ``optimizer``.

    ``max_grad_norm`` clips the update's gradient (after AMP unscaling); ``scaler`` is a
    ``torch.amp.GradScaler`` that the update unscales, steps and updates once.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, max_grad_norm: float | None = None,
                 scaler: Any = None) -> None:
        if max_grad_norm is not None and not (
            isinstance(max_grad_norm, (int, float)) and not isinstance(max_grad_norm, bool) and max_grad_norm > 0
        ):
            raise ValueError(f"max_grad_norm must be a positive number or None, got {max_grad_norm!r}")
        self.optimizer = optimizer
        self.max_grad_norm = max_grad_norm
        self.scaler = scaler
        self.factor: float | None = None  # the running micro-batch's weight relative to the unit (None: 1)
        self.carried = 1.0  # .grad holds the weighted sum divided by this (folded weights)
        self._handles: list[Any] = []  # weighing hooks, registered once a micro-batch needs them

    def params(self) -> list[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"] if p.requires_grad]

    # --- per micro-batch -----------------------------------------------------------------------
    def weigh_next(self, factor: float | None, *, fold: bool = True) -> None:
        """Weigh the next backward's gradients by ``factor`` relative to the unit (None: 1).

        ``fold``: fold the factor into what ``.grad`` already holds instead: ``.grad`` keeps
        the sum divided by the running factor, rescaled in place only when the factor changes
        (a ragged plan: about once per update), and the update multiplies by it once. Not for
        the backward in which DDP all-reduces (each rank would carry its own factor): there a
        gradient hook weighs each incoming gradient, as for an empty micro-batch (weight 0,
        whose NaN mean-loss gradient must be dropped, not scaled)."""
        if fold and factor != 0:
            factor = 1.0 if factor is None else factor
            if factor != self.carried:
                self._rescale(self.carried / factor)
                self.carried = factor
            self.factor = None
            return
        if factor != 0 and self.carried != 1:
            self._rescale(self.carried)
            self.carried = 1.0
        self.factor = factor
        if factor is not None and not self._handles:
            self.hook(self.params())

    def _rescale(self, factor: float) -> None:
        grads = [p.grad for p in self.params() if p.grad is not None]
        if grads:
            with torch.no_grad():
                _mul_(grads, factor)

    def pending(self) -> list[torch.Tensor | None]:
        """Copies of the accumulated gradients, the folded factor applied (for checkpoints)."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        return [None if p.grad is None else p.grad.detach() * self.carried if self.carried != 1
                else p.grad.detach().clone() for p in params]

    def hook(self, params: list[torch.Tensor]) -> None:
        # A tensor hook runs before the gradient is added to .grad and before DDP's reducer
        # reads .grad, so each micro-batch enters the sum with its own weight. Registered only
        # once a micro-batch of another size needs them: even splits run no Python per parameter.
        self._handles += [p.register_hook(self._weigh) for p in params if p.requires_grad]

    def _weigh(self, grad: torch.Tensor) -> torch.Tensor | None:
        if self.factor is None:
            return None
        # an empty micro-batch (a replica that sits a step out) has a NaN mean-loss gradient:
        # it contributes exactly nothing, yet its backward still joins DDP's all-reduce
        return torch.zeros_like(grad) if self.factor == 0 else grad * self.factor

    # --- the update ----------------------------------------------------------------------------
    @torch.no_grad()
    def reduce(self, counts: list[float] = ()) -> list[float]:
        """Sum every gradient, and ``counts``, over the replicas in one grouped all-reduce.

        A replica with no gradient for a parameter adds zeros; a parameter no replica touched
        keeps no gradient, as in one process (except on XLA, where telling would need a read
        from the device: it gets a zero gradient). Returns the summed ``counts``.
        """
        from aikit.elastic.Torch.collectives import all_reduce_sum_, engine, mark_step  # not at import: a cycle

        params = self.params()
        if not params:
            return list(counts)
        if self.carried != 1:  # each replica folded its own factor: unfold it before summing
            self._rescale(self.carried)
            self.carried = 1.0
        device = params[0].device
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        if any(g.is_sparse for g in grads):
            raise ValueError(
                "a sparse gradient (nn.Embedding(sparse=True) or similar) cannot be summed over replicas at "
                "the update: use dense gradients, or DDP with aikit's GA Optimizer"
            )
        dtype = grads[0].dtype if grads[0].dtype in (torch.float32, torch.float64) else torch.float32
        if engine(device) == "xla":
            # every replica must run the same program around an XLA collective: cut the graph
            # here, so a replica that had no micro-batch and one that did run the same graph
            mark_step(device)
            extra = torch.tensor(list(counts), dtype=dtype, device=device)
            all_reduce_sum_([*grads, extra] if counts else grads)
            for p, grad in zip(params, grads, strict=True):
                p.grad = grad
            return extra.tolist() if counts else []
        flags = torch.tensor([*(float(p.grad is not None) for p in params), *counts], dtype=dtype, device=device)
        all_reduce_sum_([*grads, flags])
        summed = flags.tolist()
        for p, grad, used in zip(params, grads, summed, strict=False):
            p.grad = grad if used else None
        return summed[len(params):]

    def step(self, scale: float) -> bool:
        """Multiply the accumulated gradients by ``scale``, unscale (AMP), clip, update, clear.

        Returns False when AMP skipped the update for an inf/NaN gradient."""
        params = self.params()
        grads = [p.grad for p in params if p.grad is not None]
        scale, self.carried = scale * self.carried, 1.0
        if scale != 1 and grads:
            _mul_(grads, scale)
        if self.scaler is not None:
            scale_before = self.scaler.get_scale()
            self.scaler.unscale_(self.optimizer)  # before clipping: the norm is the true gradient's
        if self.max_grad_norm is not None:
            if any(g.is_sparse for g in grads):
                self.optimizer.zero_grad()
                raise ValueError(
                    f"max_grad_norm={self.max_grad_norm} cannot clip sparse gradients (nn.Embedding(sparse=True) "
                    "or similar): use dense gradients, or max_grad_norm=None and clip the dense parameters yourself"
                )
            torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        if self.scaler is None:
            self.optimizer.step()
            stepped = True
        else:
            self.scaler.step(self.optimizer)
            self.scaler.update()
            stepped = self.scaler.get_scale() >= scale_before  # a lowered scale means inf/NaN: skipped
        self.optimizer.zero_grad()
        return stepped



def _mul_(grads: list[torch.Tensor], factor: float) -> None:
    """Multiply gradients in place: one grouped kernel for the dense ones."""
    dense = [g for g in grads if not g.is_sparse]
    if dense:
        torch._foreach_mul_(dense, factor)
    for g in grads:
        if g.is_sparse:
            g.mul_(factor)
