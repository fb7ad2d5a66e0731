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

An update whose gradient is inf or NaN is skipped, as a GradScaler skips one: no weight changes
and nothing that counts updates advances (``updated`` is False, ``skipped`` counts it); the first
is warned about, ``max_skips_in_a_row`` in a row raise :class:`~aikit.core.errors.TrainingFailed`
(:mod:`aikit.core.skips`). Without AMP that costs one read of the gradient's total norm per
update (the norm clipping uses); ``skip_nonfinite=False`` reads nothing and applies the gradient,
as torch does. A ``step()`` without a backward since the one before is warned about.

What an update's micro-steps declared and the weights that follow live in
``aikit.ga.Torch.window``; the ``state_dict`` format and its checks in ``aikit.ga.Torch.state``.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch

from aikit.core.errors import InvalidType, InvalidValue
from aikit.core.ga import reduction_name
from aikit.core.skips import MAX_SKIPS_IN_A_ROW
from aikit.core.validate import positive_int
from aikit.ga.Torch.runai import from_runai, prebuilt_classes
from aikit.ga.Torch.scheduler import UpdateScheduler  # noqa: F401  (its public path: aikit.ga.Torch.optim)
from aikit.ga.Torch.state import check_state, ga_state
from aikit.ga.Torch.window import KeptNames, Window
from aikit.runtime.exports import served
from aikit.runtime.Torch import engines
from aikit.runtime.Torch.accumulator import Accumulator
from aikit.runtime.Torch.buckets import bucket_bytes
from aikit.runtime.Torch.collectives import reduce_and_commit
from aikit.runtime.Torch.distributed import world_size
from aikit.runtime.Torch.gradient_sync import sync_skipper
from aikit.runtime.Torch.wrapping import WrappingOptimizer, with_load_hooks, with_state_dict_hooks


class Optimizer(KeptNames, WrappingOptimizer):
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
        skip_nonfinite: skip an update whose gradient is inf or NaN (the default; without a
            ``scaler`` it reads the gradient's total norm once per update); False applies it, as
            torch's optimizers do, and reads nothing.
        max_skips_in_a_row: this many non-finite updates skipped in a row raise
            :class:`~aikit.core.errors.TrainingFailed` (default 10; None: skip for ever).
    """

    kind = "GA Optimizer"

    def __init__(self, optimizer: torch.optim.Optimizer, steps: int, *, global_batch_size: int | None = None,
                 max_grad_norm: float | None = None, scaler: Any = None, reduce: bool = False, reduction: str = "mean",
                 bucket_cap_mb: float | None = 25.0, sync_every_micro_step: bool = False, skip_nonfinite: bool = True,
                 max_skips_in_a_row: int | None = MAX_SKIPS_IN_A_ROW) -> None:
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
                                  bucket_cap_mb=bucket_cap_mb, skip_nonfinite=skip_nonfinite,
                                  max_skips_in_a_row=max_skips_in_a_row)
        self._micro_steps = positive_int(steps, "steps")
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
        self.window = Window(self.engine)  # this update's micro-steps so far, and what they declared
        self.micro_steps_taken = 0  # every step() call so far (Run:AI's ``runai.step``); ``applied`` counts updates
        self.updated, self.committed = False, True  # the last step(): updated (None: read when asked), committed
        engines.current().keep_whole(Optimizer)  # Horovod's hvd.elastic.TorchState: its whole state_dict

    @property
    def max_grad_norm(self) -> float | None:
        return self.engine.max_grad_norm

    @property
    def scaler(self) -> Any:
        return self.engine.scaler

    @property
    def micro_step(self) -> int:
        """Micro-steps taken towards the next update (0 between updates)."""
        return self.window.micro_step

    @property
    def steps(self) -> int:
        """Micro-batches per update; may change between updates (a new plan, a trace)."""
        return self._micro_steps

    @steps.setter
    def steps(self, steps: int) -> None:
        steps = positive_int(steps, "steps")
        if self.micro_step:
            raise InvalidValue(
                f"steps can change only between updates, but {self.micro_step} of {self._micro_steps} "
                f"micro-steps are accumulated: set steps={steps} when optimizer.micro_step == 0"
            )
        self._micro_steps = steps

    @property
    def sync_gradients(self) -> bool:
        """True when the next ``step()`` makes the real update: the micro-step whose backward
        must all-reduce under DDP, and where you would unscale or clip by hand."""
        return self.micro_step == self._micro_steps - 1

    def _ends_update(self) -> bool:
        """Whether a backward now is the last of an update: the overlapped all-reduce's hooks
        start buckets only then (a weak reference: hooks must not keep a dropped optimizer)."""
        return self.sync_gradients

    def __repr__(self) -> str:
        reduction = "" if self.reduction == "mean" else f", reduction={self.reduction!r}"
        return f"aikit.ga.Torch.optim.Optimizer({self.optimizer!r}, steps={self._micro_steps}{reduction})"

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
        declared, samples = self.window.declaration(samples, weight, self.reduction)
        weighing = contextlib.nullcontext() if declared is None else self._weighing(model, samples, weight, skip_sync)
        sync = self.sync_gradients or self.reduce or self.sync_every_micro_step
        try:
            with weighing, contextlib.nullcontext() if sync or skip_sync is None else skip_sync():
                yield
        finally:
            if declared is not None:
                self.engine.factor = None
                self.window.declare(declared, samples, weight)

    def _weighing(self, model: torch.nn.Module | None, samples: int | None, weight: Any,
                  skip_sync: Callable[[], Any] | None) -> contextlib.AbstractContextManager:
        """The window's weighing of this micro-step, given who sums the gradients over the
        replicas: DDP or FSDP2 (``skip_sync``), this wrapper at the update (``reduce``), or none."""
        num_replicas = world_size() if weight is not None or self.window.unit is None else 1  # read where it matters
        if weight is not None and num_replicas > 1 and not self.reduce and skip_sync is None and model is not None:
            raise InvalidValue(
                f"accumulate(model, weight=...) on {num_replicas} replicas needs their gradients summed, but "
                f"{type(model).__name__} syncs none: wrap it in DistributedDataParallel or fully_shard, or use "
                "Optimizer(..., reduce=True) with the plain model"
            )
        framework_syncs = skip_sync is not None and not self.reduce and (self.sync_gradients
                                                                         or self.sync_every_micro_step)
        return self.window.weighing(model, samples, weight, global_batch_size=self.global_batch_size,
                                    parts=self._micro_steps * num_replicas, fold=not framework_syncs,
                                    start_sum=num_replicas > 1 and not self.reduce and self.sync_gradients)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients at the start of an update only; mid-update it keeps them (the
        wrapper clears them itself after every update, so calling this is optional)."""
        if self.micro_step == 0:  # set_to_none only when asked: Run:AI-era optimizers define zero_grad(self)
            self.optimizer.zero_grad() if set_to_none else self.optimizer.zero_grad(set_to_none=False)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Count one micro-step (evaluating ``closure`` once if given) and update on the last."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.window.micro_step += 1
        self.engine.end_micro_step(expect_backward=not self.window.take_empty())
        self.updated = False
        if self.micro_step == self._micro_steps:
            self.updated = self._update(short=False)
        self.micro_steps_taken += 1
        return loss

    def flush(self) -> bool:
        """Update now on the micro-steps accumulated so far (an epoch's last, shorter window);
        True if it updated. Every replica must call it at the same point."""
        if self.micro_step == 0:
            return False
        if not self.reduce and world_size() > 1:
            raise InvalidValue(
                "flush() needs the gradients summed at the update, but under DDP the micro-steps of a short "
                "window were never all-reduced: use Optimizer(..., reduce=True) with the plain model, or feed "
                "whole windows"
            )
        self.updated = False
        self.updated = self._update(short=True)
        return self.updated

    def restart(self) -> None:
        """Drop the micro-steps accumulated towards the next update, to run it again from its first
        micro-batch at a new plan (:class:`aikit.elastic.Torch.AutoBatch`, after out of memory)."""
        self.engine.discard()
        self.engine.factor, self.engine.carried = None, 1.0  # no micro-batch's weight folded in any more
        self.optimizer.zero_grad()
        self.window = Window(self.engine)

    def _update(self, short: bool) -> bool | None:
        """The real update; False if skipped (inf/NaN) or not committed (TorchFT), None if decided on the device."""
        window, self.window = self.window, Window(self.engine)
        self.committed, scale = reduce_and_commit(self.engine.device(), lambda: window.scale(
            reduction=self.reduction, reducing=self.reduce, short=short,
            num_replicas=world_size(), global_batch_size=self.global_batch_size))  # the world read at every update
        if not self.committed:  # TorchFT's quorum did not: nothing applied, the loop trains it again
            self.restart()
        return self.engine.update(scale) if self.committed else False

    # --- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state and the accumulation position, with the gradients
        accumulated so far when saved mid-update, so a resume continues identically (its format:
        ``aikit.ga.Torch.state``)."""
        return with_state_dict_hooks(self, lambda: {"optimizer": self.optimizer.state_dict(), "ga": self._ga_state()})

    def _ga_state(self) -> dict[str, Any]:
        terms = None if self.window.declared != "weight" else int(self.engine.terms)  # a checkpoint holds numbers
        return ga_state(self.window, micro_steps=self._micro_steps, taken=self.micro_steps_taken,
                        reduction=self.reduction, terms=terms, pending=self.engine.pending() if self.micro_step else [])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore ``state_dict()``; strict about its keys, and checked whole before anything
        changes. Saved between updates, it may be loaded with a different ``steps`` (an elastic
        restart on other hardware). Run:AI's AIkit's GA state_dict (its counter in
        ``state['runai']``, a sum) loads too, saved between updates, into ``reduction="sum"``.
        Local: no collective."""
        with_load_hooks(self, state_dict, self._load)

    def _load(self, state_dict: dict[str, Any]) -> None:
        state_dict = from_runai(state_dict)
        self.check_state(state_dict)
        self.optimizer.load_state_dict(state_dict["optimizer"])
        self._restore(state_dict["ga"])
        self.updated = False

    def _restore(self, ga: dict[str, Any]) -> None:
        """The update ``ga`` (a checked ``state_dict()["ga"]``) saved: its window, and the
        gradients accumulated so far as the plain weighted sum."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        for p, grad in zip(params, ga["pending_grads"] if ga["position"] else [None] * len(params), strict=True):
            p.grad = None if grad is None else grad.to(device=p.device, dtype=p.dtype).clone()
        self.engine.carried = 1.0  # the saved gradients are the plain weighted sum
        self.engine.discard()  # sums started from the gradients just replaced
        self.window = Window.restored(ga, self.engine)
        self.micro_steps_taken = ga["micro_steps"]
        self.engine.terms = ga.get("terms") or 0

    def check_state(self, state_dict: dict[str, Any]) -> None:
        """Every reason ``state_dict`` cannot be loaded, before anything is changed."""
        check_state(from_runai(state_dict), self.optimizer, self._micro_steps, self.reduction)

    def __getstate__(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer, **{name: getattr(self, name) for name in _PICKLED},
                "ga": self.state_dict()["ga"]}

    def __setstate__(self, state: dict[str, Any]) -> None:
        options = {name: state[name] for name in _PICKLED if name in state}  # older pickles: newer options' defaults
        # not self.__init__: subclasses (the prebuilt optimizers) take other arguments
        Optimizer.__init__(self, state["optimizer"], state["ga"]["steps"], reduction=state["ga"]["reduction"],
                           **options)
        self._restore(state["ga"])

    # --- parameters and their gradient hooks ---------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        if "optimizer" in self.__dict__ and self.engine._handles:
            self.engine.hook(self.optimizer.param_groups[-1]["params"])
        if "optimizer" in self.__dict__ and self.engine.buckets is not None:
            self.engine.buckets.build(self.engine.params())


def _closure_required(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step`` takes a ``closure`` without a default (L-BFGS)."""
    try:
        closure = inspect.signature(optimizer.step).parameters.get("closure")
    except (TypeError, ValueError):  # a builtin or C step: nothing to read
        return False
    return closure is not None and closure.default is closure.empty


_PICKLED = ("global_batch_size", "max_grad_norm", "scaler", "reduce", "bucket_cap_mb", "sync_every_micro_step",
            "skip_nonfinite", "max_skips_in_a_row")
PREBUILT = prebuilt_classes(Optimizer, __name__)  # Run:AI's Adam(steps, params, ...) and the rest, made once
__getattr__, __dir__ = served(__name__, PREBUILT)  # aikit.ga.Torch.optim.Adam and the rest
