"""The LR of an update, one policy for every adapter.

An :class:`LRPolicy` holds an LR rule (a value of :data:`aikit.core.scaling.RULES`), the global
batch the LR was tuned for, a warmup and an LR decay clocked in samples, checked once when it is
made; :meth:`LRPolicy.lr` answers the LR of an update from the base LR, the update's global batch,
the updates before it, the samples trained before it and, for a rule from the measured gradient
noise (``adascale``), that noise. The torch trace optimizers and ``AdaptiveOptimizer``, Keras'
``fit_trace`` and ``fit_adaptive``, and the Lightning callback all ask one, so the arithmetic
(:func:`aikit.core.scaling.rule_lr`) and its checks are written once, and a rule added to the
registry is offered by all of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import InitVar, dataclass

from aikit.core.errors import InvalidType, InvalidValue
from aikit.core.gradient_noise import NoiseEstimate
from aikit.core.scaling import Rule, lr_rule, rule_lr
from aikit.core.validate import non_negative_int, positive_int

__all__ = ["LRPolicy"]


@dataclass(frozen=True)
class LRPolicy:
    """How the LR of every update follows its global batch.

    ``rule``: a name (or alias) of :data:`~aikit.core.scaling.RULES` or a
    :class:`~aikit.core.scaling.Rule`; ``ref_batch_size``: the global batch the base LR was tuned
    for (not needed by ``constant``); ``warmup_steps``: updates over which the rule's factor ramps
    in from 1; ``lr_decay``: a function of the samples trained (e.g.
    :func:`aikit.core.scaling.cosine_decay`) multiplying the base LR (``seesaw`` needs one).
    ``adaptive`` says where the policy serves: a trace given in advance (False), an adaptive run
    (True: the batch decided while training, the noise measured) or either (None). ``user`` and
    ``ref_name`` are how refusals name the caller and the reference batch (the name written).
    """

    rule: Rule
    ref_batch_size: int | None = None
    warmup_steps: int = 0
    lr_decay: Callable[[int], float] | None = None
    adaptive: InitVar[bool | None] = False
    user: InitVar[str] = "this LR policy"
    ref_name: InitVar[str] = "ref_batch_size"

    def __post_init__(self, adaptive: bool | None, user: str, ref_name: str) -> None:
        rule = lr_rule(self.rule, adaptive=adaptive)
        ref = self.ref_batch_size
        if ref is None and rule.needs_ref:
            raise InvalidValue(f"{user} needs {ref_name}, the global batch its LR was tuned for")
        if self.lr_decay is not None and not callable(self.lr_decay):
            raise InvalidType(f"lr_decay must be a function of the samples trained (aikit.core.scaling.cosine_decay "
                              f"or step_decay), got {self.lr_decay!r:.60} for {user}")
        if self.lr_decay is None and rule.needs_decay:
            raise InvalidValue(f"{user} needs lr_decay, the LR decay over samples its trace was made from "
                               f"(aikit.core.ramp.seesaw_schedule's decay): rule {rule.name!r} multiplies the base LR "
                               "by it")
        object.__setattr__(self, "rule", rule)
        object.__setattr__(self, "ref_batch_size", None if ref is None else positive_int(ref, ref_name))
        object.__setattr__(self, "warmup_steps", non_negative_int(self.warmup_steps, "warmup_steps"))

    @property
    def decays(self) -> bool:
        """Whether an LR decay reads the samples trained."""
        return self.lr_decay is not None

    def decay(self, samples: int) -> float:
        """The LR decay's multiplier after ``samples`` samples (1 without a decay)."""
        return 1.0 if self.lr_decay is None else float(self.lr_decay(samples))

    def lr(self, base_lr: float, batch: int, updates: int = 0, samples: int = 0,
           noise: NoiseEstimate | None = None) -> float:
        """The LR of an update of ``batch`` samples (the global batch) from ``base_lr``, the LR
        tuned at the reference batch: after ``updates`` updates (warmup), ``samples`` samples
        trained (the decay; read only with one) and, for a measured rule, the smoothed gradient
        ``noise`` (None before a first estimate)."""
        return rule_lr(base_lr, batch, self.ref_batch_size, self.rule, updates, self.warmup_steps,
                       self.decay(samples), noise)
