"""Learning-rate rules for a batch size that moves.

A rule maps a base LR tuned at ``ref_batch_size`` to the LR for a step of ``batch_size``
samples: ``linear`` (Goyal et al., 2017; for SGD), ``sqrt`` (Malladi et al., 2022; for Adam
and RMSprop), ``constant``, or ``seesaw`` (Meterez et al., 2025). Warmup follows Goyal et al.:
over the first ``warmup_steps`` updates the scale factor rises linearly from 1 (the base LR) to
its full value, so a run that starts at a large batch does not start at a large LR.

An LR *decay* over the samples trained (:func:`cosine_decay`, :func:`step_decay`) multiplies the
base LR: a schedule clocked by samples, not steps, so runs whose batches differ decay alike at
equal samples. **Seesaw** is the ``sqrt`` factor over such a decay: where the decay halves the LR,
Seesaw's batch schedule (:func:`aikit.core.ramp.seesaw_schedule`) doubles the batch instead, and
the LR, ``base x decay x sqrt(B / B0)``, falls by ``1/sqrt(2)`` there; between the halvings a
cosine decay goes on decaying it.

An adaptive run (the batch picked while training, :mod:`aikit.core.goodput`) may also take
``adascale``: the base LR times AdaScale's gain of the batch over the base batch, from the
measured gradient noise (:func:`adaptive_lr`, for the PyTorch and Keras adapters alike).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from aikit.core.errors import InvalidType, InvalidValue
from aikit.core.gradient_noise import NoiseEstimate, gain
from aikit.core.validate import checked_float, non_negative_int, positive_int

RULES = ("linear", "sqrt", "constant", "seesaw")
ADAPTIVE_RULES = ("adascale", "linear", "sqrt", "constant")  # seesaw's batches come from its LR decay, not noise
ALIASES = {"root": "sqrt", "square_root": "sqrt"}


def rule_name(rule: str) -> str:
    """The canonical name of a rule, or a ValueError listing the rules."""
    name = ALIASES.get(rule, rule)
    if name not in RULES:
        raise InvalidValue(f"LR rule must be one of {RULES}, got {rule!r}")
    return name


def scale_factor(batch_size: int, ref_batch_size: int, rule: str = "linear") -> float:
    """How much larger the LR for ``batch_size`` is than the LR tuned at ``ref_batch_size``."""
    ratio = positive_int(batch_size, "batch_size") / positive_int(ref_batch_size, "ref_batch_size")
    return {"linear": ratio, "sqrt": math.sqrt(ratio), "seesaw": math.sqrt(ratio), "constant": 1.0}[rule_name(rule)]


def warmup_fraction(step: int, warmup_steps: int) -> float:
    """Progress through warmup after ``step`` updates (1.0 once warmup is over, or without it)."""
    step, warmup_steps = non_negative_int(step, "step"), non_negative_int(warmup_steps, "warmup_steps")
    return 1.0 if warmup_steps == 0 else min(1.0, (step + 1) / warmup_steps)


def scaled_lr(
    base_lr: float,
    batch_size: int,
    ref_batch_size: int,
    rule: str = "linear",
    step: int = 0,
    warmup_steps: int = 0,
    decay: float = 1.0,
) -> float:
    """The LR for update ``step`` at ``batch_size``: the rule's factor, ramped in by warmup, of
    ``base_lr`` times ``decay`` (an LR decay's value at the samples trained before the update)."""
    _check_lr(base_lr)
    checked_float(decay, "decay", "a multiplier in [0, 1]", lambda value: 0 <= value <= 1)
    factor = scale_factor(batch_size, ref_batch_size, rule)
    fraction = warmup_fraction(step, warmup_steps)
    base = base_lr if decay == 1 else base_lr * decay
    if fraction == 1.0:  # exactly the rule's LR (1 + (f - 1) would round f in its last bit)
        return base * factor
    return base * (1.0 + (factor - 1.0) * fraction)


def adaptive_rule_name(rule: str) -> str:
    """The canonical name of an adaptive run's rule: ``adascale`` or one of :data:`RULES`."""
    if rule == "adascale":
        return rule
    try:
        return rule_name(rule)
    except ValueError:
        raise InvalidValue(f"LR rule must be one of {ADAPTIVE_RULES}, got {rule!r}") from None


def adaptive_lr(
    base_lr: float,
    batch_size: int,
    ref_batch_size: int,
    rule: str,
    noise: NoiseEstimate | None,
    step: int = 0,
    warmup_steps: int = 0,
) -> float:
    """The LR of an adaptive run's update at ``batch_size``: with ``adascale``, ``base_lr`` times
    AdaScale's gain over ``ref_batch_size`` from the smoothed ``noise`` (``base_lr`` itself at
    ``ref_batch_size`` or before a first estimate); otherwise :func:`scaled_lr` of the rule (with
    its warmup)."""
    if adaptive_rule_name(rule) != "adascale":
        return scaled_lr(base_lr, batch_size, ref_batch_size, rule, step, warmup_steps)
    _check_lr(base_lr)
    if noise is None or batch_size == ref_batch_size:
        return base_lr
    return base_lr * gain(noise.trace, noise.grad_sq, batch_size, ref_batch_size)


def _check_lr(base_lr: float) -> None:
    checked_float(base_lr, "base_lr", "a finite number >= 0", lambda lr: 0 <= lr < math.inf)


@dataclass(frozen=True)
class CosineDecay:
    """The base LR's multiplier ``final + (1 - final) (1 + cos(pi s / total)) / 2`` after ``s``
    samples (``final`` from ``total`` on): cosine annealing (Loshchilov and Hutter) over samples."""

    total: int
    final: float = 0.0

    def __call__(self, samples: int) -> float:
        progress = min(non_negative_int(samples, "samples"), self.total) / self.total
        return self.final + (1.0 - self.final) * (1.0 + math.cos(math.pi * progress)) / 2.0

    def first_at_or_below(self, level: float) -> int | None:
        """The first sample count at which the multiplier is ``level`` or less (None if never)."""
        if level >= 1.0:
            return 0
        if level < self.final:
            return None
        inner = min(1.0, max(-1.0, 2.0 * (level - self.final) / (1.0 - self.final) - 1.0))
        samples = max(0, math.floor(self.total * math.acos(inner) / math.pi) - 1)
        while samples <= self.total and self(samples) > level * (1 + _SLACK):
            samples += 1
        return samples if samples <= self.total else None


@dataclass(frozen=True)
class StepDecay:
    """The base LR's multiplier ``gamma ** k`` after the ``k``-th of ``milestones`` (samples):
    step decay (torch's ``MultiStepLR``) over samples."""

    milestones: tuple[int, ...]
    gamma: float = 0.5

    def __call__(self, samples: int) -> float:
        samples = non_negative_int(samples, "samples")
        return self.gamma ** sum(samples >= milestone for milestone in self.milestones)

    def first_at_or_below(self, level: float) -> int | None:
        """The first sample count at which the multiplier is ``level`` or less (None if never)."""
        if level >= 1.0:
            return 0
        for count, milestone in enumerate(self.milestones, start=1):
            if self.gamma**count <= level * (1 + _SLACK):
                return milestone
        return None


_SLACK = 1e-12  # a multiplier within this (relative) of a level is at it: 0.5 ** k computed two ways


def cosine_decay(total_samples: int, final: float = 0.0) -> CosineDecay:
    """Cosine annealing of the base LR over ``total_samples`` samples, to ``final`` times it."""
    total = positive_int(total_samples, "total_samples")
    final = checked_float(final, "final", "a multiplier in [0, 1)", lambda value: 0 <= value < 1)
    return CosineDecay(total, final)


def step_decay(milestones: Sequence[int], gamma: float = 0.5) -> StepDecay:
    """The base LR times ``gamma`` at each of ``milestones`` (samples, increasing)."""
    if isinstance(milestones, (str, bytes)) or not isinstance(milestones, Sequence) or not milestones:
        raise InvalidType(f"milestones must be a list of sample counts, got {milestones!r:.60}")
    points = tuple(positive_int(m, f"milestones[{i}]") for i, m in enumerate(milestones))
    if any(b <= a for a, b in itertools.pairwise(points)):
        raise InvalidValue(f"milestones must increase, got {list(points)}: list them in the order training "
                           "reaches them")
    gamma = checked_float(gamma, "gamma", "a factor in (0, 1)", lambda value: 0 < value < 1)
    return StepDecay(points, gamma)
