"""Gradient accumulation for any torch optimizer: ``Optimizer(optimizer, steps)``.

``steps`` micro-batches make one real update that equals one step on their concatenated batch.
The wrapped optimizer is kept as it is (its state, defaults and hooks survive; the Run:AI
original re-created it as a dynamic subclass and lost them) and its ``step()`` runs once per
update, so its step count, Adam's bias correction, weight decay, gradient clipping and an LR
scheduler stepped after updates all advance once per update.

Gradients are averaged, not summed: the accumulated ``.grad`` is divided by ``steps`` at the
update (one multiply per update; a hand-written loop divides the loss instead). For
micro-batches of different sizes, say how many samples each holds with
``accumulate(model, samples=n)``: a hook on every parameter then weighs that micro-batch's
gradient by ``n / G`` (times the world size under DDP or Horovod, which average over
processes) before it is accumulated, so the update is exactly the big-batch mean even when
ranks hold different numbers of samples. The weights are taken relative to the micro-batch
size most of the update shares (a plan's micro-batches differ by at most one sample), which the
update scales once; so even micro-batches cost no multiply and ragged plans pay one only for
the micro-batches of the other size.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Iterator
from typing import Any

import torch

from aikit.core.plan import positive_int

_STATE_KEYS = {"optimizer", "ga"}
_GA_KEYS = {"steps", "position", "samples", "weighted", "pending_grads"}


class Optimizer(torch.optim.Optimizer):
    """Accumulate ``steps`` micro-batches, then update ``optimizer`` once.

    A subclass of ``torch.optim.Optimizer`` only so that LR schedulers and type checks accept
    it; it holds no state of its own besides the accumulation position, and ``param_groups``,
    ``state`` and ``defaults`` are the wrapped optimizer's.

    Args:
        optimizer: any torch optimizer, already built.
        steps: micro-batches per update (``aikit.elastic.Torch.steps``).
        global_batch_size: samples per update, needed only with ``accumulate(samples=...)``;
            defaults to the plan of ``aikit.elastic.Torch.init``.
        max_grad_norm: clip the accumulated gradient to this norm before each update.
        scaler: a ``torch.amp.GradScaler``; the wrapper unscales, steps and updates it once
            per update (call only ``scaler.scale(loss).backward()`` yourself).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        steps: int,
        *,
        global_batch_size: int | None = None,
        max_grad_norm: float | None = None,
        scaler: Any = None,
    ) -> None:
        if isinstance(optimizer, Optimizer):
            raise TypeError("optimizer is already an aikit GA Optimizer: wrap the torch optimizer only once")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if hasattr(optimizer, "synchronize") and hasattr(optimizer, "skip_synchronize"):
            raise TypeError(
                "optimizer is a horovod DistributedOptimizer, which all-reduces from backward hooks while "
                "this wrapper averages and clips the same gradients: wrap the plain torch optimizer with "
                "aikit.elastic.Torch.horovod.DistributedOptimizer(optimizer, steps) instead"
            )
        if max_grad_norm is not None and not (isinstance(max_grad_norm, (int, float)) and max_grad_norm > 0):
            raise ValueError(f"max_grad_norm must be a positive number or None, got {max_grad_norm!r}")
        self.optimizer = optimizer
        self._steps = positive_int(steps, "steps")
        self.global_batch_size = None if global_batch_size is None else positive_int(
            global_batch_size, "global_batch_size"
        )
        self.max_grad_norm = max_grad_norm
        self.scaler = scaler
        self.position = 0  # micro-steps taken towards the next update
        self.updated = False  # whether the last step() call made a real update
        self._samples = 0  # samples declared in this window (accumulate(samples=...))
        self._weighted = 0  # micro-steps of this window that declared their samples
        self._weight: float | None = None  # running micro-step's gradient factor (None: 1)
        self._handles: list[Any] = []  # weighing hooks, registered when a ragged micro-batch needs them
        self._world: int | None = None

    # --- the wrapped optimizer's state is the only state -------------------------------------
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        return self.optimizer.state

    @property
    def defaults(self) -> dict[str, Any]:
        return self.optimizer.defaults

    @property
    def steps(self) -> int:
        """Micro-batches per update; may change between updates (a new plan, a trace)."""
        return self._steps

    @steps.setter
    def steps(self, steps: int) -> None:
        steps = positive_int(steps, "steps")
        if self.position:
            raise ValueError(
                f"steps can change only between updates, but {self.position} of {self._steps} "
                f"micro-steps are accumulated: set steps={steps} when optimizer.position == 0"
            )
        self._steps = steps

    @property
    def sync_gradients(self) -> bool:
        """True when the next ``step()`` makes the real update: the micro-step whose backward
        must all-reduce under DDP, and where you would unscale or clip by hand."""
        return self.position == self._steps - 1

    def __repr__(self) -> str:
        return f"aikit.ga.Torch.optim.Optimizer({self.optimizer!r}, steps={self._steps})"

    # --- the training loop ---------------------------------------------------------------------
    @contextlib.contextmanager
    def accumulate(self, model: torch.nn.Module | None = None, samples: int | None = None) -> Iterator[None]:
        """Run one micro-step's forward and backward inside this context.

        Under DDP it skips the all-reduce (``model.no_sync()``) on every micro-step but the last
        of an update. With ``samples`` the micro-batch's gradient is weighted by its share of
        the global batch, which makes ragged and per-rank-uneven micro-batches exact.
        """
        sync = self.sync_gradients
        if samples is not None:
            samples = _count(samples)
            # relative to the micro-batch size most of the update shares, which the update
            # then scales once: only micro-batches of the other size pay a multiply
            factor = samples / self._common_size(samples)
            self._weight = None if factor == 1 else factor
            if self._weight is not None and not self._handles:
                self._hook(self._params())
        no_sync = getattr(model, "no_sync", None)
        try:
            with contextlib.nullcontext() if sync or no_sync is None else no_sync():
                yield
        finally:
            if samples is not None:
                self._weight = None
                self._samples += samples
                self._weighted += 1

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients at the start of an update only; mid-update it keeps them (the
        wrapper clears them itself after every update, so calling this is optional)."""
        if self.position == 0:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Count one micro-step (evaluating ``closure`` once if given) and update on the last."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.position += 1
        self.updated = self.position == self._steps
        if self.updated:
            self.updated = self._update()
        return loss

    def _update(self) -> bool:
        """The real update on the accumulated, weighted gradient; False if AMP skipped it."""
        steps, weighted, samples = self.position, self._weighted, self._samples
        self.position = self._samples = self._weighted = 0
        if weighted not in (0, steps):
            self.optimizer.zero_grad()
            raise ValueError(
                f"only {weighted} of the {steps} micro-steps of this update declared samples= in "
                "accumulate(): declare them in every micro-step or in none"
            )
        if weighted and self._world == 1 and samples != self._global_batch_size(samples):
            self.optimizer.zero_grad()
            raise ValueError(
                f"the {steps} micro-batches of this update held {samples} samples, but "
                f"global_batch_size is {self._global_batch_size(samples)}: feed exactly that many "
                "per update (drop an epoch's incomplete last update, see aikit.core.windows)"
            )
        params = self._params()
        grads = [p.grad for p in params if p.grad is not None]
        # the mean over the update: 1/steps, or the common micro-batch's share n * world / G
        share = self._common_size(samples) * self._world / self._global_batch_size(samples) if weighted else 0
        mean = share or 1.0 / steps
        if mean != 1 and grads:
            torch._foreach_mul_(grads, mean)
        if self.scaler is not None:
            scale = self.scaler.get_scale()
            self.scaler.unscale_(self.optimizer)
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        if self.scaler is None:
            self.optimizer.step()
            stepped = True
        else:
            self.scaler.step(self.optimizer)
            self.scaler.update()
            stepped = self.scaler.get_scale() >= scale  # a lowered scale means inf/NaN: skipped
        self.optimizer.zero_grad(set_to_none=True)
        return stepped

    # --- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state and the accumulation position, with the gradients
        accumulated so far when saved mid-update, so a resume continues identically."""
        pending = [None if p.grad is None else p.grad.detach().clone() for p in self._params()]
        return {
            "optimizer": self.optimizer.state_dict(),
            "ga": {
                "steps": self._steps,
                "position": self.position,
                "samples": self._samples,
                "weighted": self._weighted,
                "pending_grads": pending if self.position else [],
            },
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore ``state_dict()``; strict about its keys. Saved between updates, it may be
        loaded with a different ``steps`` (an elastic restart on other hardware)."""
        if set(state_dict) != _STATE_KEYS:
            if "param_groups" in state_dict:
                raise ValueError(
                    "this is a torch optimizer's state_dict, not an aikit GA Optimizer's: load it "
                    "with optimizer.optimizer.load_state_dict(...)"
                )
            raise ValueError(f"GA Optimizer state_dict needs keys {sorted(_STATE_KEYS)}, got {sorted(state_dict)}")
        ga = state_dict["ga"]
        if set(ga) != _GA_KEYS:
            raise ValueError(f"GA Optimizer state_dict['ga'] needs keys {sorted(_GA_KEYS)}, got {sorted(ga)}")
        position = ga["position"]
        if position and ga["steps"] != self._steps:
            raise ValueError(
                f"the checkpoint was saved {position} micro-steps into an update of steps={ga['steps']}, "
                f"but this optimizer has steps={self._steps}: resume with steps={ga['steps']}, or save "
                "between updates (optimizer.position == 0) to change steps"
            )
        params = self._params()
        pending = ga["pending_grads"]
        if position and len(pending) != len(params):
            raise ValueError(f"the checkpoint holds {len(pending)} pending gradients for {len(params)} parameters")
        self.optimizer.load_state_dict(state_dict["optimizer"])
        for p, grad in zip(params, pending if position else [None] * len(params), strict=True):
            p.grad = None if grad is None else grad.to(device=p.device, dtype=p.dtype).clone()
        self.position, self._samples, self._weighted = position, ga["samples"], ga["weighted"]
        self.updated = False

    def __getstate__(self) -> dict[str, Any]:
        return {
            "optimizer": self.optimizer,
            "global_batch_size": self.global_batch_size,
            "max_grad_norm": self.max_grad_norm,
            "scaler": self.scaler,
            "ga": self.state_dict()["ga"],
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(
            state["optimizer"],
            state["ga"]["steps"],
            global_batch_size=state["global_batch_size"],
            max_grad_norm=state["max_grad_norm"],
            scaler=state["scaler"],
        )
        ga = state["ga"]
        for p, grad in zip(self._params(), ga["pending_grads"] or [None] * len(self._params()), strict=True):
            p.grad = grad
        self.position, self._samples, self._weighted = ga["position"], ga["samples"], ga["weighted"]

    # --- parameters and their gradient hooks ---------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)
        if self._handles:
            self._hook(self.optimizer.param_groups[-1]["params"])

    def register_step_pre_hook(self, hook: Callable[..., Any]) -> Any:
        """Hooks run around the real update (the wrapped optimizer's step)."""
        return self.optimizer.register_step_pre_hook(hook)

    def register_step_post_hook(self, hook: Callable[..., Any]) -> Any:
        return self.optimizer.register_step_post_hook(hook)

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def _hook(self, params: list[torch.Tensor]) -> None:
        # A tensor hook runs before the gradient is added to .grad and before DDP's reducer
        # reads .grad, so each micro-batch enters the sum with its own weight. Registered only
        # once a ragged micro-batch needs them, so even plans run no Python per parameter.
        self._handles += [p.register_hook(self._weigh) for p in params if p.requires_grad]

    def _weigh(self, grad: torch.Tensor) -> torch.Tensor | None:
        if self._weight is None:
            return None
        # an empty micro-batch (a rank that sits a step out) has a NaN mean-loss gradient:
        # it contributes exactly nothing, yet its backward still joins DDP's all-reduce
        return torch.zeros_like(grad) if self._weight == 0 else grad * self._weight

    def _common_size(self, samples: int) -> int:
        """The micro-batch size most of an update has: a plan splits G over steps x world
        micro-batches of ``G // (steps x world)`` samples or one more."""
        if self._world is None:
            self._world = _world_size()
        base, extra = divmod(self._global_batch_size(samples), self._steps * self._world)
        return max(base + (2 * extra > self._steps * self._world), 1)

    def _global_batch_size(self, samples: int) -> int:
        if self.global_batch_size is not None:
            return self.global_batch_size
        import aikit.elastic

        plan = aikit.elastic._latest
        if plan is None:
            raise ValueError(
                f"accumulate(samples={samples}) weighs the micro-batch by samples / global batch, but "
                "no global batch is known: pass Optimizer(..., global_batch_size=G) or call "
                "aikit.elastic.Torch.init(G, max_gpu_batch_size) first"
            )
        return plan.global_batch_size


def _count(samples: Any) -> int:
    """A micro-batch's sample count as an int, or a ValueError naming the value."""
    try:
        if isinstance(samples, bool):
            raise TypeError
        count = operator.index(samples)
    except TypeError:
        count = -1
    if count < 0:
        raise ValueError(f"samples must be a non-negative integer (the micro-batch's len), got {samples!r}")
    return count


def _world_size() -> int:
    from aikit.elastic.Torch import distributed

    return distributed.world_size()

