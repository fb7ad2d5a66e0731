"""The arithmetic of gradient accumulation in torch: gradients gather in ``.grad``, then one update.

:class:`Accumulator` owns what every aikit torch optimizer applies, with weights from
:mod:`aikit.core.ga`: per micro-batch weights relative to a unit (folded into ``.grad``, a
gradient hook only where that cannot work), or counts of loss terms applied at the model's
outputs (:mod:`aikit.runtime.Torch.output_weights`) and summed over the replicas at the update;
then at the update one multiply, the optional sum over replicas (idle replicas add zeros; a
parameter no replica touched keeps no gradient), AMP unscaling, clipping and the wrapped
optimizer's ``step()``. Its :class:`~aikit.runtime.Torch.buckets.Buckets` start that sum while
the update's last backward still runs, as DDP and Horovod do.

An update whose gradient is not finite is skipped, as a GradScaler skips one (under AMP the
scaler decides; without, a flag made in the pass that applies the update's scale, or the total
norm clipping computes: read once per update, or handed to a fused optimizer's kernel and read
when asked, :mod:`aikit.runtime.Torch.amp`; :mod:`aikit.core.skips` counts, warns and fails a run
of them); a micro-step without a backward is warned about
(:mod:`aikit.runtime.Torch.backward_marks`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch

from aikit.core.errors import InvalidType, InvalidValue
from aikit.core.ga import mean_scale, term_count
from aikit.core.skips import MAX_SKIPS_IN_A_ROW, SkipCount
from aikit.core.validate import checked_bool, checked_float
from aikit.runtime.Torch import amp, collectives
from aikit.runtime.Torch.backward_marks import BackwardMarks
from aikit.runtime.Torch.buckets import Buckets
from aikit.runtime.Torch.grads import mul_, or_zeros, read_norm, scale_and_check_, stacked, total_norm
from aikit.runtime.Torch.outcomes import Outcomes
from aikit.runtime.Torch.output_weights import OutputFactors


def checked_count(value: Any, name: str = "weight") -> int | torch.Tensor:
    """``value`` as a count of loss terms: an int >= 0, or a 0-d integer tensor (kept as it is);
    a tensor's value is checked only where reading it costs nothing, on the CPU. Otherwise the
    aikit error that names ``name``, what it got and how to count."""
    if not isinstance(value, torch.Tensor):
        return term_count(value, name)
    if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
        raise InvalidType(
            f"{name} must be an integer count of loss terms, got a {value.dtype} tensor: count the terms, "
            "e.g. (labels != -100).sum(), which is an int64 tensor"
        )
    if value.dim() != 0:
        raise InvalidValue(
            f"{name} must be one count (a 0-d tensor), got a tensor of shape {tuple(value.shape)}: sum it "
            "over the micro-batch, e.g. (labels != -100).sum()"
        )
    if value.device.type == "cpu":
        term_count(int(value), name)  # a negative count refused
    return value


class Accumulator:
    """Weighted gradient accumulation in ``.grad`` and the one update of ``optimizer``.

    ``max_grad_norm`` clips the update's gradient (after AMP unscaling); ``scaler`` is a
    ``torch.amp.GradScaler`` that the update unscales, steps and updates once.
    ``skip_nonfinite`` skips an update whose gradient is inf or NaN (False: applies it, as torch
    does, and reads nothing from the device); ``max_skips_in_a_row`` such skips in a row raise
    :class:`~aikit.core.errors.TrainingFailed` (None: never).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, max_grad_norm: float | None = None,
                 scaler: Any = None, overlap: Callable[[], bool] | None = None,
                 bucket_cap_mb: float = 25.0, skip_nonfinite: bool = True,
                 max_skips_in_a_row: int | None = MAX_SKIPS_IN_A_ROW) -> None:
        if max_grad_norm is not None:
            checked_float(max_grad_norm, "max_grad_norm", "a positive number or None", lambda norm: norm > 0)
        if scaler is not None and not all(callable(getattr(scaler, name, None)) for name in amp.SCALER_METHODS):
            raise InvalidType(f"scaler must be a torch.amp.GradScaler (or None), got {type(scaler).__name__} "
                              f"{scaler!r:.60}: scaler=torch.amp.GradScaler('cuda'), and scaler.scale(loss).backward()")
        self.optimizer = optimizer
        self.max_grad_norm = max_grad_norm
        self.scaler = scaler
        self.skip_nonfinite = checked_bool(skip_nonfinite, "skip_nonfinite")
        self.skips = SkipCount(max_skips_in_a_row)  # updates skipped (AMP's too), non-finite ones in a row
        self.outcomes = Outcomes(self.skips, scaler)  # updates applied (some decided on the device)
        self.marks = BackwardMarks(optimizer)  # which micro-steps' backward reached the parameters
        self.factor: float | None = None  # the running micro-batch's factor relative to the unit (None: 1)
        self.carried = 1.0  # .grad holds the weighted sum divided by this (folded weights)
        self._handles: list[Any] = []  # weighing hooks, registered once a micro-batch needs them
        self.outputs = OutputFactors()  # factors applied at a model's outputs (loss terms, FSDP2)
        self.terms: int | torch.Tensor = 0  # loss terms of this update's micro-steps on this replica
        self._terms_sum: tuple[torch.Tensor, Callable[[], None]] | None = None  # their sum over replicas, started
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
                mul_(grads, factor)

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

    # --- loss terms: accumulate(model, weight=n) ------------------------------------------------
    def checked_terms(self, weight: Any) -> int | torch.Tensor:
        """``weight`` as a count of loss terms (:func:`checked_count`), a tensor moved to the
        parameters' device (the arithmetic never reads it, on every device alike)."""
        weight = checked_count(weight)
        device = self.device()
        if not isinstance(weight, torch.Tensor) or weight.device == device:
            return weight
        return weight.to(device, non_blocking=True)

    def device(self) -> torch.device:
        params = self.params()
        return params[0].device if params else torch.device("cpu")

    def count_terms(self, model: torch.nn.Module | None, weight: Any) -> contextlib.AbstractContextManager:
        """Add ``weight`` (checked) to this update's loss terms and return the context in which
        a micro-step's forward and backward of ``model`` weigh its gradient by it."""
        if model is None:
            raise InvalidValue(
                "accumulate(weight=...) weighs the gradient entering the model's outputs: pass the model, "
                "accumulate(model, weight=n)"
            )
        weight = self.checked_terms(weight)
        self.terms = self.terms + weight
        return self.outputs.applied(model, weight)

    def start_terms_sum(self) -> None:
        """Start summing this update's loss terms over the replicas (before the last backward,
        where DDP's or FSDP2's own collective carries the gradients: it overlaps them)."""
        device = self.device()
        count = torch.as_tensor(self.terms, device=device).to(torch.int64).reshape(1).clone()
        wait = (collectives.start_all_reduce_sum_(count, "aikit.ga.terms") if collectives.can_start_all_reduce(device)
                else lambda: collectives.all_reduce_sum_([count]))
        self._terms_sum = count, wait

    def take_terms(self, summed: bool = False) -> int | torch.Tensor:
        """This update's loss terms, summed over the replicas when ``summed`` (waiting for the
        sum :meth:`start_terms_sum` started, or summing now), and the count reset to 0."""
        if summed and self._terms_sum is None:
            self.start_terms_sum()
        terms, self.terms = self.terms, 0
        if not summed:
            return terms
        count, wait = self._terms_sum
        self._terms_sum = None
        wait()
        return count.reshape(())

    def terms_scale(self, total: int | float | torch.Tensor, averaging_replicas: int = 1) -> Any:
        """:func:`aikit.core.ga.mean_scale` of a total of loss terms. A number is checked (no
        terms at all: refused, the gradients cleared); so is a tensor on the CPU, where reading
        it costs nothing. A tensor stays a tensor, in the gradients' precision and kept at least
        1: on an accelerator an update without terms steps on a zero gradient."""
        on_device = isinstance(total, torch.Tensor)
        if not on_device or total.device.type == "cpu":
            try:
                mean_scale(int(total) if on_device else total)
            except InvalidValue:
                self.discard()
                self.optimizer.zero_grad()
                raise
        return mean_scale(total.to(self._grad_dtype()).clamp(min=1) if on_device else total, 1, averaging_replicas)

    def _grad_dtype(self) -> torch.dtype:
        params = self.params()
        return params[0].dtype if params and params[0].dtype in (torch.float32, torch.float64) else torch.float32

    # --- the update ----------------------------------------------------------------------------
    @torch.no_grad()
    def reduce(self, counts: list[float] = ()) -> list[float]:
        """Sum every gradient, and ``counts``, over the replicas: in the buckets the last backward
        started (:class:`Buckets`, where there are), else in one grouped all-reduce.

        A replica with no gradient for a parameter adds zeros; a parameter no replica touched
        keeps no gradient, as in one process (except on XLA, where telling would need a read
        from the device: it gets a zero gradient). ``counts`` may hold 0-d tensors (loss terms
        counted on the device). Returns the summed ``counts``, read.
        """
        params = self.params()
        if not params:
            return list(counts)
        if any(p.grad is not None and p.grad.is_sparse for p in params):
            self.discard()
            raise InvalidValue(
                "a sparse gradient (nn.Embedding(sparse=True) or similar) cannot be summed over replicas at "
                "the update: use dense gradients, or DDP with aikit's GA Optimizer"
            )
        device = params[0].device
        dtype = params[0].dtype if params[0].dtype in (torch.float32, torch.float64) else torch.float32
        if self.buckets is not None and collectives.can_start_all_reduce(device):
            summed = self.buckets.finish(counts, dtype)
            self.carried = 1.0
            return summed
        if self.carried != 1:  # each replica folded its own factor: unfold it before summing
            self._rescale(self.carried)
            self.carried = 1.0
        grads = or_zeros(params)
        if collectives.lazy(device):
            # every replica must run the same program around an XLA collective: cut the graph
            # here, so a replica that had no micro-batch and one that did run the same graph
            collectives.mark_step(device)
            extra = stacked(list(counts), dtype, device)
            collectives.all_reduce_sum_([*grads, extra] if counts else grads)
            for p, grad in zip(params, grads, strict=True):
                p.grad = grad
            return extra.tolist() if counts else []
        flags = stacked([*(float(p.grad is not None) for p in params), *counts], dtype, device)
        collectives.all_reduce_sum_([*grads, flags])
        summed = flags.tolist()
        for p, grad, used in zip(params, grads, summed, strict=False):
            p.grad = grad if used else None
        return summed[len(params):]

    def discard(self) -> None:
        """Forget the sums started from the last backward (a load or a failed update replaces
        the gradients they were started from) and the window's micro-steps; local, nothing is
        waited for."""
        self._forget_sums()
        self.marks.restart()

    def _forget_sums(self) -> None:
        if self.buckets is not None:
            self.buckets.reset()
        self.terms, self._terms_sum = 0, None

    def end_micro_step(self, expect_backward: bool = True) -> None:
        """A wrapper's ``step()`` ended a micro-step: note whether its backward reached the
        parameters (``expect_backward`` False: an empty micro-batch, which needs none)."""
        self.marks.end_micro_step(expect_backward)

    def update(self, scale: float | torch.Tensor) -> bool | None:
        """Multiply the accumulated gradients by ``scale``, unscale (AMP), clip, update, clear.

        Returns whether the update was applied: False when it was skipped for an inf/NaN gradient
        (by AMP's scaler, or by the finiteness check: the gradients cleared, nothing stepped);
        None where a fused optimizer decided on the device (``outcomes.settle()`` reads it)."""
        params = self.params()
        grads = [p.grad for p in params if p.grad is not None]
        self.marks.check(bool(grads))  # a forgotten backward() warned about
        self._forget_sums()  # an update without the sum over replicas (one replica) started none
        scale, self.carried = scale * self.carried, 1.0
        checked = None  # the update's inf/NaN flag, where one pass scaled and checked the gradients
        if grads and self.skip_nonfinite and self.scaler is None and self.max_grad_norm is None:
            checked = scale_and_check_(grads, scale)
        if (isinstance(scale, torch.Tensor) or scale != 1) and grads and checked is None:  # a tensor: not read
            mul_(grads, scale)
        norm = found = None  # the update's total gradient norm, where clipping computes it; AMP's inf/NaN flag
        if amp.enabled(self.scaler):
            self.scaler.unscale_(self.optimizer)  # before clipping: the norm is the true gradient's
            found = amp.found_inf(self.scaler, self.optimizer)
        if self.max_grad_norm is not None:
            if any(g.is_sparse for g in grads):
                self.optimizer.zero_grad()
                self.marks.restart()
                raise InvalidValue(
                    f"max_grad_norm={self.max_grad_norm} cannot clip sparse gradients (nn.Embedding(sparse=True) "
                    "or similar): use dense gradients, or max_grad_norm=None and clip the dense parameters yourself"
                )
            norm = torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        if found is None and checked is not None and amp.decides_on_device(self.optimizer):
            amp.step_unless(self.optimizer, checked)
            self.outcomes.flag(checked)
            stepped = None
        elif found is None:
            if self.skip_nonfinite and grads and not self._finite(grads, norm, checked):
                return self.outcomes.record(False)
            self.optimizer.step()
            stepped = True
        else:
            stepped = amp.amp_step(self.scaler, self.optimizer, found)
            if stepped is None:
                self.outcomes.flag(found)
        self.optimizer.zero_grad()
        self.marks.restart()
        if stepped is None:
            if self.outcomes.due():
                self.outcomes.settle()  # a run of non-finite skips refused in time, the flags kept few
            return None
        if found is not None:  # AMP's scaler decided, on the host: its skips count in a run too
            self.outcomes.settle()
            self.skips.applied() if stepped else self.skips.amp_skipped(self.scaler.get_scale)
        return self.outcomes.record(stepped)

    def _finite(self, grads: list[torch.Tensor], norm: torch.Tensor | None, checked: torch.Tensor | None) -> bool:
        """Whether the update's gradient is finite (one read from the device: the flag ``checked``
        made, else the total norm, clipping's ``norm`` where it made one); if not the update is
        skipped: gradients cleared, counted, warned once, and a run of ``max_skips_in_a_row`` refused."""
        if checked is not None and not checked.item():  # the one read: finite
            self.skips.applied()
            return True
        value = read_norm(total_norm(grads) if norm is None else norm)  # after a flag, only to say what was skipped
        if math.isfinite(value):
            self.skips.applied()
            return True
        self.optimizer.zero_grad()
        self.marks.restart()
        self.skips.nonfinite(f"total norm {value}")
        return False
