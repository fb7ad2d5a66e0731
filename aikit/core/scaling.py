"""Learning-rate rules for a batch size that moves: the registry of rules and their arithmetic.

A rule maps a base LR tuned at ``ref_batch_size`` (the reference batch) to the LR of an update of
``batch`` samples (its global batch) by a factor: ``linear`` (Goyal et al., 2017; for SGD), ``sqrt`` (Malladi
et al., 2022; for Adam and RMSprop), ``constant``, ``seesaw`` (Meterez et al., 2025) or, where
the gradient noise is measured while training, ``adascale`` (Johnson et al., 2020). Rules are
values (:class:`Rule`) in one registry, :data:`RULES`: a rule added there is offered by every
adapter (each asks :class:`aikit.core.lr_policy.LRPolicy`) and named in every message that lists
the rules.

Warmup follows Goyal et al.: over the first ``warmup_steps`` updates the scale factor rises
linearly from 1 (the base LR) to its full value, so a run that starts at a large batch does not
start at a large LR.

An LR *decay* over the samples trained (:func:`cosine_decay`, :func:`step_decay`) multiplies the
base LR: a schedule clocked by samples, not steps, so runs whose batches differ decay alike at
equal samples. **Seesaw** is the ``sqrt`` factor over such a decay: where the decay halves the LR,
Seesaw's batch schedule (:func:`aikit.core.ramp.seesaw_schedule`) doubles the batch instead, and
the LR, ``base x decay x sqrt(B / B0)``, falls by ``1/sqrt(2)`` there; between the halvings a
cosine decay goes on decaying it.

**AdaScale** is the base LR times AdaScale's gain of the batch over the reference batch, from the
smoothed gradient noise (:func:`aikit.core.gradient_noise.gain`; the base LR before a first
estimate): a rule for an adaptive run (the batch picked while training, :mod:`aikit.core.goodput`),
which measures the noise, as Seesaw is one for a trace made from its decay.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aikit.core.errors import InvalidType, InvalidValue
from aikit.core.gradient_noise import NoiseEstimate, gain
from aikit.core.validate import checked_float, non_negative_int, positive_int


@dataclass(frozen=True, repr=False)
class Rule:
    """An LR rule: ``factor(batch, ref_batch_size, noise)`` is how many times the base LR the LR
    of an update of ``batch`` samples is (``noise``: the smoothed gradient noise, None before a
    first estimate; read by a measured rule only)."""

    name: str
    factor: Callable[[int, int | None, NoiseEstimate | None], float]
    aliases: tuple[str, ...] = ()
    needs_ref: bool = True  # False: the factor ignores the reference batch, which may be left out
    needs_decay: bool = False  # an LR decay over samples, from which its trace is made: not for an adaptive run
    measured: bool = False  # from the gradient noise measured while training: adaptive runs only, not warmed up

    def __repr__(self) -> str:
        return f"Rule({self.name!r})"


def _adascale(batch: int, ref_batch_size: int | None, noise: NoiseEstimate | None) -> float:
    if noise is None or batch == ref_batch_size:
        return 1.0
    return gain(noise.trace, noise.grad_sq, batch, ref_batch_size)


def _sqrt(batch: int, ref_batch_size: int | None, noise: NoiseEstimate | None) -> float:
    return math.sqrt(batch / ref_batch_size)


RULES: dict[str, Rule] = {rule.name: rule for rule in (
    Rule("adascale", _adascale, measured=True),
    Rule("linear", lambda batch, ref, noise: batch / ref),
    Rule("sqrt", _sqrt, aliases=("root", "square_root")),
    Rule("constant", lambda batch, ref, noise: 1.0, needs_ref=False),
    Rule("seesaw", _sqrt, needs_decay=True),
)}
"""The registry of LR rules, by name, in the order messages list them: a rule added here (e.g.
``Rule("cbrt", lambda batch, ref, noise: (batch / ref) ** (1 / 3))``) is offered by every adapter."""


def lr_rule(rule: str | Rule, *, adaptive: bool | None = False) -> Rule:
    """The rule named ``rule`` (or an alias of it; a :class:`Rule` as it is), where it is offered:
    a trace given in advance (``adaptive=False``: not a measured rule), an adaptive run (``True``:
    no rule that needs an LR decay), or either (``None``); else an error listing those rules."""
    def offered(found: Rule) -> bool:
        return adaptive is None or not (found.needs_decay if adaptive else found.measured)

    chosen = rule if isinstance(rule, Rule) else next(
        (found for found in RULES.values() if isinstance(rule, str) and rule in (found.name, *found.aliases)), None)
    if chosen is None or not offered(chosen):
        names = tuple(found.name for found in RULES.values() if offered(found))
        raise InvalidValue(f"LR rule must be one of {names}, got {rule!r}")
    return chosen


def rule_name(rule: str | Rule) -> str:
    """The canonical name of a rule for a trace, or a ValueError listing the rules."""
    return lr_rule(rule).name


def adaptive_rule_name(rule: str | Rule) -> str:
    """The canonical name of an adaptive run's rule, or a ValueError listing the rules."""
    return lr_rule(rule, adaptive=True).name


def scale_factor(batch: int, ref_batch_size: int, rule: str | Rule = "linear") -> float:
    """How much larger the LR for a global ``batch`` is than the LR tuned at ``ref_batch_size``."""
    batch, ref = positive_int(batch, "batch"), positive_int(ref_batch_size, "ref_batch_size")
    return lr_rule(rule).factor(batch, ref, None)


def warmup_fraction(step: int, warmup_steps: int) -> float:
    """Progress through warmup after ``step`` updates (1.0 once warmup is over, or without it)."""
    step, warmup_steps = non_negative_int(step, "step"), non_negative_int(warmup_steps, "warmup_steps")
    return 1.0 if warmup_steps == 0 else min(1.0, (step + 1) / warmup_steps)


def rule_lr(base_lr: float, batch: int, ref_batch_size: int | None, rule: Rule, step: int = 0,
            warmup_steps: int = 0, decay: float = 1.0, noise: NoiseEstimate | None = None) -> float:
    """The LR of update ``step`` at the global ``batch``, the one formula every LR of an update comes
    from: ``base_lr`` times ``decay`` (an LR decay's value at the samples trained before the
    update) times ``rule``'s factor, ramped in from 1 over ``warmup_steps`` updates (a measured
    rule's gain is not: it starts at 1 and follows the ``noise``)."""
    _check_lr(base_lr)
    checked_float(decay, "decay", "a multiplier in [0, 1]", lambda value: 0 <= value <= 1)
    batch = positive_int(batch, "batch")
    ref = None if ref_batch_size is None and not rule.needs_ref else positive_int(ref_batch_size, "ref_batch_size")
    factor = rule.factor(batch, ref, noise)
    fraction = 1.0 if rule.measured else warmup_fraction(step, warmup_steps)
    base = base_lr if decay == 1 else base_lr * decay
    if fraction == 1.0:  # exactly the rule's LR (1 + (f - 1) would round f in its last bit)
        return base * factor
    return base * (1.0 + (factor - 1.0) * fraction)


def scaled_lr(base_lr: float, batch: int, ref_batch_size: int, rule: str | Rule = "linear", step: int = 0,
              warmup_steps: int = 0, decay: float = 1.0) -> float:
    """The LR for update ``step`` at the global ``batch`` of a trace's rule: :func:`rule_lr`."""
    return rule_lr(base_lr, batch, ref_batch_size, lr_rule(rule), step, warmup_steps, decay)


def adaptive_lr(base_lr: float, batch: int, ref_batch_size: int, rule: str | Rule, noise: NoiseEstimate | None,
                step: int = 0, warmup_steps: int = 0) -> float:
    """The LR of an adaptive run's update at the global ``batch``: with ``adascale``, ``base_lr`` times
    AdaScale's gain over ``ref_batch_size`` from the smoothed ``noise`` (``base_lr`` itself at
    ``ref_batch_size`` or before a first estimate); otherwise :func:`scaled_lr` of the rule (with
    its warmup)."""
    return rule_lr(base_lr, batch, ref_batch_size, lr_rule(rule, adaptive=True), step, warmup_steps,
                   noise=noise)


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
