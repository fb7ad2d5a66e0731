"""eth-easl's variable batch size by its own names: the edge between its scripts and aikit.

A script written for eth-easl's ``variable_batch_size.py`` runs with ``import aikit.elastic.Torch
as vbs``; everything of eth-easl's vocabulary that it meets is here, as ``aikit/ga/Torch/runai.py``
is for Run:AI's AIkit:

* its optimizer classes: ``LinearRuleOptimizer``, ``RootRuleOptimizer`` and ``ConstantOptimizer``,
  each the one :class:`~aikit.elastic.Torch.trace_optim.TraceOptimizer` with a rule (as is
  ``SeesawOptimizer``, the name aikit gave Seesaw's rule in that family: its users write the
  family's surface), and its two that differ, ``CustomOptimizer`` (its base: the LR unscaled,
  micro-batch gradients averaged or summed) and ``LinearRuleMomentumOptimizer`` (summed gradients,
  one micro-batch's LR, weight decay per micro-batch);
* their argument order ``(optimizer, sampler, ref_batchsize, log_steps)``, ``ref_batchsize=`` for
  aikit's ``ref_batch_size=`` (resolved here, once), their default sampler (the sampler made last:
  eth-easl's scripts write ``LinearRuleOptimizer(optimizer, ref_batchsize=256)``; aikit's own
  ``TraceOptimizer`` takes its sampler explicitly), ``get_bs``, ``get_lr``, ``set_lr``,
  ``current_lr``, ``adapt_lr``, ``ref_batchsize``, and their log lines (``    CustomOptimizer:
  Step=S, bs=B, lr=(L,)``, AdaScale's ``    Adascale: ...``);
* the sampler's: ``minibatch_size=`` for ``micro_batch=``, its positional order ``(dataset, trace,
  seed, num_replicas, rank, minibatch_size, verbose)``, ``minibatch_size``, ``trace_samples``,
  ``minibatches_per_epoch``, ``max_epoch``, ``get_epoch_range``, ``get_epochtrace``,
  ``get_batch_assignments`` and its two printed lines (:class:`EthEaslSampler`, which
  ``CustomSampler`` inherits).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING, Any

import torch

from aikit.core.errors import InvalidType, InvalidValue
from aikit.core.lr_policy import LRPolicy
from aikit.core.schedule import EpochSchedule, seed_value
from aikit.core.skips import MAX_SKIPS_IN_A_ROW
from aikit.core.trace import load_trace, multiple_problems
from aikit.core.validate import checked_float, index_in, positive_int
from aikit.elastic.Torch.trace_optim import TraceOptimizer
from aikit.runtime.originals import either

if TYPE_CHECKING:  # CustomSampler inherits EthEaslSampler from here
    from aikit.elastic.Torch.sampler import CustomSampler


LOG_FORMATS = ("eth-easl", "aikit")
ORDER_HINT = ("CustomSampler's arguments after the trace are seed, num_replicas, rank, minibatch_size, verbose, "
              "in eth-easl's order; aikit 0.1 took num_replicas third: pass them by keyword")

_latest: EthEaslSampler | None = None


def latest_sampler() -> EthEaslSampler | None:
    """The sampler made last in this process: eth-easl's optimizers take it when given none."""
    return _latest


# --- the sampler ---------------------------------------------------------------------------------

def micro_batch_named(micro_batch: int | None, minibatch_size: int | None) -> tuple[int | None, str]:
    """``micro_batch`` or eth-easl's ``minibatch_size`` (both refused), and the name written."""
    return either("minibatch_size", micro_batch, minibatch_size)


def check_positional(seed: object, num_replicas: object, rank: object, micro: object, name: str) -> None:
    """The arguments eth-easl's order puts after the trace, checked as the schedule checks them;
    a refusal says the order (aikit 0.1 took ``num_replicas`` third, and such calls land here)."""
    try:
        seed_value(seed)
        index_in(rank, "rank", positive_int(num_replicas, "num_replicas"))
        if micro is not None:
            positive_int(micro, name)
    except (InvalidType, InvalidValue) as error:
        raise type(error)(f"{error} ({ORDER_HINT})") from None


def check_verbose(verbose: object) -> None:
    if verbose is not None and not isinstance(verbose, bool):
        raise InvalidType(f"verbose must be True, False or None, got {verbose!r:.60}")


class EthEaslSampler:
    """eth-easl's names on a sampler that follows a schedule (``CustomSampler`` inherits them,
    and so ``AdaptiveSampler``), with the original's meaning and types."""

    @property
    def minibatch_size(self) -> int | None:
        """``micro_batch`` by eth-easl's name."""
        return self.micro_batch

    @property
    def _counted_in(self) -> int:
        """The micro-batch eth-easl's figures count in: the fixed one, or the most a device holds
        where each step has its own (``max_device_batch``)."""
        schedule = self.schedule
        return schedule.micro_batch if schedule.micro_batch is not None else schedule.max_device_batch

    @cached_property
    def trace_samples(self) -> int | float:
        """Samples the whole trace asks for (``math.inf`` when it repeats)."""
        trace = self.schedule.trace
        return int(trace.sizes.astype(object).sum()) if trace.is_finite else math.inf

    @property
    def minibatches_per_epoch(self) -> int:
        """Micro-batches the data set holds (its last ``len % micro_batch`` samples never train)."""
        return self.dataset_size // self._counted_in

    @property
    def max_epoch(self) -> int | float:
        """eth-easl's estimate of the epochs the trace covers, ``trace_samples // (minibatches_per_epoch
        * micro_batch)`` (an upper bound: steps do not straddle epochs; ``schedule.full_epochs()``
        counts exactly). ``math.inf`` for a trace that repeats."""
        samples, epoch = self.trace_samples, self.minibatches_per_epoch * self._counted_in
        return samples if samples == math.inf else samples // epoch

    def get_epoch_range(self, epoch: int) -> tuple[int, int]:
        """``(start, end)``: epoch ``epoch`` is trace steps ``start..end-1``."""
        start, end, _ = self.schedule.epoch_bounds(epoch)
        return start, end

    def get_epochtrace(self, epoch: int) -> list[int]:
        """The batch sizes of the steps of ``epoch``."""
        start, end = self.get_epoch_range(epoch)
        return self.schedule.trace.window(start, end).tolist()

    def get_batch_assignments(self, epochtrace: list[int]) -> list[list[int]]:
        """For each step of ``epochtrace``, the epoch's micro-batch ids this rank processes
        (micro-batch ``b`` is samples ``b * micro_batch`` to ``(b + 1) * micro_batch - 1`` of
        the epoch's order); an empty list where this rank only joins the all-reduce."""
        if self.schedule.max_device_batch is not None:
            raise InvalidValue("batch assignments number micro-batches of one size; with max_device_batch each step "
                               "has its own: use sampler.epoch_schedule.micro_batches(step, rank)")
        mb = self.schedule.micro_batch
        steps = load_trace(list(epochtrace))
        sizes = steps.sizes
        problems = multiple_problems(steps, mb, self.schedule.micro_name)
        if int(sizes.sum()) > self.minibatches_per_epoch * mb:
            problems.append(f"the steps need {int(sizes.sum())} samples but an epoch holds "
                            f"{self.minibatches_per_epoch * mb}")
        if problems:
            raise InvalidValue("epochtrace cannot be dealt:\n  " + "\n  ".join(problems[:10]))
        plan = EpochSchedule(self.epoch, 0, sizes, self.epoch_schedule.order, mb, self.num_replicas, True)
        return [list(plan.micro_batch_ids(step, self.rank)) for step in range(len(plan))]

    def __bool__(self) -> bool:
        return True  # a sampler is there even when len() is 0 (eth-easl's has this too)

    def _made(self, verbose: bool | None = False, given_rank: object = None) -> None:
        """Be the sampler eth-easl's optimizers take when given none, and print eth-easl's two
        lines about the trace where ``verbose`` (None: as the original, when ``rank=0`` was given)
        on rank 0, word for word (the original crashed on a one-step trace)."""
        global _latest
        _latest = self
        if (given_rank == 0 if verbose is None else verbose) and self.rank == 0:
            trace = self.schedule.trace
            first = trace.window(0, min(2, len(trace)) if trace.is_finite else 2).tolist()
            print(f"    MySampler (rank {self.rank}): Loaded trace starting with {', '.join(map(str, first))},...")
            print(f"    MySampler (rank {self.rank}): trace_samples={self.trace_samples}, "
                  f"minibatches_per_epoch={self.minibatches_per_epoch} => max_epoch=~{self.max_epoch}")


# --- the optimizers ------------------------------------------------------------------------------

def ref_batch_size_named(ref_batch_size: int | None, ref_batchsize: int | None) -> tuple[int | None, str]:
    """``ref_batch_size`` or eth-easl's ``ref_batchsize`` (both refused), and how messages name it:
    the name written, or both where neither was."""
    ref, name = either("ref_batchsize", ref_batch_size, ref_batchsize)
    return ref, name if ref is not None else "ref_batch_size (eth-easl's ref_batchsize)"


class EthEaslNames:
    """eth-easl's names for a trace optimizer's LRs and batch."""

    def get_lr(self) -> tuple[float, ...]:
        """Every param group's LR (the base LR, except during an update)."""
        return self._base_lrs()

    def set_lr(self, values: tuple[float, ...] | list[float]) -> None:
        """Set every param group's LR, one value per group."""
        values = tuple(values)
        if len(values) != len(self.param_groups):
            raise InvalidValue(f"set_lr needs one LR per param group ({len(self.param_groups)}), got {len(values)}")
        for group, lr in zip(self.param_groups, values, strict=True):
            group["lr"] = lr

    def get_bs(self) -> int:
        """The global batch of the current step of the epoch, 0 once the epoch's steps are done."""
        return self.batch

    @property
    def ref_batchsize(self) -> int | None:
        """``ref_batch_size`` by eth-easl's name."""
        return self.ref_batch_size

    def current_lr(self) -> float:
        """The first group's LR for the current step."""
        return self._rule_lr(self.get_lr()[0])

    def adapt_lr(self) -> None:
        """Set every group's LR to the rule's for the current step, from the LR it holds now (every
        update runs through it and puts the base LRs back: eth-easl's subclasses override it)."""
        self.set_lr(self._rule_lr(lr) for lr in self.get_lr())

    def _adapt(self) -> None:
        self.adapt_lr()

    def _rule_lr(self, base: float) -> float:
        """The policy's LR of the current step; past the epoch's steps eth-easl's rules give 0
        (its ConstantOptimizer the base LR)."""
        if self.batch == 0:
            return base * self.policy.rule.factor(0, self.ref_batch_size, None)
        return self._lr_of_update(base)


class EthEaslOptimizer(EthEaslNames, TraceOptimizer):
    """The one trace optimizer in eth-easl's argument order, ``(optimizer, sampler,
    ref_batch_size, log_steps)``, with its rule (:attr:`rule`, set by each name), eth-easl's
    ``ref_batchsize=``, the sampler made last when none is given, and eth-easl's log line
    ``    CustomOptimizer: Step=S, bs=B, lr=(L,)`` at every step ``S`` of an epoch that is a
    multiple of ``log_steps`` (``log_format="aikit"``: :class:`TraceOptimizer`'s line)."""

    rule = "linear"
    per_micro_batch = False  # its LR is a micro-batch's: needs one micro-batch size (no max_device_batch)

    def __init__(self, optimizer: torch.optim.Optimizer, sampler: CustomSampler | None = None,
                 ref_batch_size: int | None = None, log_steps: int | None = None, *, warmup_steps: int = 0,
                 broadcast: bool = True, max_grad_norm: float | None = None, scaler: Any = None,
                 log_format: str = "eth-easl", lr_decay: Callable[[int], float] | None = None,
                 ref_batchsize: int | None = None, skip_nonfinite: bool = True,
                 max_skips_in_a_row: int | None = MAX_SKIPS_IN_A_ROW):
        name = type(self).__name__
        if log_format not in LOG_FORMATS:
            raise InvalidValue(f"log_format must be one of {LOG_FORMATS}, got {log_format!r}")
        self.log_format = log_format
        if lr_decay is not None and self.per_micro_batch:
            raise InvalidType(f"lr_decay must be a function of the samples trained (aikit.core.scaling.cosine_decay or "
                              f"step_decay) for a LinearRule, RootRule, Seesaw or Constant optimizer, got "
                              f"{lr_decay!r:.60} for {name}")
        ref, ref_name = ref_batch_size_named(ref_batch_size, ref_batchsize)
        policy = LRPolicy(self.rule, ref, warmup_steps, lr_decay, user=name, ref_name=ref_name)
        super().__init__(optimizer, latest_sampler() if sampler is None else sampler, policy=policy,
                         log_steps=log_steps, broadcast=broadcast, max_grad_norm=max_grad_norm, scaler=scaler,
                         skip_nonfinite=skip_nonfinite, max_skips_in_a_row=max_skips_in_a_row)
        if self.per_micro_batch and self.sampler.schedule.max_device_batch is not None:
            raise InvalidValue(
                f"{name} scales its LR from one micro-batch of micro_batch samples, but this sampler's micro-batch "
                "varies by step (max_device_batch): build the CustomSampler with micro_batch (eth-easl's "
                "minibatch_size), or use LinearRuleOptimizer / RootRuleOptimizer / ConstantOptimizer")

    def _log(self, step: int, batch: int, lr: tuple[float, ...]) -> None:
        if self.log_format == "aikit":
            super()._log(step, batch, lr)
        elif step % self.log_steps == 0:
            for line in self._log_lines(step, batch, lr):
                print(line, flush=True)

    def _log_lines(self, step: int, batch: int, lr: tuple[float, ...]) -> list[str]:
        return [f"    CustomOptimizer: Step={step}, bs={batch}, lr={lr}"]


# eth-easl's names for the one trace optimizer with a rule (SeesawOptimizer is aikit's, in the same family):
class LinearRuleOptimizer(EthEaslOptimizer):
    """``TraceOptimizer(rule="linear")``: the LR proportional to the global batch (Goyal et al., 2017): for SGD."""
    rule = "linear"


class RootRuleOptimizer(EthEaslOptimizer):
    """``TraceOptimizer(rule="sqrt")``: the LR proportional to the batch's square root (Malladi et al., 2022)."""
    rule = "sqrt"


class SeesawOptimizer(EthEaslOptimizer):
    """``TraceOptimizer(rule="seesaw")`` (Meterez et al., 2025): ``base x lr_decay(samples) x sqrt(B / ref)``."""
    rule = "seesaw"


class ConstantOptimizer(EthEaslOptimizer):
    """``TraceOptimizer(rule="constant")``: the wrapped optimizer's LR whatever the batch (no ``ref_batch_size``)."""
    rule = "constant"


class CustomOptimizer(EthEaslOptimizer):
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


class LinearRuleMomentumOptimizer(EthEaslOptimizer):
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
        self.set_lr(self.policy.lr(lr, micro) for lr in self.get_lr())
        micro_batches = self.get_bs() // micro
        for group in self.param_groups:
            group["weight_decay"] = self.weight_decay * micro_batches


def adascale_line(step: int, gain: tuple[float, ...], grad_var_avg: Any, grad_sqr_avg: Any) -> str:
    """eth-easl's AdaScale log line."""
    return f"    Adascale: Step={step}, gain={gain}, grad_var_avg={grad_var_avg}, grad_sqr_avg={grad_sqr_avg}"
