"""eth-easl's variable batch size by its own names: the edge between its scripts and aikit.

A script written for eth-easl's ``variable_batch_size.py`` runs with ``import aikit.elastic.Torch
as vbs``; everything of eth-easl's vocabulary that it meets is here, over aikit's own
:class:`~aikit.elastic.Torch.sampler.TraceSampler` and
:class:`~aikit.elastic.Torch.trace_optim.TraceOptimizer`, as ``aikit/ga/Torch/runai.py`` is for
Run:AI's AIkit; nothing of aikit's builds on it:

* ``CustomSampler``: the sampler in eth-easl's positional order ``(dataset, trace, seed,
  num_replicas, rank, minibatch_size, verbose)``, ``minibatch_size=`` for ``micro_batch=``,
  ``minibatch_size``, ``trace_samples``, ``minibatches_per_epoch``, ``max_epoch``,
  ``get_epoch_range``, ``get_epochtrace``, ``get_batch_assignments``, its two printed lines, and
  the sampler made last, which eth-easl's optimizers take when given none;
* its optimizer classes: ``LinearRuleOptimizer``, ``RootRuleOptimizer`` and ``ConstantOptimizer``,
  each the one trace optimizer with a rule (as is ``SeesawOptimizer``, the name aikit gave
  Seesaw's rule in that family: its users write the family's surface), and its three that
  differ, ``CustomOptimizer`` (its base: the LR unscaled, micro-batch gradients averaged or
  summed), ``LinearRuleMomentumOptimizer`` (summed gradients, one micro-batch's LR, weight decay
  per micro-batch) and ``AdaScaleOptimizer`` (one micro-batch's LR times each param group's gain);
* their argument order ``(optimizer, sampler, ref_batchsize, log_steps)``, ``ref_batchsize=`` for
  aikit's ``ref_batch_size=``, ``get_bs``, ``get_lr``, ``set_lr``, ``current_lr``, ``adapt_lr``,
  ``ref_batchsize``, and their log lines (``    CustomOptimizer: Step=S, bs=B, lr=(L,)``,
  AdaScale's ``    Adascale: ...``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sized
from functools import cached_property
from typing import Any

import numpy as np
import torch

from aikit.core.errors import InvalidType, InvalidValue
from aikit.core.lr_policy import LRPolicy
from aikit.core.schedule import EpochSchedule, seed_value
from aikit.core.trace import load_trace, multiple_problems
from aikit.core.validate import checked_float, index_in, positive_int
from aikit.elastic.Torch.measures import AdaScaleGains
from aikit.elastic.Torch.sampler import TraceSampler
from aikit.elastic.Torch.trace_optim import TraceOptimizer
from aikit.runtime.originals import either
from aikit.runtime.process import remember_sampler, sampler_made_last
from aikit.runtime.Torch import distributed

LOG_FORMATS = ("eth-easl", "aikit")
ORDER_HINT = ("CustomSampler's arguments after the trace are seed, num_replicas, rank, minibatch_size, verbose, "
              "in eth-easl's order; aikit 0.1 took num_replicas third: pass them by keyword")

def latest_sampler() -> CustomSampler | None:
    """The sampler made last in this process: eth-easl's optimizers take it when given none."""
    return sampler_made_last()


# --- the sampler ---------------------------------------------------------------------------------

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


class CustomSampler(TraceSampler):
    """eth-easl's ``CustomSampler``: :class:`~aikit.elastic.Torch.sampler.TraceSampler` in
    eth-easl's argument order, ``(dataset, trace, seed, num_replicas, rank, micro_batch,
    verbose)``, positionally or by keyword (``minibatch_size=``, eth-easl's name for
    ``micro_batch``, says the same), with eth-easl's figures (``minibatch_size``,
    ``trace_samples``, ``minibatches_per_epoch``, ``max_epoch``), ``get_epoch_range``,
    ``get_epochtrace`` and ``get_batch_assignments``, its two printed lines (``verbose``; None: as
    the original, only when ``rank=0`` is given), and the sampler eth-easl's optimizers take when
    given none: the one made last. With ``max_device_batch`` eth-easl's figures count
    micro-batches of ``max_device_batch``."""

    def __init__(self, dataset: Sized | int | None = None, trace: Any = None, seed: int = 42,
                 num_replicas: int | None = None, rank: int | None = None, micro_batch: int | None = None,
                 verbose: bool | None = None, *, minibatch_size: int | None = None, **options: Any):
        check_verbose(verbose)
        micro, name = either("minibatch_size", micro_batch, minibatch_size)
        check_positional(seed, distributed.world_size() if num_replicas is None else num_replicas,
                         distributed.rank() if rank is None else rank, micro, name)
        super().__init__(dataset, trace, micro_batch=micro, num_replicas=num_replicas, rank=rank, seed=seed,
                         micro_name=name, **options)
        remember_sampler(self)
        if (rank == 0 if verbose is None else verbose) and self.rank == 0:
            trace = self.schedule.trace
            first = trace.window(0, min(2, len(trace)) if trace.is_finite else 2).tolist()
            print(f"    MySampler (rank {self.rank}): Loaded trace starting with {', '.join(map(str, first))},...")
            print(f"    MySampler (rank {self.rank}): trace_samples={self.trace_samples}, "
                  f"minibatches_per_epoch={self.minibatches_per_epoch} => max_epoch=~{self.max_epoch}")

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


# --- the optimizers ------------------------------------------------------------------------------

def ref_batch_size_named(ref_batch_size: int | None, ref_batchsize: int | None) -> tuple[int | None, str]:
    """``ref_batch_size`` or eth-easl's ``ref_batchsize`` (both refused), and how messages name it:
    the name written, or both where neither was."""
    ref, name = either("ref_batchsize", ref_batch_size, ref_batchsize)
    return ref, name if ref is not None else "ref_batch_size (eth-easl's ref_batchsize)"


def checked_options(log_format: str, lr_decay: object, per_micro_batch: bool, name: str) -> str:
    """``log_format``, checked, and no ``lr_decay`` where the LR is one micro-batch's."""
    if log_format not in LOG_FORMATS:
        raise InvalidValue(f"log_format must be one of {LOG_FORMATS}, got {log_format!r}")
    if lr_decay is not None and per_micro_batch:
        raise InvalidType(f"lr_decay must be a function of the samples trained (aikit.core.scaling.cosine_decay or "
                          f"step_decay) for a LinearRule, RootRule, Seesaw or Constant optimizer, got "
                          f"{lr_decay!r:.60} for {name}")
    return log_format


def check_one_micro_batch(sampler: TraceSampler, name: str) -> None:
    """An LR of one micro-batch needs the sampler's one micro-batch size."""
    if sampler.schedule.max_device_batch is not None:
        raise InvalidValue(
            f"{name} scales its LR from one micro-batch of micro_batch samples, but this sampler's micro-batch "
            "varies by step (max_device_batch): build the CustomSampler with micro_batch (eth-easl's "
            "minibatch_size), or use LinearRuleOptimizer / RootRuleOptimizer / ConstantOptimizer")


class EthEaslOptimizer:
    """eth-easl's surface over the one trace optimizer (a base beside ``TraceOptimizer`` of each of
    its classes), with its rule (:attr:`rule`, set by each name): the surface the module lists,
    ``adapt_lr`` run by every update, its log line at every step ``S`` of an epoch that is a multiple
    of ``log_steps`` (``log_format="aikit"``: the trace optimizer's line)."""

    rule = "linear"
    per_micro_batch = False  # its LR is a micro-batch's: needs one micro-batch size (no max_device_batch)

    def __init__(self, optimizer: torch.optim.Optimizer, sampler: CustomSampler | None = None,
                 ref_batch_size: int | None = None, log_steps: int | None = None, *, warmup_steps: int = 0,
                 log_format: str = "eth-easl", lr_decay: Callable[[int], float] | None = None,
                 ref_batchsize: int | None = None, **options: Any):  # options: TraceOptimizer's (broadcast=, ...)
        name = type(self).__name__
        self.log_format = checked_options(log_format, lr_decay, self.per_micro_batch, name)
        ref, ref_name = ref_batch_size_named(ref_batch_size, ref_batchsize)
        policy = LRPolicy(self.rule, ref, warmup_steps, lr_decay, user=name, ref_name=ref_name)
        super().__init__(optimizer, latest_sampler() if sampler is None else sampler, policy=policy,
                         log_steps=log_steps, **options)
        if self.per_micro_batch:
            check_one_micro_batch(self.sampler, name)

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
        """Set every group's LR to the rule's for the current step, from the LR it holds now."""
        self.set_lr(self._rule_lr(lr) for lr in self.get_lr())

    def _adapt(self) -> None:
        self.adapt_lr()

    def _rule_lr(self, base: float) -> float:
        """The policy's LR of the current step; past the epoch's steps 0 (ConstantOptimizer: the base LR)."""
        if self.batch == 0:
            return base * self.policy.rule.factor(0, self.ref_batch_size, None)
        return self._lr_of_update(base)

    def _log(self, step: int, batch: int, lr: tuple[float, ...]) -> None:
        if self.log_format == "aikit":
            super()._log(step, batch, lr)
        elif step % self.log_steps == 0:
            print("\n".join(self._log_lines(step, batch, lr)), flush=True)

    def _log_lines(self, step: int, batch: int, lr: tuple[float, ...]) -> list[str]:
        return [f"    CustomOptimizer: Step={step}, bs={batch}, lr={lr}"]


# eth-easl's names for the one trace optimizer with a rule (SeesawOptimizer is aikit's, in the same family):
class LinearRuleOptimizer(EthEaslOptimizer, TraceOptimizer):
    """``TraceOptimizer(rule="linear")``: the LR proportional to the global batch (Goyal et al., 2017): for SGD."""
    rule = "linear"


class RootRuleOptimizer(EthEaslOptimizer, TraceOptimizer):
    """``TraceOptimizer(rule="sqrt")``: the LR proportional to the batch's square root (Malladi et al., 2022)."""
    rule = "sqrt"


class SeesawOptimizer(EthEaslOptimizer, TraceOptimizer):
    """``TraceOptimizer(rule="seesaw")`` (Meterez et al., 2025): ``base x lr_decay(samples) x sqrt(B / ref)``."""
    rule = "seesaw"


class ConstantOptimizer(EthEaslOptimizer, TraceOptimizer):
    """``TraceOptimizer(rule="constant")``: the wrapped optimizer's LR whatever the batch (no ``ref_batch_size``)."""
    rule = "constant"


class CustomOptimizer(EthEaslOptimizer, TraceOptimizer):
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


class LinearRuleMomentumOptimizer(EthEaslOptimizer, TraceOptimizer):
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
        micro = self.epoch_schedule.micro_batch
        self.set_lr(self.policy.lr(lr, micro) for lr in self.get_lr())
        micro_batches = self.get_bs() // micro
        for group in self.param_groups:
            group["weight_decay"] = self.weight_decay * micro_batches


class AdaScaleOptimizer(EthEaslOptimizer, TraceOptimizer):
    """eth-easl's AdaScale (Johnson et al., 2020), arguments ``(optimizer, sampler, log_steps, ref_batch_size=32)``:
    every update's LR is the base LR for one micro-batch, ``lr · micro_batch / ref_batch_size``, times each param
    group's own gain of the step's batch over a micro-batch (as eth-easl's and fairscale's); :attr:`progress`
    advances by the whole model's gain (an LR schedule's clock, e.g. ``LambdaLR(optimizer, lambda _:
    f(optimizer.progress))``); ``decay`` smooths the noise (:class:`~aikit.elastic.Torch.measures.AdaScaleGains`)."""

    rule = "linear"
    per_micro_batch = True
    _measures_noise = True

    def __init__(self, optimizer: torch.optim.Optimizer, sampler: CustomSampler | None = None,
                 log_steps: int | None = None, ref_batch_size: int | None = None, *, decay: float = 0.99,
                 **options: Any):
        if options.get("warmup_steps"):
            raise InvalidValue("AdaScaleOptimizer has no warmup: the gain sets the LR from the measured noise")
        if ref_batch_size is None and options.get("ref_batchsize") is None:
            ref_batch_size = 32  # eth-easl's default
        super().__init__(optimizer, sampler, ref_batch_size, log_steps, noise_decay=decay, **options)
        self.measures = AdaScaleGains(self, self.noise)
        self.parts = {"adascale": self.measures}  # its state, as it always saved

    @property
    def progress(self) -> float:
        """Base-batch (micro-batch) steps' worth of progress so far: the sum of the whole model's gains."""
        return self.measures.progress

    @property
    def last_gain(self) -> float:
        """The whole model's gain at the last update (1 before the first)."""
        return self.measures.last_gain

    def gain(self) -> tuple[float, ...]:
        """Each param group's gain at the last update (1 before the first)."""
        return self.measures.gains

    @property
    def grad_var_avg(self) -> np.ndarray:
        """eth-easl's smoothed variance of a micro-batch's gradient per group, ``tr(Σ) / micro_batch``."""
        return self.measures.averages()[0]

    @property
    def grad_sqr_avg(self) -> np.ndarray:
        """eth-easl's smoothed ``|G|²`` per group."""
        return self.measures.averages()[1]

    def adapt_lr(self) -> None:
        self.set_lr(self.current_lr())

    def current_lr(self) -> tuple[float, ...]:
        """Every group's LR for the current step (a tuple, as eth-easl's): one micro-batch's times the group's gain."""
        micro = self.epoch_schedule.micro_batch
        return tuple(self.policy.lr(lr, micro) * r for lr, r in zip(self.get_lr(), self.gain(), strict=True))

    def _log_lines(self, step: int, batch: int, lr: tuple[float, ...]) -> list[str]:
        return [f"    Adascale: Step={step}, gain={self.gain()}, grad_var_avg={self.grad_var_avg}, "
                f"grad_sqr_avg={self.grad_sqr_avg}", *super()._log_lines(step, batch, lr)]
