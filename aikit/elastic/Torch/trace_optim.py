"""Optimizers that follow a batch-size trace: accumulate, or all-reduce and update.

Call ``step()`` once per micro-batch the :class:`~aikit.elastic.Torch.sampler.CustomSampler`
yields. Until this replica's last micro-batch of a global step, ``step()`` only lets autograd
accumulate. On the last one it scales the summed gradients by ``minibatch_size / B`` (each
micro-batch gradient is a mean over its samples, so the sum over all replicas becomes the mean
over the step's ``B`` samples), sums them over the replicas in one all-reduce, makes one update
of the wrapped optimizer with the LR of :func:`aikit.core.scaling.scaled_lr` for ``B``, puts
the base LR back (so an LR scheduler on this optimizer composes) and zeroes the gradients.

A replica the schedule deals nothing in a step gets no batch at all (no dummy batch, so
BatchNorm statistics stay untouched): right after its last update, and in ``set_epoch`` for
the steps an epoch opens with, it joins those steps' all-reduces with zero gradients and
makes the same updates. All replicas therefore issue the same collectives in the same order.
"""

from __future__ import annotations

import torch

from aikit.core.plan import positive_int
from aikit.core.scaling import rule_name, scaled_lr
from aikit.core.schedule import EpochSchedule
from aikit.elastic.Torch.collectives import all_reduce_sum_, broadcast_, engine, mark_step, world
from aikit.elastic.Torch.sampler import CustomSampler, latest_sampler


class TraceOptimizer(torch.optim.Optimizer):
    """Wraps a torch optimizer to train through ``sampler``'s trace with LR rule ``rule``.

    ``ref_batchsize`` is the global batch the wrapped optimizer's LR was tuned for; ``warmup_steps``
    ramps the rule's factor in over the first updates; ``log_steps`` prints step, batch size and
    LR on rank 0 every that many updates. ``sampler`` defaults to the last CustomSampler made.
    Replicas start from rank 0's parameters (broadcast here) unless ``broadcast=False``.
    """

    rule = "linear"
    _untouched = False  # True from an epoch's start (or resume point) until its next micro-batch

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        sampler: CustomSampler | None = None,
        ref_batchsize: int | None = None,
        log_steps: int | None = None,
        *,
        warmup_steps: int = 0,
        broadcast: bool = True,
    ):
        self.optimizer = optimizer
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
        self.params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
        if not self.params:
            raise ValueError("the wrapped optimizer has no parameters that require gradients")
        self.device = self.params[0].device
        replicas, self.rank = world(self.device)
        if replicas != self.sampler.num_replicas:
            raise ValueError(
                f"the sampler deals to {self.sampler.num_replicas} replicas but this run has {replicas} "
                f"({engine(self.device)}): give the sampler num_replicas={replicas}, or leave it to the engine"
            )
        if broadcast and replicas > 1:
            with torch.no_grad():
                broadcast_(self.params)
            mark_step(self.device)
        self.updates = 0  # updates made since training began: drives warmup
        self._start(self.sampler.epoch, 0, 0)

    # the wrapped optimizer's groups and state, so LR schedulers and checkpoints see them
    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    @property
    def defaults(self) -> dict:
        return self.optimizer.defaults

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` and join the all-reduces of the steps it opens with in which this
        replica has no micro-batch. Before the epoch's first micro-batch (after the constructor
        or ``load_state_dict``) a call for the same epoch keeps the position."""
        if not (self._untouched and epoch == self.epoch):
            self._start(epoch, 0, 0)

    def _start(self, epoch: int, step: int, micro: int) -> None:
        sampler = self.sampler
        self.plan: EpochSchedule = (
            sampler.epoch_schedule if sampler.epoch == epoch else sampler.schedule.epoch(epoch)
        )
        self.counts = self.plan.counts(sampler.rank)
        self.step_index, self.micro = step, micro
        if micro == 0:
            self._join_empty_steps()
        self._untouched = True

    @property
    def epoch(self) -> int:
        return self.plan.epoch

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Does nothing: gradients are zeroed after every update (accumulating needs them kept)."""

    def step(self, closure=None) -> bool:
        """Account for one micro-batch; returns True when it completed a global step's update."""
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
        self._reduce_gradients(self.plan.weight(self.step_index))
        base = [group["lr"] for group in self.param_groups]
        ref = self.ref_batchsize or batch
        for group in self.param_groups:
            group["lr"] = scaled_lr(group["lr"], batch, ref, self.rule, self.updates, self.warmup_steps)
        lr = self.param_groups[0]["lr"]
        self.optimizer.step()
        for group, lr_base in zip(self.param_groups, base, strict=True):
            group["lr"] = lr_base
        self.optimizer.zero_grad(set_to_none=True)
        self.updates += 1
        self.step_index, self.micro = self.step_index + 1, 0
        mark_step(self.device)
        if self.log_steps and self.rank == 0 and self.updates % self.log_steps == 0:
            print(f"aikit trace: epoch {self.epoch} step {self.plan.first_step + self.step_index - 1} "
                  f"batch {batch} lr {lr:.6g}", flush=True)

    @torch.no_grad()
    def _reduce_gradients(self, weight: float) -> None:
        """Mean gradient over the step's samples on every replica; a parameter no replica
        touched keeps no gradient (as in a big-batch step), except on XLA where that would
        need a device-to-host read and it gets a zero gradient instead."""
        kind, replicas = engine(self.device), self.sampler.num_replicas
        if kind == "single" or replicas == 1:
            for p in self.params:
                if p.grad is not None:
                    p.grad.mul_(weight)
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        if kind == "xla":
            # every replica must run the same program around an XLA collective: cut the graph
            # here, so a replica that had no micro-batch (zero gradients) and one that did both
            # run the identical all-reduce-and-update graph on materialised gradients
            mark_step(self.device)
        for grad in grads:
            grad.mul_(weight)
        if kind == "xla":
            all_reduce_sum_(grads)
            present = [True] * len(grads)
        else:
            flags = torch.tensor([p.grad is not None for p in self.params], dtype=grads[0].dtype,
                                 device=self.device)
            all_reduce_sum_([*grads, flags])
            present = (flags > 0).tolist()
        for p, grad, used in zip(self.params, grads, present, strict=True):
            p.grad = grad if used else None

    def state_dict(self) -> dict:
        """The wrapped optimizer's state, the position in the trace, and any gradients
        accumulated in a step not yet finished (so a resume continues to the same bits)."""
        accumulated = [None if p.grad is None else p.grad.detach().clone() for p in self.params] \
            if self.micro else None
        return {"optimizer": self.optimizer.state_dict(),
                "trace": {"epoch": self.epoch, "step": self.step_index, "micro": self.micro,
                          "updates": self.updates, "rank": self.sampler.rank, "accumulated": accumulated}}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state`` and put the sampler where it stood: the next ``set_epoch`` of that
        epoch (on both) continues mid-epoch. Mid-step states carry their rank's gradients."""
        if set(state) != {"optimizer", "trace"}:
            raise ValueError(f"not a {type(self).__name__} state: keys {sorted(state)}, expected "
                             "['optimizer', 'trace'] (load the wrapped optimizer's own state into it directly)")
        trace = state["trace"]
        if trace["micro"] and trace["rank"] != self.sampler.rank:
            raise ValueError(f"this state was saved by rank {trace['rank']} in the middle of a step; "
                             f"rank {self.sampler.rank} must load its own")
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = trace["updates"]
        if trace["accumulated"] is not None:
            for p, grad in zip(self.params, trace["accumulated"], strict=True):
                p.grad = None if grad is None else grad.to(p.device).clone()
        self.sampler.resume(trace["epoch"], trace["step"], trace["micro"])
        self._start(trace["epoch"], trace["step"], trace["micro"])

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
