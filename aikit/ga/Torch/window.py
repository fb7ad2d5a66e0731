"""An update's window in the torch GA wrapper: its micro-steps, what they declared, what they weigh.

``steps`` micro-steps make an update. :class:`Window` counts those taken (``micro_step``) and what
each declared in ``accumulate()`` its mean loss to be a mean over: its samples (``samples=n``)
or its loss terms (``weight=n``), the same in every micro-step of an update or in none. It owns
the GA engine (:class:`~aikit.runtime.Torch.accumulator.Accumulator`) the wrapper made, gives
each micro-step its weight through it and the update the factor that turns
the accumulated sum into the mean, all by :mod:`aikit.core.ga`: nothing declared, each
micro-step weighs ``1 / micro-steps``; samples, their share ``n / G`` of the global batch
relative to a *unit* size (even micro-batches cost no multiply; a short window is corrected);
loss terms, Σ nᵢ·gᵢ / Σ nᵢ with the total summed over the replicas at the update. The wrapper
starts a new window at every update and saves this one's counts in its ``state_dict``
(:mod:`aikit.ga.Torch.state`), so a resume mid-update continues identically.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from aikit.core.errors import InvalidValue
from aikit.core.ga import common_size, equal_share, relative_weight, sample_share, short_window_factor
from aikit.core.plan import unweighted_problem
from aikit.core.validate import non_negative_int
from aikit.runtime.process import TORCH, plan_of
from aikit.runtime.Torch.accumulator import Accumulator
from aikit.runtime.Torch.gradient_sync import accumulates_out_of_reach


class Window:
    """One update's micro-steps so far, what they declared, and the weights that follow."""

    def __init__(self, accumulator: Accumulator) -> None:
        self.accumulator = accumulator
        self.micro_step = 0  # micro-steps taken towards the next update
        self.samples = 0  # samples declared (accumulate(samples=...))
        self.weighted = 0  # micro-steps that declared their samples or loss terms
        self.declared: str | None = None  # what they declared: "samples" or "weight" (None: nothing yet)
        self.unit: int | None = None  # the micro-batch size the weights are relative to
        self.empty = False  # the running micro-step declared 0 samples or loss terms: it needs no backward

    @classmethod
    def restored(cls, ga: dict[str, Any], accumulator: Accumulator) -> Window:
        """The window a checked ``state_dict()["ga"]`` saved."""
        window = cls(accumulator)
        window.micro_step, window.samples, window.weighted, window.unit = (ga["position"], ga["samples"],
                                                                           ga["weighted"], ga["unit"])
        window.declared = "weight" if ga.get("terms") is not None else "samples" if ga["weighted"] else None
        return window

    # --- a micro-step ----------------------------------------------------------------------------
    def declaration(self, samples: Any, weight: Any, reduction: str) -> tuple[str | None, int | None]:
        """What a micro-step declares (``"samples"``, ``"weight"`` or None) and its samples,
        checked against each other, the update's earlier micro-steps and the ``reduction``."""
        declared = "weight" if weight is not None else "samples" if samples is not None else None
        if samples is not None and weight is not None:
            raise InvalidValue(
                f"accumulate() got samples={samples} and weight={weight}: a micro-batch's mean loss is a mean over "
                "its samples (samples=) or over its loss terms, such as tokens (weight=), not both"
            )
        if declared is not None and self.declared not in (None, declared):
            raise InvalidValue(
                f"this micro-step declares {declared}=, but the update's earlier ones declared {self.declared}=: "
                "declare the same in every micro-step of an update"
            )
        if samples is not None:
            samples = non_negative_int(samples, "samples")
        if reduction == "sum" and declared == "samples":
            raise InvalidValue(
                f"accumulate(samples={samples}) weighs a mean loss's micro-batch by its share of the global "
                "batch, but this optimizer sums the micro-batch gradients (reduction='sum'), where a summed "
                "loss already counts its samples: leave out samples=, or use reduction='mean' with a mean loss"
            )
        if reduction == "sum" and declared == "weight":
            raise InvalidValue(
                f"accumulate(weight={weight}) weighs a mean loss's micro-batch by its loss terms, but this optimizer "
                "sums the micro-batch gradients (reduction='sum'), where a summed loss already counts its terms: "
                "leave out weight=, or use reduction='mean' with a mean loss"
            )
        return declared, samples

    def weighing(self, model: torch.nn.Module | None, samples: int | None, weight: Any, *,
                 global_batch_size: int | None, parts: int, fold: bool,
                 start_sum: bool) -> contextlib.AbstractContextManager:
        """The context in which a micro-step's backward of ``model`` takes its declared weight.

        ``weight`` loss terms: counted, and applied at the model's outputs; ``start_sum`` starts
        their sum over the replicas now (before the update's last backward, which it overlaps).
        ``samples``: weighed relative to the unit, which the update's first such micro-step
        fixes from the global batch split in ``parts``; folded into ``.grad`` where ``fold`` (not
        where DDP syncs this backward), at the model's outputs where the gradients accumulate
        out of the optimizer's reach (FSDP2)."""
        engine = self.accumulator
        if weight is not None:
            weighing = engine.count_terms(model, weight)
            if start_sum:
                engine.start_terms_sum()  # it overlaps the last backward
            return weighing
        if self.unit is None:
            self.unit = common_size(_global_batch(global_batch_size, samples), parts)
        factor = relative_weight(samples, self.unit)
        if accumulates_out_of_reach(model):  # FSDP2: the gradients accumulate unsharded, not in .grad
            return contextlib.nullcontext() if factor is None else engine.outputs.applied(model, factor)
        engine.weigh_next(factor, fold=fold)
        return contextlib.nullcontext()

    def declare(self, declared: str, samples: int | None, weight: Any = None) -> None:
        """Count a micro-step that declared ``declared`` (and its ``samples``, if those)."""
        self.samples += samples or 0
        self.weighted += 1
        self.declared = declared
        self.empty = samples == 0 if declared == "samples" else not isinstance(weight, torch.Tensor) and weight == 0

    def take_empty(self) -> bool:
        """Whether the micro-step that ends now declared an empty micro-batch (and forget it)."""
        empty, self.empty = self.empty, False
        return empty

    # --- the update ------------------------------------------------------------------------------
    def scale(self, *, reduction: str, reducing: bool, num_replicas: int, short: bool,
              global_batch_size: int | None) -> float | torch.Tensor:
        """What multiplies the accumulated gradient at this window's update.

        ``reducing``: the wrapper sums the replicas' gradients at the update, with the samples
        and loss terms they counted in the same all-reduce; else DDP or FSDP2 average them over
        the ``num_replicas``. ``short``: ``flush()`` ends the window before its ``steps``. Refused,
        the gradients cleared, where the micro-steps' declarations do not add up to the update."""
        engine = self.accumulator
        if self.weighted not in (0, self.micro_step):
            _refuse(engine, f"only {self.weighted} of the {self.micro_step} micro-steps of this update declared "
                            f"{self.declared}= in accumulate(): declare them in every micro-step or in none")
        averaging = 1 if reducing else num_replicas  # DDP and FSDP2 average over the processes; reducing sums
        if self.declared == "weight":
            return engine.terms_scale(_summed_terms(engine, num_replicas, reducing), averaging)
        samples = self.samples
        if reducing and num_replicas > 1:
            (samples,) = engine.reduce([float(samples)])
            samples = round(samples)
        if not self.weighted:  # reducing, the replicas' sum is divided by the world; DDP averages it itself
            problem = None if short or reduction == "sum" else unweighted_problem(plan_of(TORCH), self.micro_step,
                                                                                  global_batch_size)
            if problem:
                _refuse(engine, problem)
            return equal_share(self.micro_step, reduction, num_replicas, averaging)
        total = _global_batch(global_batch_size, samples)
        # reducing, the samples are summed with the gradients: a short window (an epoch's last)
        # is exactly corrected to its mean; alone, only flush() says a window is short on purpose
        seen = reducing or num_replicas == 1  # the samples counted are every replica's
        if (samples > total and seen) or (num_replicas == 1 and not reducing and not short and samples != total):
            _refuse(engine, f"the {self.micro_step} micro-batches of this update held {samples} samples, but "
                            f"global_batch_size is {total}: feed exactly that many per update, or call "
                            "optimizer.flush() after an epoch's last, shorter window")
        scale = sample_share(self.unit, total, averaging)
        if samples != total and seen:
            scale *= short_window_factor(total, samples)
        return scale


def _global_batch(global_batch_size: int | None, samples: int) -> int:
    """The samples of an update: the wrapper's ``global_batch_size``, else the plan
    ``aikit.elastic.Torch.init`` published (``samples``: the declaration that needs it)."""
    if global_batch_size is not None:
        return global_batch_size
    plan = plan_of(TORCH)
    if plan is None:
        raise InvalidValue(
            f"accumulate(samples={samples}) weighs the micro-batch by samples / global batch, but "
            "no global batch is known: pass Optimizer(..., global_batch_size=G) or call "
            "aikit.elastic.Torch.init(G, max_device_batch) first"
        )
    return plan.global_batch_size


def _summed_terms(engine: Accumulator, num_replicas: int, reducing: bool) -> int | float | torch.Tensor:
    """This update's loss terms over every replica: with the gradients in the update's own
    all-reduce (reducing), from the sum started before the last backward (DDP, FSDP2), or
    this process's alone."""
    if num_replicas == 1:
        return engine.take_terms()
    if reducing:
        (total,) = engine.reduce([engine.take_terms()])
        return total
    return engine.take_terms(summed=True)


def _refuse(engine: Accumulator, message: str) -> None:
    """Refuse the update: nothing is applied, the accumulated gradients are cleared."""
    engine.discard()
    engine.optimizer.zero_grad()
    raise InvalidValue(message)


class KeptNames:
    """The GA wrapper's counters by the names users wrote before aikit gave each one name:
    ``position`` (aikit 0.x's docs) for ``micro_step``, ``micro_steps`` (the name aikit's Run:AI
    migration gave ``runai.step``) for ``micro_steps_taken``."""

    micro_step: int
    micro_steps_taken: int

    @property
    def position(self) -> int:
        """:attr:`micro_step`: the micro-steps taken towards the next update."""
        return self.micro_step

    @property
    def micro_steps(self) -> int:
        """:attr:`micro_steps_taken`: every ``step()`` so far."""
        return self.micro_steps_taken

    @micro_steps.setter
    def micro_steps(self, taken: int) -> None:
        self.micro_steps_taken = taken
