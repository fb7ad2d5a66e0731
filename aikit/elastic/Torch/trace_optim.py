"""Optimizers that follow a batch-size trace: accumulate, or all-reduce and update.

Call ``step()`` once per micro-batch the :class:`~aikit.elastic.Torch.sampler.CustomSampler`
yields. Until this replica's last micro-batch of a global step, ``step()`` only lets autograd
accumulate. On the last one the GA engine (:mod:`aikit.ga.Torch.engine`) sums the gradients
over the replicas in one all-reduce, weighs them by ``minibatch_size / B`` (each micro-batch
gradient is a mean over its samples, so the sum over all replicas becomes the mean over the
step's ``B`` samples: :meth:`aikit.core.schedule.EpochSchedule.weight`), unscales (AMP), clips,
makes one update of the wrapped optimizer with the LR of :func:`aikit.core.scaling.scaled_lr`
for ``B``, puts the base LR back (so an LR scheduler on this optimizer composes) and zeroes the
gradients.

A replica the schedule deals nothing in a step gets no batch at all (no dummy batch, so
BatchNorm statistics stay untouched): it joins those steps' all-reduces with zero gradients and
makes the same updates, right after its last update and in :meth:`TraceOptimizer.join`. All
replicas therefore issue the same collectives in the same order.

Collectives happen only at explicit points of the training loop, never in the constructor or
``load_state_dict``: :meth:`~TraceOptimizer.set_epoch` (and ``ElasticState.restore()``) first
gives every replica rank 0's parameters (once per optimizer), then joins the steps this replica
sits out at its position; ``step()`` joins and updates. So objects can be built and loaded in any
order on every replica.
"""

from __future__ import annotations

from typing import Any

import torch

from aikit.core.plan import positive_int
from aikit.core.scaling import rule_name, scaled_lr
from aikit.core.schedule import EpochSchedule
from aikit.elastic.Torch.collectives import broadcast_, engine, mark_step, world
from aikit.elastic.Torch.sampler import CustomSampler, latest_sampler
from aikit.ga.Torch.engine import Accumulator, WrappingOptimizer
from aikit.ga.Torch.optim import check_groups, check_pending

_TRACE_KEYS = {"epoch", "step", "micro", "updates", "rank", "accumulated"}


class TraceOptimizer(WrappingOptimizer):
    """Wraps a torch optimizer to train through ``sampler``'s trace with LR rule ``rule``.

    ``ref_batchsize`` is the global batch the wrapped optimizer's LR was tuned for; ``warmup_steps``
    ramps the rule's factor in over the first updates; ``log_steps`` prints step, batch size and
    LR on rank 0 every that many updates. ``sampler`` defaults to the last CustomSampler made.
    ``max_grad_norm`` clips each update's gradient; ``scaler`` (a ``torch.amp.GradScaler``) is
    unscaled, stepped and updated once per update. Replicas start from rank 0's parameters,
    broadcast at the first :meth:`set_epoch` or :meth:`join` (``ElasticState.restore()``), unless
    ``broadcast=False``.
    """

    rule = "linear"
    kind = "trace optimizer"

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        sampler: CustomSampler | None = None,
        ref_batchsize: int | None = None,
        log_steps: int | None = None,
        *,
        warmup_steps: int = 0,
        broadcast: bool = True,
        max_grad_norm: float | None = None,
        scaler: Any = None,
    ):
        super().__init__(optimizer)
        self.sampler = sampler if sampler is not None else latest_sampler()
        if not isinstance(self.sampler, CustomSampler):
            raise ValueError(
                f"{type(self).__name__} needs the CustomSampler that feeds it, got {self.sampler!r}: "
                "pass it as second argument"
            )
        if ref_batchsize is None and rule_name(self.rule) != "constant":
            raise ValueError(f"{type(self).__name__} needs ref_batchsize, the global batch its LR was tuned for")
        self.ref_batchsize = None if ref_batchsize is None else positive_int(ref_batchsize, "ref_batchsize")
        self.log_steps = None if log_steps is None else positive_int(log_steps, "log_steps")
        self.warmup_steps = 0 if warmup_steps == 0 else positive_int(warmup_steps, "warmup_steps")
        self.engine = Accumulator(optimizer, max_grad_norm=max_grad_norm, scaler=scaler)
        self.params = self.engine.params()
        if not self.params:
            raise ValueError("the wrapped optimizer has no parameters that require gradients")
        self.device = self.params[0].device
        replicas, self.rank = world(self.device)  # a local query, no collective
        if replicas != self.sampler.num_replicas:
            raise ValueError(
                f"the sampler deals to {self.sampler.num_replicas} replicas but this run has {replicas} "
                f"({engine(self.device)}): give the sampler num_replicas={replicas}, or leave it to the engine"
            )
        self._broadcast_pending = broadcast and replicas > 1
        self.updates = 0  # updates made since training began: drives warmup
        self.updated = False  # whether the last update was applied (AMP did not skip it)
        self.applied = 0  # updates applied by this object (AMP skips not counted): for UpdateScheduler
        self._start(self.sampler.epoch, 0, 0)

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` and :meth:`join`. Before the epoch's first micro-batch (after the
        constructor, ``load_state_dict`` or a restore) a call for the same epoch keeps the position."""
        if not (self._untouched and epoch == self.epoch):
            self._start(epoch, 0, 0)
        self.join()

    def join(self) -> None:
        """The collectives due before this replica's next micro-batch, on every replica alike:
        rank 0's parameters to every replica (the first time), then the all-reduces and updates
        of the steps this replica sits out at its position."""
        if self._broadcast_pending:
            with torch.no_grad():
                broadcast_(self.params)
            mark_step(self.device)
            self._broadcast_pending = False
        if not self._joined:
            self._joined = True
            if self.micro == 0:
                self._join_empty_steps()

    def _start(self, epoch: int, step: int, micro: int) -> None:
        """Position at ``micro`` of ``step`` of ``epoch``: local, the joins wait for :meth:`join`."""
        sampler = self.sampler
        self.plan: EpochSchedule = (
            sampler.epoch_schedule if sampler.epoch == epoch else sampler.schedule.epoch(epoch)
        )
        self.counts = self.plan.counts(sampler.rank)
        self.step_index, self.micro = step, micro
        self._untouched, self._joined = True, False

    def redeal(self) -> None:
        """Take this replica's share of the current step again after the sampler was dealt to a
        new world (``CustomSampler.set_world``); a step cut short is dropped. Local."""
        self._start(self.epoch, self.step_index, 0)

    @property
    def epoch(self) -> int:
        return self.plan.epoch

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Does nothing: gradients are zeroed after every update (accumulating needs them kept)."""

    def step(self, closure=None) -> bool:
        """Account for one micro-batch; returns True when it completed a global step's update."""
        if self._broadcast_pending:
            raise RuntimeError(
                f"{type(self).__name__}.step() before set_epoch(): with {self.sampler.num_replicas} replicas, "
                "call optimizer.set_epoch(epoch) (or ElasticState.restore()) before the first micro-batch; it "
                "gives every replica rank 0's parameters, which must happen before the first forward"
            )
        self.join()
        if closure is not None:
            with torch.enable_grad():
                closure()
        if self.step_index >= len(self.plan):
            raise RuntimeError(
                f"epoch {self.epoch} has {len(self.plan)} steps and all are done: call "
                f"set_epoch({self.epoch + 1}) on the sampler and this optimizer before the next epoch"
            )
        self._untouched = False
        self.micro += 1
        if self.micro < self.counts[self.step_index]:
            mark_step(self.device)
            self.updated = False
            return False
        self._update()
        self._join_empty_steps()
        return True

    def _join_empty_steps(self) -> None:
        while self.step_index < len(self.plan) and self.counts[self.step_index] == 0:
            self._update()

    def _update(self) -> None:
        """All-reduce this step's gradients and make its one update at the step's LR."""
        batch = int(self.plan.batch_sizes[self.step_index])
        if self.sampler.num_replicas > 1 or engine(self.device) == "xla":
            self.engine.reduce()
        base = [group["lr"] for group in self.param_groups]
        ref = self.ref_batchsize or batch
        for group in self.param_groups:
            group["lr"] = scaled_lr(group["lr"], batch, ref, self.rule, self.updates, self.warmup_steps)
        lr = self.param_groups[0]["lr"]
        try:
            self.updated = self.engine.step(self.plan.weight(self.step_index))
            self.applied += self.updated
        finally:
            for group, lr_base in zip(self.param_groups, base, strict=True):
                group["lr"] = lr_base
        self.updates += 1
        self.step_index, self.micro = self.step_index + 1, 0
        mark_step(self.device)
        if self.log_steps and self.rank == 0 and self.updates % self.log_steps == 0:
            print(f"aikit trace: epoch {self.epoch} step {self.plan.first_step + self.step_index - 1} "
                  f"batch {batch} lr {lr:.6g}", flush=True)

    def state_dict(self) -> dict:
        """The wrapped optimizer's state, the position in the trace, and any gradients
        accumulated in a step not yet finished (so a resume continues to the same bits)."""

        def build() -> dict:
            accumulated = [None if p.grad is None else p.grad.detach().clone() for p in self.params] \
                if self.micro else None
            return {"optimizer": self.optimizer.state_dict(),
                    "trace": {"epoch": self.epoch, "step": self.step_index, "micro": self.micro,
                              "updates": self.updates, "rank": self.sampler.rank, "accumulated": accumulated}}

        return self._run_state_dict_hooks(build)

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state`` and put the sampler where it stood: the next ``set_epoch`` of that
        epoch (on both) continues mid-epoch. Mid-step states carry their rank's gradients.
        Local: checked whole before anything changes, no collective (the steps this replica sits
        out at the resumed position are joined by the next :meth:`set_epoch` or :meth:`join`)."""
        self._run_load_hooks(state, self._load)

    def _load(self, state: dict) -> None:
        self.check_state(state)
        trace = state["trace"]
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = trace["updates"]
        if trace["accumulated"] is not None:
            for p, grad in zip(self.params, trace["accumulated"], strict=True):
                p.grad = None if grad is None else grad.to(p.device).clone()
        self.sampler.resume(trace["epoch"], trace["step"], trace["micro"])
        self._start(trace["epoch"], trace["step"], trace["micro"])
        self.updated = False

    def check_state(self, state: dict) -> None:
        """Every reason ``state`` cannot be loaded here, before anything is changed."""
        if not isinstance(state, dict) or set(state) != {"optimizer", "trace"}:
            keys = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"not a {type(self).__name__} state: keys {keys}, expected "
                             "['optimizer', 'trace'] (load the wrapped optimizer's own state into it directly)")
        trace = state["trace"]
        if not isinstance(trace, dict) or set(trace) != _TRACE_KEYS:
            raise ValueError(f"{type(self).__name__} state['trace'] needs keys {sorted(_TRACE_KEYS)}")
        if trace["micro"] and trace["rank"] != self.sampler.rank:
            raise ValueError(f"this state was saved by rank {trace['rank']} in the middle of a step; "
                             f"rank {self.sampler.rank} must load its own")
        check_groups(self.optimizer, state["optimizer"])
        if trace["accumulated"] is not None:
            check_pending(self.params, trace["accumulated"])
        self.sampler.check_position(trace["epoch"], trace["step"], trace["micro"])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.optimizer!r}, rule={self.rule!r}, ref_batchsize={self.ref_batchsize})"


class LinearRuleOptimizer(TraceOptimizer):
    """LR proportional to the global batch (Goyal et al., 2017): for SGD."""

    rule = "linear"


class RootRuleOptimizer(TraceOptimizer):
    """LR proportional to the square root of the global batch (Malladi et al., 2022): for Adam."""

    rule = "sqrt"


class ConstantOptimizer(TraceOptimizer):
    """The wrapped optimizer's LR whatever the batch; ``ref_batchsize`` is not needed."""

    rule = "constant"
