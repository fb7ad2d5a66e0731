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
unscaling, clipping and the wrapped optimizer's ``step()``. :class:`Buckets` starts that sum
while the update's last backward still runs, as DDP and Horovod do.
"""

from __future__ import annotations

import functools
import itertools
import math
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from aikit.core.validate import checked_float


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
                 scaler: Any = None, overlap: Callable[[], bool] | None = None,
                 bucket_cap_mb: float = 25.0) -> None:
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
        # the sum over replicas started from the last backward (overlap(): "this backward ends the update")
        self.buckets = None if overlap is None else Buckets(self.params(), bucket_cap_mb, overlap, self._carried)

    def _carried(self) -> float:
        return self.carried

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
        """Sum every gradient, and ``counts``, over the replicas: in the buckets the last backward
        started (:class:`Buckets`, where there are), else in one grouped all-reduce.

        A replica with no gradient for a parameter adds zeros; a parameter no replica touched
        keeps no gradient, as in one process (except on XLA, where telling would need a read
        from the device: it gets a zero gradient). Returns the summed ``counts``.
        """
        from aikit.elastic.Torch.collectives import (  # not at import: a cycle
            all_reduce_sum_,
            can_start_all_reduce,
            engine,
            mark_step,
        )

        params = self.params()
        if not params:
            return list(counts)
        if any(p.grad is not None and p.grad.is_sparse for p in params):
            self.discard()
            raise ValueError(
                "a sparse gradient (nn.Embedding(sparse=True) or similar) cannot be summed over replicas at "
                "the update: use dense gradients, or DDP with aikit's GA Optimizer"
            )
        device = params[0].device
        dtype = params[0].dtype if params[0].dtype in (torch.float32, torch.float64) else torch.float32
        if self.buckets is not None and can_start_all_reduce(device):
            summed = self.buckets.finish(counts, dtype)
            self.carried = 1.0
            return summed
        if self.carried != 1:  # each replica folded its own factor: unfold it before summing
            self._rescale(self.carried)
            self.carried = 1.0
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
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

    def discard(self) -> None:
        """Forget the sums started from the last backward (a load or a failed update replaces
        the gradients they were started from); local, nothing is waited for."""
        if self.buckets is not None:
            self.buckets.reset()

    def step(self, scale: float) -> bool:
        """Multiply the accumulated gradients by ``scale``, unscale (AMP), clip, update, clear.

        Returns False when AMP skipped the update for an inf/NaN gradient."""
        self.discard()  # an update without the sum over replicas (one replica) started none
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


FIRST_BUCKET_BYTES = 1 << 20  # DDP's first bucket (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES)
_serials = itertools.count()  # names each optimizer's buckets for Horovod: built in the same order on every rank


class Buckets:
    """The update's sum over replicas, started bucket by bucket while the last backward runs.

    As DDP's reducer and Horovod's hooks do: the parameters are grouped in reverse order (about
    the order backward finishes them), per device and dtype, into buckets of ``cap_mb`` MB (the
    first of each kind 1 MiB, so the communication starts early). During a backward for which
    ``armed()`` is true (the one that ends the update), a post-accumulate-grad hook marks each
    parameter's gradient final; a bucket whose gradients are all final is copied into one flat
    buffer, multiplied by this replica's folded factor ``factor()``, and its all-reduce started
    asynchronously, always in bucket order, so every replica starts the same all-reduces in
    the same order. :meth:`finish` (in ``step()``) starts the rest (an idle replica: all of them,
    with zeros where it has no gradient), the last bucket carrying the flags: which parameters
    have a gradient, the counts (samples), and whether some gradient grew late. Then it waits
    and writes the sums to ``.grad``. A parameter that gets no gradient in the last backward
    holds back its bucket and the later ones until :meth:`finish` (DDP would need
    ``find_unused_parameters``).

    A gradient that grows after its bucket started (a second backward in the last micro-step)
    makes every replica, told by the flags, sum the final gradients again in one all-reduce
    (exact either way; a warning says the overlap was lost).
    """

    def __init__(self, params: list[torch.Tensor], cap_mb: float, armed: Callable[[], bool],
                 factor: Callable[[], float]) -> None:
        self.cap_bytes = bucket_bytes(cap_mb)
        self.armed, self.factor = _weak(armed), _weak(factor)
        self.serial = next(_serials)
        self._warned = False
        self._hooks: list[Any] = []
        self.build(params)

    def build(self, params: list[torch.Tensor]) -> None:
        """Bucket ``params`` (again, after ``add_param_group``) and hook them."""
        for handle in self._hooks:
            handle.remove()
        self.buckets = assign_buckets(params, self.cap_bytes)
        me = weakref.ref(self)  # the hooks outlive a dropped optimizer: they must not keep it armed
        self._hooks = [p.register_post_accumulate_grad_hook(functools.partial(_final, me, index, slot))
                       for index, bucket in enumerate(self.buckets) for slot, p in enumerate(bucket)]
        self.reset()

    def reset(self) -> None:
        self.waiting = [set(range(len(bucket))) for bucket in self.buckets]  # gradients not final yet
        self.started: list[tuple[torch.Tensor, Callable[[], None]]] = []  # (flat sum, wait), in bucket order
        self.late = False  # a gradient grew after its bucket started
        self._can: bool | None = None  # whether this engine starts all-reduces asynchronously (asked once)

    def final(self, index: int, slot: int, param: torch.Tensor) -> None:
        """``param``'s gradient is final for this backward: start every bucket now complete but
        the last (it ends the backward anyway, and carries the flags from :meth:`finish`)."""
        if not self.armed():
            return
        if index < len(self.started) or param.grad.is_sparse:
            self.late = True
            return
        self.waiting[index].discard(slot)
        if self._can is None:
            from aikit.elastic.Torch.collectives import can_start_all_reduce

            self._can = can_start_all_reduce(param.device)
        while self._can and len(self.started) < len(self.buckets) - 1 and not self.waiting[len(self.started)]:
            self._start()

    def _start(self, flags: torch.Tensor | None = None) -> None:
        """Start the next bucket's all-reduce (with ``flags`` appended, if given)."""
        from aikit.elastic.Torch.collectives import start_all_reduce_sum_

        index = len(self.started)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.buckets[index]]
        flat = _flatten_dense_tensors(grads if flags is None else [*grads, flags])
        factor = self.factor()
        if factor != 1:  # each replica folded its own factor: unfold it before summing
            flat[: flat.numel() - (0 if flags is None else flags.numel())].mul_(factor)
        self.started.append((flat, start_all_reduce_sum_(flat, f"aikit.ga.{self.serial}.bucket{index}")))

    @torch.no_grad()
    def finish(self, counts: list[float], dtype: torch.dtype) -> list[float]:
        """Start the buckets not started yet, sum (has a gradient, ``counts``, late) over the
        replicas with the last one, wait, and put the sums in ``.grad`` (None where no replica
        had a gradient). Returns the summed ``counts``."""
        from aikit.elastic.Torch.collectives import all_reduce_sum_, start_all_reduce_sum_

        try:
            last = self.buckets[-1]
            while len(self.started) < len(self.buckets) - 1:
                self._start()
            params = [p for bucket in self.buckets for p in bucket]
            flags = torch.tensor([*(float(p.grad is not None) for p in params), *counts, float(self.late)],
                                 dtype=dtype, device=params[0].device)
            if (last[0].dtype, last[0].device) == (flags.dtype, flags.device):  # one collective fewer
                self._start(flags)
                flags = self.started[-1][0][-flags.numel():]
            else:  # the last bucket holds half-precision gradients: flags (counts) apart, in float32
                self._start()
                self.started.append((flags, start_all_reduce_sum_(flags, f"aikit.ga.{self.serial}.flags")))
            for _, wait in self.started:
                wait()
            *used, late = flags.tolist()
            if late:  # some replica's sums started too early: one all-reduce of the final gradients
                if not self._warned:
                    self._warned = True
                    warnings.warn(
                        "a gradient grew after its bucket's all-reduce had started (a second backward in the last "
                        "micro-step of an update): the update summed every gradient again after the backward, "
                        "which is exact but gives up the overlap; run one backward per micro-step to keep it",
                        RuntimeWarning, stacklevel=4)
                grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
                if self.factor() != 1:
                    _mul_(grads, self.factor())
                all_reduce_sum_(grads)
            else:
                grads = [g for (flat, _), bucket in zip(self.started, self.buckets, strict=False)
                         for g in _unflatten_dense_tensors(flat[: sum(p.numel() for p in bucket)], bucket)]
            for p, grad, has in zip(params, grads, used, strict=False):
                p.grad = grad if has else None
            return used[len(params):]
        finally:
            self.reset()

    def __del__(self) -> None:
        for handle in self._hooks:
            handle.remove()


def bucket_bytes(cap_mb: float) -> int:
    """``bucket_cap_mb`` in bytes, or the error that names it."""
    cap_mb = checked_float(cap_mb, "bucket_cap_mb", "a positive number of megabytes (DDP's default is 25) or None",
                           lambda megabytes: 0 < megabytes < math.inf)
    return max(int(cap_mb * 1024 * 1024), 1)


def assign_buckets(params: list[torch.Tensor], cap_bytes: int) -> list[list[torch.Tensor]]:
    """``params`` in reverse order, in buckets of one device and dtype each, closed once they
    hold ``cap_bytes`` (the first of each kind :data:`FIRST_BUCKET_BYTES`), in closing order."""
    buckets: list[list[torch.Tensor]] = []
    filling: dict[tuple[torch.device, torch.dtype], tuple[list[torch.Tensor], int]] = {}
    closed: set[tuple[torch.device, torch.dtype]] = set()
    for p in reversed(params):
        kind = p.device, p.dtype
        bucket, size = filling.get(kind, ([], 0))
        bucket.append(p)
        size += p.numel() * p.element_size()
        if size >= (cap_bytes if kind in closed else min(FIRST_BUCKET_BYTES, cap_bytes)):
            buckets.append(bucket)
            closed.add(kind)
            filling.pop(kind, None)
        else:
            filling[kind] = bucket, size
    return buckets + [bucket for bucket, _ in filling.values()]


def _final(buckets: weakref.ref, index: int, slot: int, param: torch.Tensor) -> None:
    alive = buckets()
    if alive is not None:
        alive.final(index, slot, param)


def _weak(method: Callable[[], Any]) -> Callable[[], Any]:
    """``method`` without keeping its object alive (False / 1 once it is gone)."""
    ref = weakref.WeakMethod(method)
    return lambda: (ref() or (lambda: False))()


def _mul_(grads: list[torch.Tensor], factor: float) -> None:
    """Multiply gradients in place: one grouped kernel for the dense ones."""
    dense = [g for g in grads if not g.is_sparse]
    if dense:
        torch._foreach_mul_(dense, factor)
    for g in grads:
        if g.is_sparse:
            g.mul_(factor)
