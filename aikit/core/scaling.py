"""Learning-rate rules for a batch size that moves.

A rule maps a base LR tuned at ``ref_batch_size`` to the LR for a step of ``batch_size``
samples: ``linear`` (Goyal et al., 2017; for SGD), ``sqrt`` (Malladi et al., 2022; for Adam
and RMSprop) or ``constant``. Warmup follows Goyal et al.: over the first ``warmup_steps``
updates the scale factor rises linearly from 1 (the base LR) to its full value, so a run
that starts at a large batch does not start at a large LR.

An adaptive run (the batch picked while training, :mod:`aikit.core.goodput`) may also take
``adascale``: the base LR times AdaScale's gain of the batch over the base batch, from the
measured gradient noise (:func:`adaptive_lr`, for the PyTorch and Keras adapters alike).
"""

from __future__ import annotations

import math

from aikit.core.errors import InvalidValue
from aikit.core.gradient_noise import NoiseEstimate, gain
from aikit.core.validate import checked_float, non_negative_int, positive_int

RULES = ("linear", "sqrt", "constant")
ADAPTIVE_RULES = ("adascale", *RULES)
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
    return {"linear": ratio, "sqrt": math.sqrt(ratio), "constant": 1.0}[rule_name(rule)]


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
) -> float:
    """The LR for update ``step`` at ``batch_size``: the rule's factor, ramped in by warmup."""
    _check_lr(base_lr)
    factor = scale_factor(batch_size, ref_batch_size, rule)
    fraction = warmup_fraction(step, warmup_steps)
    if fraction == 1.0:  # exactly the rule's LR (1 + (f - 1) would round f in its last bit)
        return base_lr * factor
    return base_lr * (1.0 + (factor - 1.0) * fraction)


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
