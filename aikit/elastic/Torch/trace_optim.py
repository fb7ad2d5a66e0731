"""The one trace optimizer: accumulate, or all-reduce and update at the LR policy's LR.

Call ``step()`` once per micro-batch the sampler (:class:`~aikit.elastic.Torch.sampler.TraceSampler`)
yields. Until this replica's last micro-batch of a global step, ``step()`` only lets autograd
accumulate. On the last one the GA engine (:mod:`aikit.runtime.Torch.accumulator`) sums the gradients
over the replicas in one all-reduce, weighs them by ``micro_batch / B`` (each micro-batch
gradient is a mean over its samples, so the sum over all replicas becomes the mean over the
step's ``B`` samples: :meth:`aikit.core.schedule.EpochSchedule.share`), unscales (AMP), clips,
makes one update of the wrapped optimizer at the LR :class:`aikit.core.lr_policy.LRPolicy` gives
for ``B``, puts the base LR back (so an LR scheduler on this optimizer composes) and zeroes the
gradients. An update whose gradient is inf or NaN is skipped, by AMP's GradScaler or the
engine's check (:mod:`aikit.core.skips`): the step's samples are spent and the trace moves on,
but no weight changes and ``updates`` (which warmup counts) does not advance. A rule from the
measured gradient noise (``"adascale"``: Johnson et al., 2020) measures it in every update
(:class:`~aikit.runtime.Torch.noise.NoiseMeter`), its norms riding in the same all-reduce.

A replica the schedule deals nothing in a step gets no batch at all (no dummy batch, so
BatchNorm statistics stay untouched): it joins those steps' all-reduces with zero gradients and
makes the same updates, right after its last update and in :meth:`TraceOptimizer.join`. All
replicas therefore issue the same collectives in the same order.

Collectives happen only at explicit points of the training loop, never in the constructor or
``load_state_dict``: :meth:`~TraceOptimizer.set_epoch` (and ``ElasticState.restore()``) first
gives every replica rank 0's parameters (once per optimizer), then joins the steps this replica
sits out at its position; ``step()`` joins and updates. So objects can be built and loaded in any
order on every replica. eth-easl's names for this optimizer (``LinearRuleOptimizer`` and the
rest) are :mod:`aikit.elastic.Torch.eth_easl`'s; what it saves and loads is
:mod:`aikit.elastic.Torch.trace_state`'s.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from aikit.core.agreement import Agreement, fingerprint
from aikit.core.errors import InvalidState, InvalidType, InvalidValue
from aikit.core.lr_policy import LRPolicy
from aikit.core.scaling import Rule
from aikit.core.skips import MAX_SKIPS_IN_A_ROW
from aikit.core.validate import positive_int
from aikit.elastic.Torch import trace_state
from aikit.elastic.Torch.loss_terms import LossTerms
from aikit.elastic.Torch.measures import UpdateNoise
from aikit.elastic.Torch.sampler import TraceSampler
from aikit.elastic.Torch.sharded import dtensor_type
from aikit.runtime.Torch.accumulator import Accumulator
from aikit.runtime.Torch.collectives import (
    broadcast_gathering_,
    engine,
    lazy,
    mark_step,
    per_update,
    reduce_and_commit,
    world,
)
from aikit.runtime.Torch.noise import NoiseMeter
from aikit.runtime.Torch.wrapping import WrappingOptimizer, settings_put_back, with_load_hooks, with_state_dict_hooks


class TraceOptimizer(WrappingOptimizer):
    """Wraps a torch optimizer to train through ``sampler``'s trace, each update at the LR of ``rule``.

    ``rule``: a name of :data:`aikit.core.scaling.RULES` or a :class:`~aikit.core.scaling.Rule`; ``ref_batch_size``:
    the global batch the LR was tuned for; ``warmup_steps`` ramps the rule's factor in; ``lr_decay`` (e.g.
    :func:`aikit.core.scaling.cosine_decay`) multiplies the base LR by its value at the samples trained before
    each step; ``policy`` (an :class:`~aikit.core.lr_policy.LRPolicy`) gives the four at once. ``"adascale"``
    measures the gradient noise (:attr:`noise`, smoothed over ``noise_decay``). ``log_steps`` prints ``aikit
    trace: epoch E step S batch B lr L`` on rank 0 every that many updates. ``max_grad_norm``, ``scaler``,
    ``skip_nonfinite``, ``max_skips_in_a_row``: the GA wrapper's. ``broadcast=False``: no rank 0's parameters.
    """

    kind = "trace optimizer"
    takes_weights = True  # accumulate(model, weight=n): the update is the mean over the step's loss terms
    follows_trace = True
    _decides_while_training = False  # True: follows an AdaptiveSampler, whose epochs grow while training
    _measures_noise = False  # True: measures the gradient noise whatever the rule (the adaptive batch)
    _adapted = ("lr",)  # the group settings _adapt() changes for one update, put back after it

    def __init__(self, optimizer: torch.optim.Optimizer, sampler: TraceSampler | None = None,
                 rule: str | Rule = "linear", *, ref_batch_size: int | None = None, warmup_steps: int = 0,
                 lr_decay: Callable[[int], float] | None = None, policy: LRPolicy | None = None,
                 log_steps: int | None = None, broadcast: bool = True, max_grad_norm: float | None = None,
                 scaler: Any = None, skip_nonfinite: bool = True, max_skips_in_a_row: int | None = MAX_SKIPS_IN_A_ROW,
                 noise_decay: float = 0.99):
        super().__init__(optimizer)
        name = type(self).__name__
        self.sampler = _checked_sampler(sampler, name, self._decides_while_training)
        self.policy = policy = _policy(policy, rule, ref_batch_size, warmup_steps, lr_decay, name)
        self.rule, self.ref_batch_size = policy.rule.name, policy.ref_batch_size  # the rule's name, its reference
        self.log_steps = None if log_steps is None else positive_int(log_steps, "log_steps")
        self.engine = Accumulator(optimizer, max_grad_norm=max_grad_norm, scaler=scaler,
                                  skip_nonfinite=skip_nonfinite, max_skips_in_a_row=max_skips_in_a_row)
        self.loss_terms = LossTerms(self.engine)
        self.params = _trainable(self.engine.params(), name)
        self.device = self.params[0].device
        replicas, self.rank = _world_of(self.sampler, self.device)
        measured = self._measures_noise or policy.rule.measured  # the noise, where the rule (or the run) reads it
        self.noise = NoiseMeter(self, noise_decay) if measured else None
        self.measures = UpdateNoise(self, self.noise)  # what each update measures, in its all-reduce
        self.parts: dict[str, Any] = {"noise": self.noise} if measured else {}  # state_dict() beside the trace
        self.takes_weights = self.takes_weights and not measured  # noise is measured from equal micro-batch means
        self._broadcast_pending = broadcast and replicas > 1
        self.agreement = Agreement(replicas)  # the replicas compare settings in their first collective
        self.updates = 0  # updates applied since training began (skips not counted): drives warmup
        self.updated = False  # whether the last update was applied (not skipped for an inf/NaN gradient)
        self._start(self.sampler.epoch, 0, 0)

    @property
    def batch(self) -> int:
        """The global batch of the current step of the epoch, 0 once the epoch's steps are done."""
        schedule = self.epoch_schedule
        return int(schedule.batch_sizes[self.step_index]) if self.step_index < len(schedule) else 0

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` and :meth:`join` (the same epoch, before its first micro-batch: the position kept)."""
        if not (self._untouched and epoch == self.epoch):
            self._start(epoch, 0, 0)
        self.join()

    def join(self) -> None:
        """The collectives due before this replica's next micro-batch: rank 0's parameters (once), then
        the updates of the steps it sits out here."""
        if self._broadcast_pending:
            _broadcast_agreed(self)
        if not self._joined:
            self._joined = True
            if self.micro_step == 0:
                self._join_empty_steps()

    def settings(self) -> dict[str, object]:
        """What every replica must share to train one run, compared at the first collective."""
        sampler, schedule, kind = self.sampler, self.sampler.schedule, type(self.optimizer).__name__
        identity = {key: value for key, value in sampler.identity().items() if key != "trace_source"}
        return {**identity, "micro_batch": schedule.micro_batch, "max_device_batch": schedule.max_device_batch,
                "replicas": sampler.num_replicas, "epoch": self.epoch, "step": self.step_index,
                "micro": self.micro_step, "updates": self.updates, "optimizer": f"{type(self).__name__}({kind})",
                "rule": self.rule, "ref_batch_size": self.ref_batch_size, "lr": self._base_lrs()}

    def compare_again(self) -> None:
        """Compare the replicas' settings again at the next collective (every replica calls it). Local."""
        self.agreement.again(self.sampler.num_replicas)

    def _start(self, epoch: int, step: int, micro_step: int) -> None:
        """Position at ``micro_step`` of ``step`` of ``epoch``: local, the joins wait for :meth:`join`."""
        sampler = self.sampler
        self.epoch_schedule = sampler.epoch_schedule if sampler.epoch == epoch else sampler.schedule.epoch(epoch)
        self.epoch = epoch
        self.counts = self.epoch_schedule.counts(sampler.rank)
        self.step_index, self.micro_step = step, micro_step
        self._untouched, self._joined = True, False
        self.measures.restart()
        self.loss_terms.restart()  # a step cut short is retrained: so are its terms

    def redeal(self) -> None:
        """Take this replica's share of the current step again after ``TraceSampler.set_world``: a step
        cut short is retrained, its gradients and norms dropped. Local."""
        self.engine.discard()
        self.optimizer.zero_grad()
        self.measures.clear()
        self.rank = self.sampler.rank
        self._start(self.epoch, self.step_index, 0)

    def accumulate(self, model: torch.nn.Module, weight: int | torch.Tensor) -> contextlib.AbstractContextManager:
        """Run a micro-batch's forward and backward in here when its loss is a mean over ``weight``
        loss terms (tokens; an int or a 0-d integer tensor): the update is then Σ nᵢ·gᵢ / Σ nᵢ over
        the step's micro-batches on every replica (:class:`~aikit.elastic.Torch.loss_terms.LossTerms`)."""
        return self.loss_terms.counted(model, weight, None if self.takes_weights else type(self).__name__)

    def unhook(self) -> None:
        """Remove the noise measurement's gradient hooks (to go on with another optimizer)."""
        self.measures.remove()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Does nothing: gradients are zeroed after every update (accumulating needs them kept)."""

    def step(self, closure=None) -> bool:
        """Account for one micro-batch; returns True when it completed a global step's update (committed)."""
        _check_steppable(self, joined=False)
        self.join()
        if closure is not None:
            with torch.enable_grad():
                closure()
        self.measures.end_micro_step()
        _check_steppable(self, joined=True)
        self._untouched = False
        self.micro_step += 1
        self.engine.end_micro_step()
        if self.micro_step < self.counts[self.step_index]:
            mark_step(self.device)
            self.updated = False
            return False
        committed = self._update()
        self._join_empty_steps()
        return committed

    def _join_empty_steps(self) -> None:
        while self.step_index < len(self.epoch_schedule) and self.counts[self.step_index] == 0 \
                and not per_update(self.device):
            self._update()

    def sit_out(self) -> bool:
        """Join the step's update with zero gradients, dealt none of it, after its quorum (TorchFT); True: committed."""
        return self._update()

    def _update(self) -> bool:
        """All-reduce this step's gradients and make its one update at the step's LR (False: not committed)."""
        batch, step, replicas = self.batch, self.step_index, self.sampler.num_replicas
        extras = [*self.measures.statistics(), *(self.loss_terms.counts() if self.takes_weights else [])]
        table = self.agreement.table(lambda: {**self.settings(), "micro": 0}, self.rank, replicas)  # dealt unevenly
        committed, summed = reduce_and_commit(self.device, lambda: self.engine.reduce([*table, *extras])
                                              if replicas > 1 or lazy(self.device) else None)
        if not committed:  # TorchFT's quorum did not: nothing applied, the step dealt again after the next
            self.updated = False
            self.redeal()
            return False
        extras = self.agreement.compared(summed, table, extras)
        if self.takes_weights:
            *extras, terms, declared = extras
            self.loss_terms.take(terms, declared, int(self.epoch_schedule.micro_batches_per_step[step]), step)
        self._observe(extras)
        try:
            lr = self._step_at_adapted_lr()
        finally:  # the step's samples are spent, its update applied or skipped (a run of skips: TrainingFailed)
            self.updates += self.updated
            self.step_index, self.micro_step = self.step_index + 1, 0
        mark_step(self.device)
        self.measures.updated(lr)
        if self.log_steps and self.rank == 0:
            self._log(step, batch, lr)
        return True

    def _step_at_adapted_lr(self) -> tuple[float, ...]:
        """The wrapped optimizer's one update at the settings :meth:`_adapt` gives; every group's LR of it."""
        with settings_put_back(self.param_groups, self._adapted):
            self._adapt()
            lr = self._base_lrs()
            self.updated = False
            stepped = self.engine.update(self._gradient_scale())
            self.updated = self.engine.outcomes.settle() if stepped is None else stepped  # the warmup clock: now
        return lr

    def _log(self, step: int, batch: int, lr: tuple[float, ...]) -> None:
        if self.updates % self.log_steps == 0:
            print(f"aikit trace: epoch {self.epoch} step {self.epoch_schedule.first_step + step} batch {batch} "
                  f"lr {lr[0]:.6g}", flush=True)

    # --- the LR of an update ----------------------------------------------------------------------
    def _base_lrs(self) -> tuple[float, ...]:
        """Every param group's LR (the base LR, except during an update)."""
        return tuple(group["lr"] for group in self.param_groups)

    def _adapt(self) -> None:
        """Set every group's settings for this update from its own (put back after): the policy's LR."""
        for index, group in enumerate(self.param_groups):
            group["lr"] = self._lr_of_update(group["lr"], index)

    def _lr_of_update(self, base: float, group: int = 0) -> float:
        """The policy's LR of the current step's update from group ``group``'s base LR."""
        samples = self._samples_trained() if self.policy.decays else 0
        return self.policy.lr(base, self.batch, self.updates, samples, self.measures.smoothed())

    def decay(self) -> float:
        """``lr_decay`` at the samples the trace trained before the current step (1 without one)."""
        return self.policy.decay(self._samples_trained()) if self.policy.decays else 1.0

    def _samples_trained(self) -> int:
        """Samples the trace trained before the current step (what an LR decay reads)."""
        return self.sampler.schedule.trace.samples_before(self.epoch_schedule.first_step + self.step_index)

    # --- what subclasses change -----------------------------------------------------------------
    def _observe(self, totals: list[float]) -> None:
        """Take the update's reduced statistics in, before its LR is set (its :attr:`measures`')."""
        self.measures.observe(totals)

    def _gradient_scale(self) -> float | torch.Tensor:
        """From the summed micro-batch gradients to their mean over the step's samples (or loss terms)."""
        if self.loss_terms.total is not None:
            return self.engine.terms_scale(self.loss_terms.total)
        return self.epoch_schedule.share(self.step_index)

    # --- checkpoints: trace_state's format --------------------------------------------------------
    def state_dict(self) -> dict:
        """The wrapped optimizer's state, the position in the trace, a step's gradients so far."""
        return with_state_dict_hooks(self, lambda: trace_state.saved(self))

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state`` and put the sampler where it stood; local, checked whole first."""
        with_load_hooks(self, state, lambda checked: trace_state.load(self, checked))

    def check_state(self, state: dict) -> None:
        """Every reason ``state`` cannot be loaded here, before anything is changed."""
        trace_state.check(self, state)

    def _check_position(self, state: dict) -> None:
        """Refuse a saved position the sampler has not (``state`` otherwise checked)."""
        trace = state["trace"]
        self.sampler.check_position(trace["epoch"], trace["step"], trace["micro"], "the checkpoint's trace ",
                                    trace_state.INTACT)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.optimizer!r}, rule={self.rule!r}, ref_batch_size={self.ref_batch_size})"


def _policy(policy: LRPolicy | None, rule: str | Rule, ref_batch_size: int | None, warmup_steps: int,
            lr_decay: Callable[[int], float] | None, name: str) -> LRPolicy:
    """The LR policy given, or the one its four settings make (giving both is refused)."""
    if policy is None:
        return LRPolicy(rule, ref_batch_size, warmup_steps, lr_decay, adaptive=None, user=name)
    if (rule, ref_batch_size, warmup_steps, lr_decay) != ("linear", None, 0, None):
        raise InvalidValue(f"{name} got policy= and rule=, ref_batch_size=, warmup_steps= or lr_decay=: give the "
                           "policy alone (it holds all four) or those")
    return policy


def _broadcast_agreed(optimizer: TraceOptimizer) -> None:
    """Rank 0's parameters to every replica, the replicas' settings compared in the same collective."""
    settings = optimizer.settings()
    with torch.no_grad():
        rows = broadcast_gathering_(optimizer.params, fingerprint(settings))
    mark_step(optimizer.device)
    optimizer._broadcast_pending = False
    optimizer.agreement.check(list(settings), rows)


def _world_of(sampler: TraceSampler, device: torch.device) -> tuple[int, int]:
    """(replicas, rank) of this run, a local query (no collective), which the sampler must deal to."""
    replicas, rank = world(device)
    if replicas != sampler.num_replicas:
        raise InvalidValue(
            f"the sampler deals to {sampler.num_replicas} replicas but this run has {replicas} ({engine(device)}): "
            f"give the sampler num_replicas={replicas}, or leave it to the engine")
    return replicas, rank


def _check_steppable(optimizer: TraceOptimizer, joined: bool) -> None:
    """Refuse a ``step()`` before ``set_epoch`` where the replicas must start equal, or (once the
    steps this replica sits out are joined) past the epoch's steps."""
    if not joined and optimizer._broadcast_pending:
        raise InvalidState(
            f"{type(optimizer).__name__}.step() before set_epoch(): with {optimizer.sampler.num_replicas} replicas, "
            "call optimizer.set_epoch(epoch) (or ElasticState.restore()) before the first micro-batch; it gives "
            "every replica rank 0's parameters, which must happen before the first forward")
    steps = len(optimizer.epoch_schedule)
    if joined and optimizer.step_index >= steps:
        raise InvalidState(f"epoch {optimizer.epoch} has {steps} steps and all are done: call "
                           f"set_epoch({optimizer.epoch + 1}) on the sampler and this optimizer before the next epoch")


def _checked_sampler(sampler: object, name: str, decides_while_training: bool) -> TraceSampler:
    """The sampler a trace optimizer follows: a TraceSampler, or the AdaptiveSampler of an
    optimizer that follows batches decided while training."""
    if not isinstance(sampler, TraceSampler):
        raise InvalidType(f"{name} needs the TraceSampler that feeds it, got {sampler!r}: pass it as second "
                          f"argument, {name}(optimizer, sampler, ...)")
    if sampler._decides_while_training and not decides_while_training:
        raise InvalidType(
            f"{name} follows a trace given in advance, but an AdaptiveSampler decides its batches while training: "
            "train it with AdaptiveOptimizer(optimizer, sampler, rule)")
    return sampler


def _trainable(params: list[torch.Tensor], name: str) -> list[torch.Tensor]:
    """The parameters a trace optimizer sums over the replicas itself: some, and none sharded."""
    if not params:
        raise InvalidValue("the wrapped optimizer has no parameters that require gradients")
    if any(isinstance(p, dtensor_type()) for p in params):
        raise InvalidType(
            f"{name} sums each step's gradients over the replicas itself, but these parameters are DTensors (a "
            "model sharded with FSDP2), whose gradients FSDP2 reduces: train a sharded model with "
            "aikit.ga.Torch.optim.Optimizer(optimizer, steps) and aikit.elastic.Torch.init's plan")
    return params
