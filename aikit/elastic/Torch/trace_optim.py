"""Optimizers that follow a batch-size trace: accumulate, or all-reduce and update.

Call ``step()`` once per micro-batch the :class:`~aikit.elastic.Torch.sampler.CustomSampler`
yields. Until this replica's last micro-batch of a global step, ``step()`` only lets autograd
accumulate. On the last one the GA engine (:mod:`aikit.runtime.Torch.accumulator`) sums the gradients
over the replicas in one all-reduce, weighs them by ``micro_batch / B`` (each micro-batch
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

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from aikit.core import gradient_noise
from aikit.core.agreement import disagreement, fingerprint, row_length
from aikit.core.errors import InvalidState, InvalidType, InvalidValue
from aikit.core.gradient_noise import NoiseEstimate, NoiseTracker, update_estimates
from aikit.core.scaling import rule_name, scaled_lr
from aikit.core.schedule import EpochSchedule
from aikit.core.validate import aliased, checked_float, non_negative_int, positive_int
from aikit.elastic.Torch.sampler import CustomSampler, latest_sampler
from aikit.elastic.Torch.sharded import dtensor_type
from aikit.runtime.Torch.accumulator import Accumulator
from aikit.runtime.Torch.collectives import broadcast_gathering_, engine, mark_step, world
from aikit.runtime.Torch.noise import MicroBatchNorms
from aikit.runtime.Torch.state_checks import check_groups, check_pending
from aikit.runtime.Torch.wrapping import WrappingOptimizer

_TRACE_KEYS = {"epoch", "step", "micro", "updates", "rank", "accumulated", "terms"}
_TRACE_KEYS_BEFORE_TERMS = _TRACE_KEYS - {"terms"}  # states saved before accumulate(weight=) existed
LOG_FORMATS = ("eth-easl", "aikit")


def mean_sq_norms(param_groups: list[dict[str, Any]], dtype: torch.dtype, scale: float = 1.0) -> list[float]:
    """Each param group's squared norm of the update's gradient, ``scale`` times the gradients
    accumulated in ``.grad``: each parameter's squared norm in ``dtype``, added up in float64 in
    parameter order, in one read from the device (not one per parameter). What gradient noise is
    measured against (:mod:`aikit.core.gradient_noise`), for AdaScale and the adaptive batch."""
    squares = [(index, p.grad.to(dtype).pow(2).sum()) for index, group in enumerate(param_groups)
               for p in group["params"] if p.grad is not None]
    totals = [0.0] * len(param_groups)
    if squares:
        device = squares[0][1].device
        values = torch.stack([square.to(device) for _, square in squares]).tolist()  # the one host sync
        for (index, _), value in zip(squares, values, strict=True):
            totals[index] += value
    return [total * scale**2 for total in totals]


class TraceOptimizer(WrappingOptimizer):
    """Wraps a torch optimizer to train through ``sampler``'s trace with LR rule ``rule``.

    ``ref_batch_size`` is the global batch the wrapped optimizer's LR was tuned for (``ref_batchsize=``,
    eth-easl's name, says the same); ``warmup_steps``
    ramps the rule's factor in over the first updates; ``log_steps`` prints on rank 0, as eth-easl's
    ``CustomOptimizer: Step=S, bs=B, lr=(L,)`` at every step ``S`` of an epoch that is a multiple
    of it, or with ``log_format="aikit"`` ``aikit trace: epoch E step S batch B lr L`` every that
    many updates (``S`` counted over the trace). ``sampler`` defaults to the last CustomSampler made.
    ``lr_decay`` (e.g. :func:`aikit.core.scaling.cosine_decay`) multiplies the base LR by its value at
    the samples the trace trained before each step: an LR schedule clocked by samples, as Seesaw and
    its cosine baseline need (a scheduler stepped per update would decay a run of larger batches later).
    ``max_grad_norm`` clips each update's gradient; ``scaler`` (a ``torch.amp.GradScaler``) is
    unscaled, stepped and updated once per update. Replicas start from rank 0's parameters,
    broadcast at the first :meth:`set_epoch` or :meth:`join` (``ElasticState.restore()``), unless
    ``broadcast=False``.
    """

    rule = "linear"
    kind = "trace optimizer"
    takes_weights = True  # accumulate(model, weight=n): the update is the mean over the step's loss terms
    follows_trace = True
    per_micro_batch = False  # its LR is a micro-batch's: needs one micro-batch size (no max_device_batch)
    _decides_while_training = False  # True: follows an AdaptiveSampler, whose epochs grow while training

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        sampler: CustomSampler | None = None,
        ref_batch_size: int | None = None,
        log_steps: int | None = None,
        *,
        warmup_steps: int = 0,
        broadcast: bool = True,
        max_grad_norm: float | None = None,
        scaler: Any = None,
        log_format: str = "eth-easl",
        lr_decay: Callable[[int], float] | None = None,
        ref_batchsize: int | None = None,
    ):
        super().__init__(optimizer)
        if log_format not in LOG_FORMATS:
            raise InvalidValue(f"log_format must be one of {LOG_FORMATS}, got {log_format!r}")
        self.log_format = log_format
        self.sampler = sampler if sampler is not None else latest_sampler()
        if not isinstance(self.sampler, CustomSampler):
            raise InvalidType(
                f"{type(self).__name__} needs the CustomSampler that feeds it, got {self.sampler!r}: "
                "pass it as second argument"
            )
        if self.sampler._decides_while_training and not self._decides_while_training:
            raise InvalidType(
                f"{type(self).__name__} follows a trace given in advance, but an AdaptiveSampler decides its batches "
                "while training: train it with AdaptiveOptimizer(optimizer, sampler, rule)")
        if self.per_micro_batch and self.sampler.schedule.max_device_batch is not None:
            raise InvalidValue(
                f"{type(self).__name__} scales its LR from one micro-batch of micro_batch samples, but this "
                "sampler's micro-batch varies by step (max_device_batch): build the CustomSampler with "
                "micro_batch (eth-easl's minibatch_size), or use LinearRuleOptimizer / RootRuleOptimizer / "
                "ConstantOptimizer")
        ref, name = aliased(ref_batch_size, ref_batchsize, "ref_batch_size", "ref_batchsize", "eth-easl")
        if ref is None and rule_name(self.rule) != "constant":
            raise InvalidValue(f"{type(self).__name__} needs ref_batch_size (eth-easl's ref_batchsize), the global "
                               "batch its LR was tuned for")
        if lr_decay is not None and (not callable(lr_decay) or self.per_micro_batch):
            raise InvalidType(f"lr_decay must be a function of the samples trained (aikit.core.scaling.cosine_decay or "
                              f"step_decay) for a LinearRule, RootRule, Seesaw or Constant optimizer, got "
                              f"{lr_decay!r:.60} for {type(self).__name__}")
        if lr_decay is None and self.rule == "seesaw":
            raise InvalidValue(f"{type(self).__name__} needs lr_decay, the LR decay over samples its trace was made "
                               "from (aikit.core.ramp.seesaw_schedule's decay): Seesaw's LR is base x decay x "
                               "sqrt(B / ref_batch_size)")
        self.lr_decay = lr_decay
        self.ref_batch_size = None if ref is None else positive_int(ref, name)
        self.log_steps = None if log_steps is None else positive_int(log_steps, "log_steps")
        self.warmup_steps = 0 if warmup_steps == 0 else positive_int(warmup_steps, "warmup_steps")
        self.engine = Accumulator(optimizer, max_grad_norm=max_grad_norm, scaler=scaler)
        self._terms: Any = None  # the running update's loss terms over every replica (None: not declared)
        self.params = self.engine.params()
        if not self.params:
            raise InvalidValue("the wrapped optimizer has no parameters that require gradients")
        if any(isinstance(p, dtensor_type()) for p in self.params):
            raise InvalidType(
                f"{type(self).__name__} sums each step's gradients over the replicas itself, but these parameters "
                "are DTensors (a model sharded with FSDP2), whose gradients FSDP2 reduces: train a sharded model "
                "with aikit.ga.Torch.optim.Optimizer(optimizer, steps) and aikit.elastic.Torch.init's plan"
            )
        self.device = self.params[0].device
        replicas, self.rank = world(self.device)  # a local query, no collective
        if replicas != self.sampler.num_replicas:
            raise InvalidValue(
                f"the sampler deals to {self.sampler.num_replicas} replicas but this run has {replicas} "
                f"({engine(self.device)}): give the sampler num_replicas={replicas}, or leave it to the engine"
            )
        self._broadcast_pending = broadcast and replicas > 1
        self._agreement_pending = replicas > 1  # the replicas compare settings in their first collective
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
            settings = self.settings()
            with torch.no_grad():
                rows = broadcast_gathering_(self.params, fingerprint(settings))
            mark_step(self.device)
            self._broadcast_pending = False
            self._agree(settings, rows)
        if not self._joined:
            self._joined = True
            if self.micro == 0:
                self._join_empty_steps()

    def settings(self) -> dict[str, object]:
        """What every replica must share to train one run: the samples of every step (the
        sampler's identity, less where the trace was read from), the micro-batch, the world, the
        position, the optimizer, its rule and LRs. Compared at the first collective."""
        sampler, schedule = self.sampler, self.sampler.schedule
        identity = {key: value for key, value in sampler.identity().items() if key != "trace_source"}
        return {**identity, "micro_batch": schedule.micro_batch, "max_device_batch": schedule.max_device_batch,
                "replicas": sampler.num_replicas, "epoch": self.epoch, "step": self.step_index, "micro": self.micro,
                "updates": self.updates, "optimizer": f"{type(self).__name__}({type(self.optimizer).__name__})",
                "ref_batch_size": self.ref_batch_size, "lr": self.get_lr()}

    def compare_again(self) -> None:
        """Compare the replicas' settings again at the next collective. After the world formed
        anew (Horovod elastic: a worker joined the ones that had compared already), every replica
        calls it, so that all send their rows in the same all-reduce: ``ElasticState.sync()``
        does, on every worker alike. Local."""
        self._agreement_pending = self.sampler.num_replicas > 1

    def _agree(self, settings: dict[str, object], rows: list[list[int]]) -> None:
        """Refuse, on every replica alike, a run whose replicas were given different settings:
        they would each train their own run, diverge, and fail much later in a collective."""
        self._agreement_pending = False
        problem = disagreement(list(settings), rows)
        if problem is not None:
            raise InvalidValue(
                f"the replicas were not given the same run; they differ in {problem}: start every worker with the "
                "same trace, data set, seed and settings (and, resuming, from the same checkpoint)"
            )

    def _start(self, epoch: int, step: int, micro: int) -> None:
        """Position at ``micro`` of ``step`` of ``epoch``: local, the joins wait for :meth:`join`."""
        sampler = self.sampler
        self.plan: EpochSchedule = (
            sampler.epoch_schedule if sampler.epoch == epoch else sampler.schedule.epoch(epoch)
        )
        self.counts = self.plan.counts(sampler.rank)
        self.step_index, self.micro = step, micro
        self._untouched, self._joined = True, False
        self.engine.terms, self._declared = 0, 0  # a step cut short is retrained: so are its terms

    def redeal(self) -> None:
        """Take this replica's share of the current step again after the sampler was dealt to a
        new world (``CustomSampler.set_world``); a step cut short is dropped. Local."""
        self._start(self.epoch, self.step_index, 0)

    @property
    def epoch(self) -> int:
        return self.plan.epoch

    @contextlib.contextmanager
    def accumulate(self, model: torch.nn.Module, weight: int | torch.Tensor) -> Iterator[None]:
        """Run one micro-batch's forward and backward inside this context when its loss is a mean
        over ``weight`` loss terms (a language model's tokens whose label is not ignored; an int or
        a 0-d integer tensor): the step's update is then Σ nᵢ·gᵢ / Σ nᵢ over its micro-batches
        on every replica, the count summed in the update's one all-reduce, instead of the mean of
        the micro-batch means. Declare it for every micro-batch of a step or for none."""
        if not self.takes_weights:
            raise InvalidValue(
                f"{type(self).__name__} weighs micro-batches its own way (a sum, or gradient noise measured from "
                "equal micro-batch means), so it takes no weight=: use LinearRuleOptimizer, RootRuleOptimizer, "
                "ConstantOptimizer or CustomOptimizer(reduction='mean') for loss terms"
            )
        with self.engine.count_terms(model, weight):
            yield
        self._declared += 1

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Does nothing: gradients are zeroed after every update (accumulating needs them kept)."""

    def step(self, closure=None) -> bool:
        """Account for one micro-batch; returns True when it completed a global step's update."""
        if self._broadcast_pending:
            raise InvalidState(
                f"{type(self).__name__}.step() before set_epoch(): with {self.sampler.num_replicas} replicas, "
                "call optimizer.set_epoch(epoch) (or ElasticState.restore()) before the first micro-batch; it "
                "gives every replica rank 0's parameters, which must happen before the first forward"
            )
        self.join()
        if closure is not None:
            with torch.enable_grad():
                closure()
        if self.step_index >= len(self.plan):
            raise InvalidState(
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
        batch, step = self.get_bs(), self.step_index
        extras = self._local_statistics()
        if self.takes_weights:  # every replica adds its loss terms, declared or not (0)
            extras = [*extras, self.engine.take_terms(), float(self._declared)]
            self._declared = 0
        settings = self.settings() if self._agreement_pending else {}  # broadcast=False: nothing was shared yet
        table = [0.0] * (row_length(settings) * self.sampler.num_replicas)
        if settings:
            width = row_length(settings)
            table[self.rank * width:(self.rank + 1) * width] = fingerprint(settings)
        if self.sampler.num_replicas > 1 or engine(self.device) == "xla":
            extras = self.engine.reduce([*table, *extras])
            table, extras = extras[:len(table)], extras[len(table):]
        if settings:
            width = row_length(settings)
            self._agree(settings, [[round(v) for v in table[r * width:(r + 1) * width]]
                                   for r in range(self.sampler.num_replicas)])
        if self.takes_weights:
            *extras, terms, declared = extras
            self._terms = self._declared_terms(terms, declared)
        self._observe(extras)
        lr = self._step_at_adapted_lr()
        self.updates += 1
        self.step_index, self.micro = self.step_index + 1, 0
        mark_step(self.device)
        self._updated(lr)
        if self.log_steps and self.rank == 0:
            self._log(step, batch, lr)

    def _step_at_adapted_lr(self) -> tuple[float, ...]:
        """The wrapped optimizer's one update with the settings :meth:`adapt_lr` gives it, the
        base settings put back afterwards whatever happens (so an LR scheduler on this optimizer
        composes); returns every group's LR of the update."""
        saved = [{key: group[key] for key in self._adapted if key in group} for group in self.param_groups]
        self.adapt_lr()
        lr = self.get_lr()
        try:
            self.updated = self.engine.step(self._gradient_scale())
            self.applied += self.updated
        finally:
            for group, values in zip(self.param_groups, saved, strict=True):
                group.update(values)
        return lr

    def _log(self, step: int, batch: int, lr: tuple[float, ...]) -> None:
        if self.log_format == "aikit":
            if self.updates % self.log_steps == 0:
                print(f"aikit trace: epoch {self.epoch} step {self.plan.first_step + step} batch {batch} "
                      f"lr {lr[0]:.6g}", flush=True)
        elif step % self.log_steps == 0:
            print(f"    CustomOptimizer: Step={step}, bs={batch}, lr={lr}", flush=True)

    # --- what subclasses change -----------------------------------------------------------------
    _adapted = ("lr",)  # the group settings adapt_lr() changes for one update, put back after it

    def _local_statistics(self) -> list[float]:
        """Numbers this replica adds to the update's all-reduce besides its gradients (none)."""
        return []

    def _observe(self, totals: list[float]) -> None:
        """Take the update's reduced gradients and statistics in, before the LR is set."""

    def _updated(self, lr: tuple[float, ...]) -> None:
        """After the update (the position already on the next step), with its LRs."""

    def _gradient_scale(self) -> float | torch.Tensor:
        """Factor from the summed micro-batch gradients to the update's gradient: their mean over
        the step's samples, or over its loss terms where they were declared."""
        if self._terms is not None:
            return self.engine.terms_scale(self._terms)
        return self.plan.weight(self.step_index)

    def _declared_terms(self, terms: Any, declared: float) -> Any:
        """The step's loss terms over every replica, None where no micro-batch declared any; a
        step that declared them for some micro-batches only is refused (on every replica alike)."""
        expected = int(self.plan.micro_batches_per_step[self.step_index])
        if declared == 0:
            return None
        if declared != expected:
            self.engine.discard()
            self.optimizer.zero_grad()
            raise InvalidValue(
                f"{declared:g} of the {expected} micro-batches of step {self.step_index} declared their loss terms "
                "with accumulate(model, weight=...): declare them for every micro-batch of a step or for none"
            )
        return terms

    # --- eth-easl's public surface --------------------------------------------------------------
    def get_lr(self) -> tuple[float, ...]:
        """Every param group's LR (the base LR, except during an update)."""
        return tuple(group["lr"] for group in self.param_groups)

    def set_lr(self, values: tuple[float, ...] | list[float]) -> None:
        """Set every param group's LR, one value per group."""
        values = tuple(values)
        if len(values) != len(self.param_groups):
            raise InvalidValue(f"set_lr needs one LR per param group ({len(self.param_groups)}), got {len(values)}")
        for group, lr in zip(self.param_groups, values, strict=True):
            group["lr"] = lr

    def get_bs(self) -> int:
        """The global batch of the current step of the epoch, 0 once the epoch's steps are done."""
        return int(self.plan.batch_sizes[self.step_index]) if self.step_index < len(self.plan) else 0

    def _rule_lr(self, base: float, batch: int) -> float:
        """The rule's LR for ``batch`` (at the current update, for warmup) from ``base``."""
        if batch == 0:  # past the epoch: eth-easl's rules give 0 (constant: the base LR)
            return base if rule_name(self.rule) == "constant" else 0.0
        return scaled_lr(base, batch, self.ref_batch_size or batch, self.rule, self.updates, self.warmup_steps,
                         self.decay())

    def decay(self) -> float:
        """``lr_decay`` at the samples the trace trained before the current step (1 without one)."""
        if self.lr_decay is None:
            return 1.0
        return float(self.lr_decay(self.sampler.schedule.trace.samples_before(self.plan.first_step + self.step_index)))

    def adapt_lr(self) -> None:
        """Set every group's LR to the rule's LR for the current step, from the LR it holds now
        (the update calls it and puts the base LR back afterwards)."""
        batch = self.get_bs()
        self.set_lr(self._rule_lr(lr, batch) for lr in self.get_lr())

    def current_lr(self) -> float:
        """The first group's LR for the current step."""
        return self._rule_lr(self.get_lr()[0], self.get_bs())

    def state_dict(self) -> dict:
        """The wrapped optimizer's state, the position in the trace, and any gradients
        accumulated in a step not yet finished (so a resume continues to the same bits)."""

        def build() -> dict:
            accumulated = [None if p.grad is None else p.grad.detach().clone() for p in self.params] \
                if self.micro else None
            return {"optimizer": self.optimizer.state_dict(),
                    "trace": {"epoch": self.epoch, "step": self.step_index, "micro": self.micro,
                              "updates": self.updates, "rank": self.sampler.rank, "accumulated": accumulated,
                              "terms": [int(self.engine.terms), self._declared] if self._declared else None},
                    **self._extra_state()}

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
        self._load_extra(state)
        self.sampler.resume(trace["epoch"], trace["step"], trace["micro"])
        self._start(trace["epoch"], trace["step"], trace["micro"])
        self.engine.terms, self._declared = trace.get("terms") or (0, 0)
        self.updated = False

    _extra_keys: tuple[str, ...] = ()  # state_dict() keys a subclass adds

    def _extra_state(self) -> dict:
        return {}

    def _load_extra(self, state: dict) -> None:
        """Load what ``_extra_state`` saved (``state`` already checked)."""

    def check_state(self, state: dict) -> None:
        """Every reason ``state`` cannot be loaded here, before anything is changed."""
        expected = {"optimizer", "trace", *self._extra_keys}
        if not isinstance(state, dict) or set(state) != expected:
            keys = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise InvalidValue(f"not a {type(self).__name__} state: keys {keys}, expected "
                             f"{sorted(expected)} (load the wrapped optimizer's own state into it directly)")
        trace = state["trace"]
        if not isinstance(trace, dict) or set(trace) not in (_TRACE_KEYS, _TRACE_KEYS_BEFORE_TERMS):
            raise InvalidValue(f"{type(self).__name__} state['trace'] needs keys {sorted(_TRACE_KEYS)}")
        for key in ("epoch", "step", "micro", "updates", "rank"):  # what this optimizer writes (was it edited?)
            non_negative_int(trace[key], f"the checkpoint's trace {key}")
        if trace["micro"] and trace["rank"] != self.sampler.rank:
            raise InvalidValue(f"this state was saved by rank {trace['rank']} in the middle of a step; "
                             f"rank {self.sampler.rank} must load its own")
        check_groups(self.optimizer, state["optimizer"])
        if trace["accumulated"] is not None:
            check_pending(self.params, trace["accumulated"])
        self._check_position(state)

    def _check_position(self, state: dict) -> None:
        """Refuse a saved position the sampler has not (``state`` otherwise checked)."""
        trace = state["trace"]
        self.sampler.check_position(trace["epoch"], trace["step"], trace["micro"])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.optimizer!r}, rule={self.rule!r}, ref_batch_size={self.ref_batch_size})"


    @property
    def ref_batchsize(self) -> int | None:
        """:attr:`ref_batch_size` by eth-easl's name."""
        return self.ref_batch_size


class LinearRuleOptimizer(TraceOptimizer):
    """LR proportional to the global batch (Goyal et al., 2017): for SGD."""

    rule = "linear"


class RootRuleOptimizer(TraceOptimizer):
    """LR proportional to the square root of the global batch (Malladi et al., 2022): for Adam."""

    rule = "sqrt"


class SeesawOptimizer(TraceOptimizer):
    """Seesaw (Meterez et al., 2025): the LR ``base x lr_decay(samples) x sqrt(B / ref_batch_size)``
    over a trace of :func:`aikit.core.ramp.seesaw_schedule` made from the same ``lr_decay``: where
    the decay halves the LR, the trace doubles the batch and the LR falls by ``1/sqrt(2)``."""

    rule = "seesaw"


class ConstantOptimizer(TraceOptimizer):
    """The wrapped optimizer's LR whatever the batch; ``ref_batch_size`` is not needed."""

    rule = "constant"


class CustomOptimizer(TraceOptimizer):
    """eth-easl's base optimizer, ``CustomOptimizer(optimizer, sampler, log_steps=None,
    reduction='mean')``: the wrapped optimizer's LR whatever the batch, and the step's micro-batch
    gradients averaged (``'mean'``) or summed (``'sum'``) over micro-batches and replicas."""

    rule = "constant"

    def __init__(self, optimizer: torch.optim.Optimizer, sampler: CustomSampler | None = None,
                 log_steps: int | None = None, reduction: str = "mean", **options: Any):
        if reduction not in ("mean", "sum"):
            raise InvalidValue(f"reduction must be 'mean' or 'sum', got {reduction!r}")
        super().__init__(optimizer, sampler, None, log_steps, **options)
        self.reduction = reduction
        self.takes_weights = reduction == "mean"

    def _gradient_scale(self) -> float:
        return 1.0 if self.reduction == "sum" else super()._gradient_scale()


class LinearRuleMomentumOptimizer(TraceOptimizer):
    """eth-easl's linear rule with *summed* gradients: the micro-batch gradients of a step are
    added up (not averaged) over micro-batches and replicas, the LR is the linear rule's LR for
    one micro-batch (``lr · micro_batch / ref_batch_size``), and every group's weight decay is
    ``weight_decay`` times the step's micro-batches ``B / micro_batch``. With SGD that is the
    linear rule with the momentum buffer kept in units of LR × gradient (Goyal et al.'s momentum
    correction): a batch-size change rescales the new gradients, not the velocity.

    ``weight_decay`` (eth-easl's default 1e-4) replaces the wrapped optimizer's own for every
    group, during each update only. :meth:`current_lr` is the linear rule's LR for the step's
    batch, as eth-easl reports it.
    """

    rule = "linear"
    per_micro_batch = True
    takes_weights = False  # a sum of micro-batch gradients
    _adapted = ("lr", "weight_decay")

    def __init__(self, optimizer: torch.optim.Optimizer, sampler: CustomSampler | None = None,
                 ref_batch_size: int | None = None, weight_decay: float = 1e-4, log_steps: int | None = None,
                 **options: Any):
        if options.get("warmup_steps"):
            raise InvalidValue("LinearRuleMomentumOptimizer has no warmup: its LR is the micro-batch's at every step; "
                             "use LinearRuleOptimizer(warmup_steps=...)")
        super().__init__(optimizer, sampler, ref_batch_size, log_steps, **options)
        self.weight_decay = checked_float(weight_decay, "weight_decay", "a number >= 0",
                                          lambda decay: 0 <= decay < math.inf)
        own = sorted({group.get("weight_decay", 0) for group in self.param_groups} - {0, self.weight_decay})
        if own:
            warnings.warn(f"LinearRuleMomentumOptimizer replaces the wrapped optimizer's weight_decay {own} by "
                          f"weight_decay={self.weight_decay} (times the micro-batches of each step), as eth-easl's "
                          "does: pass weight_decay= to choose it", stacklevel=2)

    def _gradient_scale(self) -> float:
        return 1.0  # the sum over the step's micro-batches

    def adapt_lr(self) -> None:
        micro = self.plan.micro_batch
        self.set_lr(scaled_lr(lr, micro, self.ref_batch_size, "linear") for lr in self.get_lr())
        micro_batches = self.get_bs() // micro
        for group in self.param_groups:
            group["weight_decay"] = self.weight_decay * micro_batches


class AdaScaleOptimizer(TraceOptimizer):
    """AdaScale (Johnson et al., 2020) through a batch-size trace: every update's LR is the base
    LR for one micro-batch, ``lr · micro_batch / ref_batch_size``, times the gain ``r`` of the
    step's batch over a micro-batch, and :attr:`progress` advances by ``r`` (the scale-invariant
    iteration count: drive an LR schedule with it, e.g. ``LambdaLR(optimizer, lambda _:
    f(optimizer.progress))``).

    The gain comes from the gradient noise of each update (:mod:`aikit.core.gradient_noise`):
    the squared norm of every micro-batch's mean gradient, taken by a gradient hook before it is
    added into ``.grad``, summed per param group on each replica and over the replicas in the
    update's one all-reduce, against the squared norm of the update's gradient. A replica with no
    micro-batch in a step adds nothing and counts no part. One :class:`~aikit.core.gradient_noise.NoiseTracker`
    per param group smooths ``|G|²`` and ``tr(Σ)`` (``decay``); each group's LR uses its own gain
    (as eth-easl's and fairscale's), :attr:`progress` the whole model's. Call ``step()`` once per
    micro-batch after its one ``backward()``.
    """

    rule = "linear"
    per_micro_batch = True
    takes_weights = False  # its gradient noise is measured from equal micro-batch means
    _extra_keys = ("adascale",)

    def __init__(self, optimizer: torch.optim.Optimizer, sampler: CustomSampler | None = None,
                 log_steps: int | None = None, ref_batch_size: int | None = None, *, decay: float = 0.99,
                 **options: Any):
        if options.get("warmup_steps"):
            raise InvalidValue("AdaScaleOptimizer has no warmup: the gain sets the LR from the measured noise")
        if ref_batch_size is None and options.get("ref_batchsize") is None:
            ref_batch_size = 32  # eth-easl's default
        super().__init__(optimizer, sampler, ref_batch_size, log_steps, **options)
        self.trackers = [NoiseTracker(decay) for _ in self.param_groups]
        self.progress = 0.0  # base-batch (micro-batch) steps' worth of progress so far
        self._gains = (1.0,) * len(self.param_groups)
        self.last_gain = 1.0
        dtype = torch.float64 if self.params[0].dtype == torch.float64 else torch.float32
        self.norms = MicroBatchNorms(self.param_groups, dtype)  # this update's micro-batch norms, per group

    def unhook(self) -> None:
        """Remove the gradient hooks (to train the model on with another optimizer)."""
        self.norms.remove()

    def redeal(self) -> None:
        self.norms.clear()  # the step cut short is retrained: so are its micro-batches' norms
        super().redeal()

    def step(self, closure=None) -> bool:
        self.norms.close()  # the micro-batch backpropagated since the last step()
        return super().step(closure)

    def _local_statistics(self) -> list[float]:
        return self.norms.take(self.engine.scaler).sum(0).tolist()  # zeros with no micro-batch here

    @torch.no_grad()
    def _observe(self, totals: list[float]) -> None:
        batch, micro = self.get_bs(), self.plan.micro_batch
        parts = batch // micro
        if parts >= 2:
            amp = self.engine.scaler.get_scale() if self.engine.scaler is not None else 1.0
            means = mean_sq_norms(self.param_groups, self.norms.dtype, self._gradient_scale() / amp)
            estimates = update_estimates([total * micro for total in totals], parts, batch, means)
            if estimates is not None:  # None where AMP skips the update (inf/NaN): so do we
                for tracker, noise in zip(self.trackers, estimates, strict=True):
                    tracker.update(noise)
        smoothed = [tracker.smoothed if tracker.updates else None for tracker in self.trackers]
        self._gains = tuple(self._gain(noise, batch) for noise in smoothed)
        model = None if None in smoothed else NoiseEstimate(grad_sq=sum(n.grad_sq for n in smoothed),
                                                            trace=sum(n.trace for n in smoothed))
        self.last_gain = self._gain(model, batch)  # the whole model's
        self.progress += self.last_gain

    def _gain(self, noise: NoiseEstimate | None, batch: int) -> float:
        if noise is None or batch == 0:
            return 1.0
        return gradient_noise.gain(noise.trace, noise.grad_sq, batch, self.plan.micro_batch)

    def gain(self) -> tuple[float, ...]:
        """Each param group's gain at the last update (1 before the first)."""
        return self._gains

    @property
    def grad_var_avg(self) -> np.ndarray:
        """eth-easl's smoothed variance of a micro-batch's gradient per group, ``tr(Σ) / micro_batch``."""
        return np.array([t.smoothed.trace / self.plan.micro_batch if t.updates else 0.0 for t in self.trackers])

    @property
    def grad_sqr_avg(self) -> np.ndarray:
        """eth-easl's smoothed ``|G|²`` per group."""
        return np.array([t.smoothed.grad_sq if t.updates else 1.0 for t in self.trackers])

    def adapt_lr(self) -> None:
        self.set_lr(self.current_lr())

    def current_lr(self) -> tuple[float, ...]:
        """Every group's LR for the current step with the last gains (a tuple, as eth-easl's)."""
        micro = self.plan.micro_batch
        return tuple(scaled_lr(lr, micro, self.ref_batch_size, "linear") * r
                     for lr, r in zip(self.get_lr(), self._gains, strict=True))

    def _log(self, step: int, batch: int, lr: tuple[float, ...]) -> None:
        if self.log_format == "eth-easl" and step % self.log_steps == 0:
            print(f"    Adascale: Step={step}, gain={self.gain()}, grad_var_avg={self.grad_var_avg}, "
                  f"grad_sqr_avg={self.grad_sqr_avg}", flush=True)
        super()._log(step, batch, lr)

    def _extra_state(self) -> dict:
        return {"adascale": {"trackers": [t.state_dict() for t in self.trackers], "progress": self.progress,
                             "gains": list(self._gains), "pending": self.norms.state()}}

    def check_state(self, state: dict) -> None:
        super().check_state(state)
        self._saved_trackers(state["adascale"])

    def _saved_trackers(self, saved: object) -> list[NoiseTracker]:
        keys = {"trackers", "progress", "gains", "pending"}
        if not isinstance(saved, dict) or set(saved) != keys or len(saved["trackers"]) != len(self.trackers) \
                or len(saved["gains"]) != len(self.trackers):
            raise InvalidValue(f"AdaScaleOptimizer state['adascale'] needs keys {sorted(keys)} with one tracker and "
                             f"one gain per param group ({len(self.trackers)})")
        trackers = [NoiseTracker() for _ in self.trackers]
        for tracker, tracker_state in zip(trackers, saved["trackers"], strict=True):
            tracker.load_state_dict(tracker_state)
        return trackers

    def _load_extra(self, state: dict) -> None:
        saved = state["adascale"]
        self.trackers = self._saved_trackers(saved)
        self.progress, self._gains = float(saved["progress"]), tuple(saved["gains"])
        self.norms.load(saved["pending"], self.device)

