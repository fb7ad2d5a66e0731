"""The fixed-batch frontier, and what an update costs: how a batch schedule is judged honestly.

McCandlish et al. (2018, "An Empirical Model of Large-Batch Training") found that, to reach a
given loss, fixed batches ``B`` (each at its tuned LR) need ``S`` updates and ``E = B·S`` samples on
one curve, ``(S/S_min − 1)(E/E_min − 1) = 1``: a batch far below the critical batch
``B_crit = E_min/S_min`` wastes updates, one far above wastes samples. On that curve
``S = S_min + E_min/B``, a line in ``1/B``, which :func:`fit_frontier` fits by least squares through
a grid's runs. A schedule's :meth:`Frontier.excess` ``(S/S_min − 1)(E/E_min − 1)`` is below 1
exactly where no fixed batch reaches the target in as few updates *and* as few samples: it beats
every fixed batch on any hardware whose update costs a fixed part plus a part per sample, so the
verdict does not depend on the machine the runs were timed on.

Time is then a matter of the hardware's constants, :class:`UpdateCost`: seconds per update as a
fixed part plus a part per sample above a saturation batch (0: this CPU, where every sample
costs; an accelerator runs a batch up to its saturation for about the price of one sample).
:func:`fit_update_cost` measures them from updates timed at two or more batches; the time-optimal
fixed batch at a cost is ``√(per_update · B_crit / per_sample)`` (:meth:`Frontier.best_batch`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from aikit.core.errors import InvalidValue
from aikit.core.validate import checked_float, non_negative_int, positive_int

__all__ = ["Frontier", "UpdateCost", "fit_frontier", "fit_update_cost"]


@dataclass(frozen=True)
class UpdateCost:
    """Seconds an update of ``batch`` samples takes: ``per_update + per_sample · max(0, batch − saturation)``."""

    per_update: float
    per_sample: float
    saturation: int = 0

    def __post_init__(self) -> None:
        checked_float(self.per_update, "per_update", "seconds >= 0", lambda s: 0 <= s < math.inf)
        checked_float(self.per_sample, "per_sample", "seconds >= 0", lambda s: 0 <= s < math.inf)
        non_negative_int(self.saturation, "saturation")
        if self.per_update == 0 and self.per_sample == 0:
            raise InvalidValue("an update cannot cost nothing: per_update and per_sample are both 0")

    def seconds(self, batches: int | Sequence[int] | np.ndarray) -> float:
        """The time of updates of these ``batches`` (one batch: one update), summed."""
        sizes = np.atleast_1d(np.asarray(batches, dtype=np.float64))
        return float(np.sum(self.per_update + self.per_sample * np.maximum(0.0, sizes - self.saturation)))


def fit_update_cost(batches: Sequence[int], seconds: Sequence[float]) -> UpdateCost:
    """The per-update and per-sample cost (non-negative least squares) of updates of ``batches``
    samples that took ``seconds`` each. Updates at one batch size alone cannot tell a fixed cost
    from a cost per sample, and are refused."""
    sizes = np.array([positive_int(b, "batches[i]") for b in batches], dtype=np.float64)
    times = np.array([checked_float(s, "seconds[i]", "a positive finite duration", lambda t: 0 < t < math.inf)
                      for s in seconds], dtype=np.float64)
    if len(sizes) != len(times):
        raise InvalidValue(f"fit_update_cost got {len(sizes)} batches and {len(times)} times: give one time per update")
    distinct = sorted(set(sizes.astype(int).tolist()))
    if len(distinct) < 2:
        raise InvalidValue(
            f"updates timed at one batch size only ({distinct[0] if distinct else 'none'}) cannot tell the fixed cost "
            "of an update from its cost per sample: time updates at two or more batch sizes (e.g. B and 2B)")
    (per_update, per_sample), _ = nnls(np.column_stack([np.ones_like(sizes), sizes]), times)
    if per_update == 0 and per_sample == 0:
        raise InvalidValue("the timed updates fit no positive cost: time more updates")
    return UpdateCost(float(per_update), float(per_sample))


@dataclass(frozen=True)
class Frontier:
    """McCandlish's fixed-batch frontier to one target: ``S_min`` updates, ``E_min`` samples."""

    min_updates: float
    min_samples: float

    @property
    def critical_batch(self) -> float:
        """``B_crit = E_min / S_min``: the batch at which a fixed batch pays twice the minimum of both."""
        return self.min_samples / self.min_updates

    def updates(self, batch: float) -> float:
        """The updates a fixed ``batch`` needs on the frontier: ``S_min (1 + B_crit / B)``."""
        return self.min_updates + self.min_samples / batch

    def excess(self, updates: float, samples: float) -> float:
        """``(S/S_min − 1)(E/E_min − 1)``: 1 on the frontier, below it where a run beats every fixed
        batch in updates and in samples at once (inf: the target was not reached). Negative where
        a run needed fewer updates or samples than the frontier's minimum: it is not on the model."""
        if not (math.isfinite(updates) and math.isfinite(samples)):
            return math.inf
        return (updates / self.min_updates - 1) * (samples / self.min_samples - 1)

    def best_batch(self, cost: UpdateCost) -> float:
        """The fixed batch that reaches the target soonest at an affine ``cost`` (saturation 0):
        ``√(per_update · B_crit / per_sample)``, where ``T = per_update·S + per_sample·E`` is least."""
        if cost.saturation:
            raise InvalidValue(f"best_batch() takes an affine cost (saturation 0), got saturation={cost.saturation}: "
                               "compare cost.seconds() of the frontier's batches instead")
        if cost.per_sample == 0:
            return math.inf
        return math.sqrt(cost.per_update * self.critical_batch / cost.per_sample)


def fit_frontier(batches: Sequence[int], updates: Sequence[float]) -> Frontier:
    """The frontier through fixed-batch runs (``batches[i]``, each at its tuned LR, took
    ``updates[i]`` updates to the target): least squares of ``S = S_min + E_min / B``. Runs that
    did not reach the target (inf) are left out; two batches that reached it are needed, and
    runs whose updates do not fall as the batch grows are refused (they are off the model)."""
    points = [(positive_int(b, "batches[i]"), float(s)) for b, s in zip(batches, updates, strict=True)]
    reached = [(b, s) for b, s in points if math.isfinite(s)]
    if len({b for b, _ in reached}) < 2:
        raise InvalidValue(f"a frontier needs two or more batch sizes that reached the target, got {len(reached)} "
                           f"of {len(points)} runs ({sorted({b for b, _ in reached})}): lower the target or run "
                           "more batch sizes")
    if any(s <= 0 for _, s in reached):
        raise InvalidValue(f"updates to the target must be positive, got {[s for _, s in reached]}")
    inverse = np.array([1.0 / b for b, _ in reached])
    needed = np.array([s for _, s in reached])
    (min_updates, min_samples), _ = nnls(np.column_stack([np.ones_like(inverse), inverse]), needed)
    if min_updates <= 0 or min_samples <= 0:
        raise InvalidValue(
            f"the runs are off McCandlish's model (updates should fall as the batch grows, towards a floor): fitted "
            f"S_min={min_updates:.3g}, E_min={min_samples:.3g} from batches {[b for b, _ in reached]} and updates "
            f"{[round(s) for _, s in reached]}; run batches on both sides of the critical batch")
    return Frontier(float(min_updates), float(min_samples))
