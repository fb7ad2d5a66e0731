"""Gradient accumulation for any torch optimizer: ``Optimizer(optimizer, steps)``.

``steps`` micro-batches make one real update that equals one step on their concatenated batch.
The wrapped optimizer is kept as it is (its state, defaults and hooks survive; the Run:AI
original re-created it as a dynamic subclass and lost them) and its ``step()`` runs once per
update, so its step count, Adam's bias correction, weight decay and gradient clipping advance
once per update. An LR scheduler does too when wrapped in :class:`UpdateScheduler` (as
Accelerate prepares schedulers), so a loop written for plain torch, calling
``scheduler.step()`` after every ``optimizer.step()``, moves the LR once per update.

Gradients are averaged, not summed (``reduction="sum"`` sums them, as Run:AI's original did, for
a sum-reduced loss): the accumulated ``.grad`` is multiplied once at the update
by the weight :mod:`aikit.core.ga` gives (``1 / micro-steps accumulated``, or for micro-batches
declared with ``accumulate(model, samples=n)`` their share ``n / G`` of the global batch, times
the world size under DDP, which averages over processes). Weights are taken relative to the
micro-batch size most of the update shares, so even micro-batches cost no multiply and a
ragged plan pays one (a gradient hook) only for the micro-batches of the other size.

With ``reduce=True`` the wrapper itself sums the gradients over the replicas at the update,
with the samples they held (Horovod, or torchrun without DDP; see
:mod:`aikit.elastic.Torch.horovod`): every update, an epoch's last short one included
(:meth:`Optimizer.flush`), is then the mean over the samples it actually saw, and the world size
is read at every update, so an elastic resize scales right. The micro-steps before the last
communicate nothing; during the last one's backward, buckets of final gradients start their
all-reduce while the backward goes on (:class:`aikit.runtime.Torch.buckets.Buckets`, as DDP and
Horovod overlap theirs), and ``step()`` waits for them before weighing, unscaling and clipping.

Run:AI's prebuilt GA optimizers are here too, one per optimizer class ``torch.optim`` ships
(found at import, named as torch names them), in the original's argument order:
``SGD(steps, params, lr=0.1, momentum=0.9)`` is ``Optimizer(torch.optim.SGD(params, lr=0.1,
momentum=0.9), steps)``, a subclass of :class:`Optimizer`, which takes the wrapper's keywords too
(made by :mod:`aikit.ga.Torch.runai`, with the conversion of Run:AI's checkpoints).
:class:`UpdateScheduler` (:mod:`aikit.ga.Torch.scheduler`) is importable from here too.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch

from aikit.core.errors import InvalidType, InvalidValue
from aikit.core.ga import (
    common_size,
    equal_weight,
    reduction_name,
    relative_weight,
    sample_weight,
    short_window_factor,
)
from aikit.core.validate import checked_int, non_negative_int, positive_int
from aikit.ga.Torch.runai import from_runai, prebuilt_classes
from aikit.ga.Torch.scheduler import UpdateScheduler  # noqa: F401  (its public path: aikit.ga.Torch.optim)
from aikit.runtime.published import latest_plan
from aikit.runtime.Torch import engines
from aikit.runtime.Torch.accumulator import Accumulator
from aikit.runtime.Torch.buckets import bucket_bytes
from aikit.runtime.Torch.distributed import world_size
from aikit.runtime.Torch.gradient_sync import accumulates_out_of_reach, sync_skipper
from aikit.runtime.Torch.state_checks import check_groups, check_pending
from aikit.runtime.Torch.wrapping import WrappingOptimizer

_STATE_KEYS = {"optimizer", "ga"}
_GA_KEYS = {"steps", "position", "micro_steps", "reduction", "samples", "weighted", "unit", "terms", "pending_grads"}
_GA_KEYS_BEFORE_TERMS = _GA_KEYS - {"terms"}  # checkpoints saved before accumulate(weight=) existed


class Optimizer(WrappingOptimizer):
    """Accumulate ``steps`` micro-batches, then update ``optimizer`` once.

    A real ``torch.optim.Optimizer``: ``param_groups``, ``state`` and ``defaults`` are the
    wrapped optimizer's, state-dict hooks registered on the wrapper run, step hooks run around
    the real update.

    Args:
        optimizer: any torch optimizer, already built.
        steps: micro-batches per update (``aikit.elastic.Torch.steps``).
        global_batch_size: samples per update, needed only with ``accumulate(samples=...)``;
            defaults to the plan of ``aikit.elastic.Torch.init``.
        max_grad_norm: clip the accumulated gradient to this norm before each update.
        scaler: a ``torch.amp.GradScaler``; the wrapper unscales, steps and updates it once
            per update (call only ``scaler.scale(loss).backward()`` yourself).
        reduce: sum the gradients over the replicas at the update (no DDP: Horovod, or
            torchrun with a plain model); the micro-steps communicate nothing.
        reduction: ``"mean"`` (default) makes the update the mean over the window, right for
            a mean loss; ``"sum"`` sums the micro-batch gradients as Run:AI's original did,
            right for a sum-reduced loss (``accumulate(samples=...)`` is refused with it).
        bucket_cap_mb: with ``reduce``, the size of the buckets whose all-reduce starts while
            the update's last backward runs (DDP's default, 25); None: one all-reduce of every
            gradient after that backward, no hooks.
        sync_every_micro_step: let ``accumulate(model)`` sync the gradients in every backward
            instead of only the update's last: under FSDP2 each micro-step then reduce-scatters,
            so only sharded gradients are kept (less memory, ``steps`` times the communication);
            the default (False) keeps unsharded gradients between updates and reduce-scatters once.
    """

    kind = "GA Optimizer"

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        steps: int,
        *,
        global_batch_size: int | None = None,
        max_grad_norm: float | None = None,
        scaler: Any = None,
        reduce: bool = False,
        reduction: str = "mean",
        bucket_cap_mb: float | None = 25.0,
        sync_every_micro_step: bool = False,
    ) -> None:
        if hasattr(optimizer, "synchronize") and hasattr(optimizer, "skip_synchronize"):
            raise InvalidType(
                "optimizer is a horovod DistributedOptimizer, which all-reduces from backward hooks while "
                "this wrapper averages and clips the same gradients: wrap the plain torch optimizer with "
                "aikit.elastic.Torch.horovod.DistributedOptimizer(optimizer, steps) instead"
            )
        reduction = reduction_name(reduction)
        super().__init__(optimizer)
        if _closure_required(optimizer):
            raise InvalidType(
                f"{type(optimizer).__name__}.step(closure) needs a closure, which it evaluates many times per "
                "update (L-BFGS's line search), but gradient accumulation evaluates each micro-step's closure "
                "once: train it without GA, on the whole batch"
            )
        if bucket_cap_mb is not None:
            bucket_bytes(bucket_cap_mb)  # a bad value is refused whatever reduce is
        self.bucket_cap_mb = bucket_cap_mb
        overlap = self._ends_update if reduce and bucket_cap_mb is not None else None
        self.engine = Accumulator(optimizer, max_grad_norm=max_grad_norm, scaler=scaler, overlap=overlap,
                                  bucket_cap_mb=bucket_cap_mb)
        self._steps = positive_int(steps, "steps")
        self.global_batch_size = None if global_batch_size is None else positive_int(
            global_batch_size, "global_batch_size"
        )
        self.reduce = bool(reduce)
        if self.reduce and sync_every_micro_step:
            raise InvalidValue(
                "sync_every_micro_step=True asks DDP or FSDP2 to sync the gradients in every backward, but this "
                "optimizer sums them over the replicas itself at the update (reduce=True): leave out one of the two"
            )
        self.sync_every_micro_step = bool(sync_every_micro_step)
        self.reduction = reduction
        self.position = 0  # micro-steps taken towards the next update
        self.micro_steps = 0  # every step() call so far (Run:AI's ``runai.step``); ``applied`` counts updates
        self.updated = False  # whether the last step() call made a real update
        self.applied = 0  # real updates applied by this object (AMP skips not counted): for schedulers
        self._samples = 0  # samples declared in this window (accumulate(samples=...))
        self._weighted = 0  # micro-steps of this window that declared their samples or loss terms
        self._declared: str | None = None  # what they declared: "samples" or "weight" (None: nothing yet)
        self._unit: int | None = None  # the micro-batch size this window's weights are relative to
        engines.current().keep_whole(Optimizer)  # Horovod's hvd.elastic.TorchState: its whole state_dict

    @property
    def max_grad_norm(self) -> float | None:
        return self.engine.max_grad_norm

    @property
    def scaler(self) -> Any:
        return self.engine.scaler

    @property
    def steps(self) -> int:
        """Micro-batches per update; may change between updates (a new plan, a trace)."""
        return self._steps

    @steps.setter
    def steps(self, steps: int) -> None:
        steps = positive_int(steps, "steps")
        if self.position:
            raise InvalidValue(
                f"steps can change only between updates, but {self.position} of {self._steps} "
                f"micro-steps are accumulated: set steps={steps} when optimizer.position == 0"
            )
        self._steps = steps

    @property
    def sync_gradients(self) -> bool:
        """True when the next ``step()`` makes the real update: the micro-step whose backward
        must all-reduce under DDP, and where you would unscale or clip by hand."""
        return self.position == self._steps - 1

    def _ends_update(self) -> bool:
        """Whether a backward now is the last of an update: the overlapped all-reduce's hooks
        start buckets only then (a weak reference: hooks must not keep a dropped optimizer)."""
        return self.sync_gradients

    def __repr__(self) -> str:
        reduction = "" if self.reduction == "mean" else f", reduction={self.reduction!r}"
        return f"aikit.ga.Torch.optim.Optimizer({self.optimizer!r}, steps={self._steps}{reduction})"

    # --- the training loop ---------------------------------------------------------------------
    @contextlib.contextmanager
    def accumulate(self, model: torch.nn.Module | None = None, samples: int | None = None,
                   weight: int | torch.Tensor | None = None) -> Iterator[None]:
        """Run one micro-step's forward and backward inside this context.

        Under DDP and FSDP2 it skips the gradient sync (``model.no_sync()``,
        ``set_requires_gradient_sync(False)``: :mod:`aikit.runtime.Torch.gradient_sync`) on
        every micro-step but the last of an update. Declare in every micro-step of an update,
        or in none, what the micro-batch's mean loss is a mean over:

        * ``samples=n``: its samples; the micro-batch weighs ``n / global_batch_size``, which
          makes ragged and per-rank-uneven micro-batches exact;
        * ``weight=n``: its loss terms (a language model's tokens whose label is not ignored),
          an int or a 0-d integer tensor (not read on an accelerator: no host sync). The
          update's gradient is Σ nᵢ·gᵢ / Σ nᵢ over every micro-step and replica, the total
          summed at the update. The weight is applied to the gradient entering ``model``'s
          outputs (:mod:`aikit.runtime.Torch.output_weights`): run its forward in here.
        """
        skip_sync = sync_skipper(model)
        if self.reduce and skip_sync is not None:
            raise InvalidValue(
                f"this optimizer sums gradients over the replicas itself (reduce=True), but the model is a "
                f"{type(model).__name__}, which syncs them too: pass the plain model, or use reduce=False with "
                "DDP or FSDP2"
            )
        declared = "weight" if weight is not None else "samples" if samples is not None else None
        if samples is not None and weight is not None:
            raise InvalidValue(
                f"accumulate() got samples={samples} and weight={weight}: a micro-batch's mean loss is a mean over "
                "its samples (samples=) or over its loss terms, such as tokens (weight=), not both"
            )
        if declared is not None and self._declared not in (None, declared):
            raise InvalidValue(
                f"this micro-step declares {declared}=, but the update's earlier ones declared {self._declared}=: "
                "declare the same in every micro-step of an update"
            )
        weighing = contextlib.nullcontext()
        if weight is not None:
            weighing = self._count_terms(weight, model, skip_sync)
        elif samples is not None:
            samples = non_negative_int(samples, "samples")
            weighing = self._weigh_samples(samples, model, skip_sync)
        sync = self.sync_gradients or self.reduce or self.sync_every_micro_step
        try:
            with weighing, contextlib.nullcontext() if sync or skip_sync is None else skip_sync():
                yield
        finally:
            if declared is not None:
                self.engine.factor = None
                self._samples += samples or 0
                self._weighted += 1
                self._declared = declared

    def _count_terms(self, weight: Any, model: torch.nn.Module | None,
                     skip_sync: Callable[[], Any] | None) -> contextlib.AbstractContextManager:
        """``weight`` checked and counted; under DDP or FSDP2 the terms' sum over the replicas
        starts before the update's last backward, whose gradient sync they own."""
        if self.reduction == "sum":
            raise InvalidValue(
                f"accumulate(weight={weight}) weighs a mean loss's micro-batch by its loss terms, but this optimizer "
                "sums the micro-batch gradients (reduction='sum'), where a summed loss already counts its terms: "
                "leave out weight=, or use reduction='mean' with a mean loss"
            )
        world = world_size()
        if world > 1 and not self.reduce and skip_sync is None and model is not None:
            raise InvalidValue(
                f"accumulate(model, weight=...) on {world} replicas needs their gradients summed, but "
                f"{type(model).__name__} syncs none: wrap it in DistributedDataParallel or fully_shard, or use "
                "Optimizer(..., reduce=True) with the plain model"
            )
        weighing = self.engine.count_terms(model, weight)
        if world > 1 and not self.reduce and self.sync_gradients:
            self.engine.start_terms_sum()  # it overlaps the last backward
        return weighing

    def _weigh_samples(self, samples: int, model: torch.nn.Module | None,
                       skip_sync: Callable[[], Any] | None) -> contextlib.AbstractContextManager:
        if self.reduction == "sum":
            raise InvalidValue(
                f"accumulate(samples={samples}) weighs a mean loss's micro-batch by its share of the global "
                "batch, but this optimizer sums the micro-batch gradients (reduction='sum'), where a summed "
                "loss already counts its samples: leave out samples=, or use reduction='mean' with a mean loss"
            )
        if self._unit is None:
            self._unit = common_size(self._global_batch_size(samples), self._steps * world_size())
        factor = relative_weight(samples, self._unit)
        if accumulates_out_of_reach(model):  # FSDP2: the gradients accumulate unsharded, not in .grad
            return contextlib.nullcontext() if factor is None else self.engine.outputs.applied(model, factor)
        framework_syncs = skip_sync is not None and not self.reduce and (self.sync_gradients
                                                                         or self.sync_every_micro_step)
        self.engine.weigh_next(factor, fold=not framework_syncs)
        return contextlib.nullcontext()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients at the start of an update only; mid-update it keeps them (the
        wrapper clears them itself after every update, so calling this is optional)."""
        if self.position == 0:  # set_to_none only when asked: Run:AI-era optimizers define zero_grad(self)
            self.optimizer.zero_grad() if set_to_none else self.optimizer.zero_grad(set_to_none=False)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Count one micro-step (evaluating ``closure`` once if given) and update on the last."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.position += 1
        self.updated = self.position == self._steps
        if self.updated:
            self.updated = self._update(short=False)
        self.micro_steps += 1
        return loss

    def flush(self) -> bool:
        """Update now on the micro-steps accumulated so far (an epoch's last, shorter window);
        True if it updated. Every replica must call it at the same point."""
        if self.position == 0:
            return False
        if not self.reduce and world_size() > 1:
            raise InvalidValue(
                "flush() needs the gradients summed at the update, but under DDP the micro-steps of a short "
                "window were never all-reduced: use Optimizer(..., reduce=True) with the plain model, or feed "
                "whole windows"
            )
        self.updated = self._update(short=True)
        return self.updated

    def _update(self, short: bool) -> bool:
        """The real update on the accumulated, weighted gradient; False if AMP skipped it."""
        steps, weighted, samples, unit, declared = (self.position, self._weighted, self._samples, self._unit,
                                                    self._declared)
        self.position = self._samples = self._weighted = 0
        self._unit = self._declared = None
        if weighted not in (0, steps):
            self.engine.discard()
            self.optimizer.zero_grad()
            raise InvalidValue(
                f"only {weighted} of the {steps} micro-steps of this update declared {declared}= in "
                "accumulate(): declare them in every micro-step or in none"
            )
        world = world_size()  # read at every update: an elastic resize changes it
        if declared == "weight":  # DDP and FSDP2 average over the processes; reducing sums
            stepped = self.engine.step(self.engine.terms_scale(self._summed_terms(world), 1 if self.reduce else world))
            self.applied += stepped
            return stepped
        if self.reduce and world > 1:
            (samples,) = self.engine.reduce([float(samples)])
            samples = round(samples)
        if not weighted:  # reducing, the replicas' sum is divided by the world; DDP averages it itself
            scale = equal_weight(steps, self.reduction, world, 1 if self.reduce else world)
        else:
            total = self._global_batch_size(samples)
            # reducing, the samples are summed with the gradients: a short window (an epoch's last)
            # is exactly corrected to its mean; alone, only flush() says a window is short on purpose
            if (samples > total and (self.reduce or world == 1)) or (world == 1 and not self.reduce
                                                                   and not short and samples != total):
                self.engine.discard()
                self.optimizer.zero_grad()
                raise InvalidValue(
                    f"the {steps} micro-batches of this update held {samples} samples, but "
                    f"global_batch_size is {total}: feed exactly that many per update, or call "
                    "optimizer.flush() after an epoch's last, shorter window"
                )
            averaging = 1 if self.reduce else world  # DDP averages over the processes
            scale = sample_weight(unit, total, averaging)
            if samples != total and (self.reduce or world == 1):
                scale *= short_window_factor(total, samples)
        stepped = self.engine.step(scale)
        self.applied += stepped
        return stepped

    def _summed_terms(self, world: int) -> int | float | torch.Tensor:
        """This update's loss terms over every replica: with the gradients in the update's own
        all-reduce (reducing), from the sum started before the last backward (DDP, FSDP2), or
        this process's alone."""
        if world == 1:
            return self.engine.take_terms()
        if self.reduce:
            (total,) = self.engine.reduce([self.engine.take_terms()])
            return total
        return self.engine.take_terms(summed=True)

    # --- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state and the accumulation position, with the gradients
        accumulated so far when saved mid-update, so a resume continues identically."""

        def build() -> dict[str, Any]:
            pending = self.engine.pending() if self.position else []
            return {
                "optimizer": self.optimizer.state_dict(),
                "ga": {
                    "steps": self._steps,
                    "position": self.position,
                    "micro_steps": self.micro_steps,
                    "reduction": self.reduction,
                    "samples": self._samples,
                    "weighted": self._weighted,
                    "unit": self._unit,
                    "terms": self._saved_terms(),
                    "pending_grads": pending,
                },
            }

        return self._run_state_dict_hooks(build)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore ``state_dict()``; strict about its keys, and checked whole before anything
        changes. Saved between updates, it may be loaded with a different ``steps`` (an elastic
        restart on other hardware). Run:AI's AIkit's GA state_dict (its counter in
        ``state['runai']``, a sum) loads too, saved between updates, into ``reduction="sum"``.
        Local: no collective."""
        self._run_load_hooks(state_dict, self._load)

    def _load(self, state_dict: dict[str, Any]) -> None:
        state_dict = from_runai(state_dict)
        self.check_state(state_dict)
        ga = state_dict["ga"]
        position, params = ga["position"], self._params()
        self.optimizer.load_state_dict(state_dict["optimizer"])
        for p, grad in zip(params, ga["pending_grads"] if position else [None] * len(params), strict=True):
            p.grad = None if grad is None else grad.to(device=p.device, dtype=p.dtype).clone()
        self.engine.carried = 1.0  # the saved gradients are the plain weighted sum
        self.engine.discard()  # sums started from the gradients just replaced
        self._restore_position(ga)
        self.updated = False

    def _saved_terms(self) -> int | None:
        """This update's loss terms so far on this replica (None: it declared no weight=), read
        from the device if they are there: a checkpoint holds numbers."""
        return None if self._declared != "weight" else int(self.engine.terms)

    def _restore_position(self, ga: dict[str, Any]) -> None:
        """The position in the update that ``ga`` (a checked ``state_dict()["ga"]``) saved."""
        self.position, self._samples, self._weighted, self._unit = ga["position"], ga["samples"], ga["weighted"], \
            ga["unit"]
        self.micro_steps = ga["micro_steps"]
        terms = ga.get("terms")
        self._declared = "weight" if terms is not None else "samples" if ga["weighted"] else None
        self.engine.terms = terms or 0

    def check_state(self, state_dict: dict[str, Any]) -> None:
        """Every reason ``state_dict`` cannot be loaded, before anything is changed."""
        state_dict = from_runai(state_dict)
        if not isinstance(state_dict, dict) or set(state_dict) != _STATE_KEYS:
            if isinstance(state_dict, dict) and "param_groups" in state_dict:
                raise InvalidValue(
                    "this is a torch optimizer's state_dict, not an aikit GA Optimizer's: load it "
                    "with optimizer.optimizer.load_state_dict(...)"
                )
            keys = sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict).__name__
            raise InvalidValue(f"GA Optimizer state_dict needs keys {sorted(_STATE_KEYS)}, got {keys}")
        ga = state_dict["ga"]
        if not isinstance(ga, dict) or set(ga) not in (_GA_KEYS, _GA_KEYS_BEFORE_TERMS):
            got = sorted(ga) if isinstance(ga, dict) else type(ga).__name__
            raise InvalidValue(f"GA Optimizer state_dict['ga'] needs keys {sorted(_GA_KEYS)}, got {got}")
        _check_counters(ga)
        position = ga["position"]
        if ga["reduction"] != self.reduction:
            raise InvalidValue(
                f"the checkpoint was saved by an optimizer with reduction={ga['reduction']!r}, this one has "
                f"reduction={self.reduction!r}: build it with reduction={ga['reduction']!r} (the reduction goes "
                "with the loss the run uses)"
            )
        if position and ga["steps"] != self._steps:
            raise InvalidValue(
                f"the checkpoint was saved {position} micro-steps into an update of steps={ga['steps']}, "
                f"but this optimizer has steps={self._steps}: resume with steps={ga['steps']}, or save "
                "between updates (optimizer.position == 0) to change steps"
            )
        check_groups(self.optimizer, state_dict["optimizer"])
        if position:
            check_pending(self._params(), ga["pending_grads"])

    def __getstate__(self) -> dict[str, Any]:
        return {
            "optimizer": self.optimizer,
            "global_batch_size": self.global_batch_size,
            "max_grad_norm": self.max_grad_norm,
            "scaler": self.scaler,
            "reduce": self.reduce,
            "bucket_cap_mb": self.bucket_cap_mb,
            "sync_every_micro_step": self.sync_every_micro_step,
            "ga": self.state_dict()["ga"],
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        Optimizer.__init__(  # not self.__init__: subclasses (the prebuilt optimizers) take other arguments
            self,
            state["optimizer"],
            state["ga"]["steps"],
            global_batch_size=state["global_batch_size"],
            max_grad_norm=state["max_grad_norm"],
            scaler=state["scaler"],
            reduce=state["reduce"],
            reduction=state["ga"]["reduction"],
            bucket_cap_mb=state.get("bucket_cap_mb", 25.0),
            sync_every_micro_step=state.get("sync_every_micro_step", False),
        )
        ga = state["ga"]
        for p, grad in zip(self._params(), ga["pending_grads"] or [None] * len(self._params()), strict=True):
            p.grad = grad
        self._restore_position(ga)

    # --- parameters and their gradient hooks ---------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        if "optimizer" in self.__dict__ and self.engine._handles:
            self.engine.hook(self.optimizer.param_groups[-1]["params"])
        if "optimizer" in self.__dict__ and self.engine.buckets is not None:
            self.engine.buckets.build(self.engine.params())

    def _global_batch_size(self, samples: int) -> int:
        if self.global_batch_size is not None:
            return self.global_batch_size
        plan = latest_plan()
        if plan is None:
            raise InvalidValue(
                f"accumulate(samples={samples}) weighs the micro-batch by samples / global batch, but "
                "no global batch is known: pass Optimizer(..., global_batch_size=G) or call "
                "aikit.elastic.Torch.init(G, max_device_batch) first"
            )
        return plan.global_batch_size


def _check_counters(ga: dict[str, Any]) -> None:
    """The saved counters are what this wrapper writes: ``position`` in ``[0, steps)`` (a state
    that says 7 of 4 would never update again), counts non-negative, the reduction a name."""
    steps = positive_int(ga["steps"], "the checkpoint's GA steps")
    checked_int(ga["position"], "the checkpoint's GA position", 0, steps - 1,
                f"an integer in [0, {steps}) for steps={steps}", "restore an intact commit (was the state edited?)")
    for key in ("micro_steps", "samples", "weighted"):
        non_negative_int(ga[key], f"the checkpoint's GA {key}")
    if ga["unit"] is not None:
        positive_int(ga["unit"], "the checkpoint's GA unit")
    if ga.get("terms") is not None:
        non_negative_int(ga["terms"], "the checkpoint's GA terms")
    reduction_name(ga["reduction"])


def _closure_required(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step`` takes a ``closure`` without a default (L-BFGS)."""
    try:
        closure = inspect.signature(optimizer.step).parameters.get("closure")
    except (TypeError, ValueError):  # a builtin or C step: nothing to read
        return False
    return closure is not None and closure.default is closure.empty


PREBUILT = prebuilt_classes(Optimizer, __name__)  # Run:AI's Adam(steps, params, ...) and the rest
globals().update(PREBUILT)
