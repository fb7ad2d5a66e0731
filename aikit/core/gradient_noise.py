"""Gradient noise from the gradients GA already computes: |G|², tr(Σ), the noise scale, AdaScale.

Every update of a data-parallel, accumulating run holds several *parts* of one global batch: the
micro-batches of one process, or each replica's local accumulated gradient. Each part's gradient
``g_j`` is the mean over its ``b_j`` samples, and the update's gradient is their sample-weighted
mean ``ḡ = Σ_j (b_j / B) g_j`` over ``B = Σ_j b_j`` samples. With per-sample gradients drawn
i.i.d. with mean ``G`` and covariance ``Σ``:

    E |g_j|² = |G|² + tr(Σ) / b_j            E |ḡ|² = |G|² + tr(Σ) / B

so with ``A = Σ_j (b_j / B) |g_j|²`` (whose expectation is ``|G|² + k·tr(Σ)/B`` for ``k`` non-empty
parts), two unbiased estimates follow from norms alone, exact for ragged parts too:

    tr(Σ) = (A - |ḡ|²) · B / (k - 1)          |G|² = |ḡ|² - tr(Σ) / B

(McCandlish et al., 2018, "An Empirical Model of Large-Batch Training", appendix A, generalised
to unequal parts). Their ratio ``tr(Σ) / |G|²`` is the *simple noise scale*: the batch size
around which a larger batch stops paying. Each single estimate is very noisy, so
:class:`NoiseTracker` smooths numerator and denominator separately (their ratio of averages,
as the paper advises) with a bias-corrected exponential average.

AdaScale (Johnson et al., 2020) and Pollux (Qiao et al., OSDI'21) use the same two numbers: the
*gain* of batch ``B`` over a base batch ``B0`` is ``r = (tr(Σ)/B0 + |G|²) / (tr(Σ)/B + |G|²)``,
between 1 (no noise: a bigger batch adds nothing) and ``B / B0`` (pure noise: it is worth
``B / B0`` base steps); the *statistical efficiency* ``r · B0 / B`` is the progress per sample
relative to the base batch.

Framework-free: the adapters compute squared norms with their own tensors and pass floats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from aikit.core.errors import InvalidValue
from aikit.core.validate import checked_float, non_negative_int, positive_int

__all__ = ["NoiseEstimate", "NoiseTracker", "efficiency", "estimate", "estimate_from_totals", "gain", "gains",
           "update_estimates"]


@dataclass(frozen=True)
class NoiseEstimate:
    """Unbiased estimates of ``|G|²`` (squared norm of the true gradient) and ``tr(Σ)`` (the
    trace of the per-sample gradient covariance) from one update. Either may come out negative
    from a single noisy update; only averages of many are meaningful."""

    grad_sq: float
    trace: float

    @property
    def noise_scale(self) -> float:
        """``tr(Σ) / |G|²``, the simple noise scale (inf when ``|G|²`` is not positive)."""
        return self.trace / self.grad_sq if self.grad_sq > 0 else math.inf


def _finite_non_negative(number: float) -> bool:
    return 0 <= number < math.inf


def estimate(part_sq_norms: Sequence[float], part_samples: Sequence[int], mean_sq_norm: float) -> NoiseEstimate:
    """Unbiased ``|G|²`` and ``tr(Σ)`` from one update's parts (see the module docstring).

    ``part_sq_norms[j]`` is ``|g_j|²`` for the mean gradient of part ``j`` over its
    ``part_samples[j]`` samples (a part with no samples is ignored: an idle replica), and
    ``mean_sq_norm`` is ``|ḡ|²`` for the sample-weighted mean of the parts (the update's gradient).
    Needs at least two non-empty parts: one part alone cannot tell noise from signal.
    """
    if len(part_sq_norms) != len(part_samples):
        raise InvalidValue(
            f"part_sq_norms has {len(part_sq_norms)} entries but part_samples has {len(part_samples)}: "
            "give one squared norm and one sample count per part"
        )
    parts = []
    for j, (norm, samples) in enumerate(zip(part_sq_norms, part_samples, strict=True)):
        samples = non_negative_int(samples, f"part_samples[{j}]")
        norm = checked_float(norm, f"part_sq_norms[{j}]", "a finite squared norm (>= 0)", _finite_non_negative)
        if samples:
            parts.append((float(norm), samples))
    total = sum(samples for _, samples in parts)
    return estimate_from_totals(sum(norm * samples for norm, samples in parts), len(parts), total, mean_sq_norm)


def estimate_from_totals(weighted_sq_norms: float, parts: int, samples: int, mean_sq_norm: float) -> NoiseEstimate:
    """:func:`estimate` from sums that replicas can add up in one all-reduce: ``weighted_sq_norms``
    is ``Σ_j b_j |g_j|²`` over the ``parts`` non-empty parts holding ``samples = Σ_j b_j`` samples."""
    weighted_sq_norms = checked_float(weighted_sq_norms, "weighted_sq_norms", "a finite sum of squared norms (>= 0)",
                                      _finite_non_negative)
    mean_sq_norm = checked_float(mean_sq_norm, "mean_sq_norm", "a finite squared norm (>= 0)", _finite_non_negative)
    parts, samples = non_negative_int(parts, "parts"), non_negative_int(samples, "samples")
    if parts < 2:
        raise InvalidValue(
            f"estimating gradient noise needs at least two parts with samples, got {parts}: "
            "accumulate over two or more micro-batches, or train on two or more replicas"
        )
    if samples < parts:
        raise InvalidValue(f"{parts} non-empty parts need at least {parts} samples, got {samples}")
    trace = (weighted_sq_norms / samples - mean_sq_norm) * samples / (parts - 1)
    return NoiseEstimate(grad_sq=mean_sq_norm - trace / samples, trace=trace)


def update_estimates(weighted_sq_norms: Sequence[float], parts: int, samples: int,
                     mean_sq_norms: Sequence[float]) -> list[NoiseEstimate] | None:
    """:func:`estimate_from_totals` of one update for each of several groups of parameters (one
    group: the whole model), or None where the update cannot measure the noise: fewer than two
    parts (one part alone cannot tell noise from signal), or a norm that is not finite (an update
    AMP skips for inf/NaN gradients says nothing about the noise, in any group). The one place
    every adapter turns measured norms into estimates."""
    if len(weighted_sq_norms) != len(mean_sq_norms):
        raise InvalidValue(f"weighted_sq_norms has {len(weighted_sq_norms)} groups but mean_sq_norms has "
                           f"{len(mean_sq_norms)}: give one of each per group of parameters")
    if parts < 2 or not all(math.isfinite(norm) for norm in (*weighted_sq_norms, *mean_sq_norms)):
        return None
    return [estimate_from_totals(weighted, parts, samples, mean)
            for weighted, mean in zip(weighted_sq_norms, mean_sq_norms, strict=True)]

def gain(trace: float, grad_sq: float, batch: int, ref_batch_size: int) -> float:
    """AdaScale's gain of ``batch`` over ``ref_batch_size`` (the batch the LR was tuned for,
    AdaScale's base batch): how many reference-batch steps one step is worth, in
    ``[1, batch / ref_batch_size]`` for ``batch >= ref_batch_size``. Negative estimates (noise)
    count as zero: with no measured signal a step is worth ``batch / ref_batch_size`` of them."""
    batch, ref_batch_size = positive_int(batch, "batch"), positive_int(ref_batch_size, "ref_batch_size")
    return float(gains(trace, grad_sq, np.asarray(batch), ref_batch_size))


def gains(trace: float, grad_sq: float, batches: np.ndarray, ref_batch_size: int) -> np.ndarray:
    """:func:`gain` of many batches at once (positive ints, unchecked): a controller scores
    every candidate batch at each decision."""
    trace, grad_sq = max(trace, 0.0), max(grad_sq, 0.0)
    if trace == 0 and grad_sq == 0:
        return np.ones(np.shape(batches))
    return (trace / ref_batch_size + grad_sq) / (trace / batches + grad_sq)


def efficiency(trace: float, grad_sq: float, batch: int, ref_batch_size: int) -> float:
    """Pollux's statistical efficiency of ``batch``: progress per sample relative to
    ``ref_batch_size`` (1 there, falling towards ``ref_batch_size / batch`` as noise vanishes)."""
    return gain(trace, grad_sq, batch, ref_batch_size) * positive_int(ref_batch_size, "ref_batch_size") / batch


class NoiseTracker:
    """Smoothed ``|G|²`` and ``tr(Σ)`` over updates: a bias-corrected exponential average of
    each (Adam's correction, so the first updates are not pulled towards zero).

    ``decay`` is the weight of the past, e.g. 0.95 averages over about 20 updates.
    """

    def __init__(self, decay: float = 0.95) -> None:
        self.decay = checked_float(decay, "decay", "a number in [0, 1)", lambda number: 0 <= number < 1)
        self.updates = 0
        self._grad_sq = 0.0
        self._trace = 0.0

    def update(self, noise: NoiseEstimate) -> NoiseEstimate:
        """Fold in one update's estimate; returns the smoothed estimate."""
        self.updates += 1
        self._grad_sq = self.decay * self._grad_sq + (1 - self.decay) * noise.grad_sq
        self._trace = self.decay * self._trace + (1 - self.decay) * noise.trace
        return self.smoothed

    @property
    def smoothed(self) -> NoiseEstimate:
        if not self.updates:
            raise InvalidValue("no update folded in yet: call update() first")
        correction = 1 - self.decay**self.updates
        return NoiseEstimate(grad_sq=self._grad_sq / correction, trace=self._trace / correction)

    @property
    def measured(self) -> NoiseEstimate | None:
        """:attr:`smoothed`, or None before the first update (what a rule from the noise reads)."""
        return self.smoothed if self.updates else None

    def state_dict(self) -> dict:
        return {"decay": self.decay, "updates": self.updates, "grad_sq": self._grad_sq, "trace": self._trace}

    def load_state_dict(self, state: dict) -> None:
        if set(state) != {"decay", "updates", "grad_sq", "trace"}:
            raise InvalidValue(f"not a NoiseTracker state: keys {sorted(state)}")
        values = float(state["decay"]), int(state["updates"]), float(state["grad_sq"]), float(state["trace"])
        self.decay, self.updates, self._grad_sq, self._trace = values  # all converted before any is set
