"""One critical-batch probe (Merrill et al. 2025, measured while training): :class:`CriticalBatchProbe`.

From the run's current state (the adapter's :class:`Branches`) the probe trains the same window of
samples once at the run's batch ``B`` and LR (the base branch), and once at each ``k·B``
(``k = 2, 4, 8, ...`` within the bounds the world can split) for each LR rule (``sqrt``: ``√k``,
Adam's; ``linear``: ``k``, Goyal et al.'s for SGD), rolling the state back before each branch and
after the last. A branch *recovers* where its held-out loss made at least ``1 - epsilon`` of the
base branch's progress over the window; the largest ``k`` that recovers (every smaller one
recovering too) is the estimate, and the rule that recovered best there is the LR to grow with.
Larger ``k`` are not tried once one fails with every rule.

The held-out losses are compared per sample (the same samples for every branch), so the base
branch's progress is known with its standard error: where ``epsilon`` of it is within ``z``
standard errors the probe cannot tell a recovery from a failure, and says so
(:class:`~aikit.core.errors.ProbeUnresolved`) rather than guess.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from aikit.core.errors import InvalidState, InvalidValue, ProbeUnresolved
from aikit.core.validate import checked_float, positive_int

RULE_FACTORS: dict[str, Callable[[int], float]] = {"sqrt": math.sqrt, "linear": float}
"""The LR factor each rule gives a ``k``-times larger batch."""


class Branches(Protocol):
    """What an adapter supplies for a probe: its framework's training, over the run's own state."""

    dataset_size: int  # the training samples a window is drawn from

    def snapshot(self) -> object | None:
        """The whole training state (weights, optimizer, RNG, gradients), or None where it cannot be taken."""

    def restore(self, snapshot: object) -> None:
        """Put the state :meth:`snapshot` took back, exactly."""

    def train(self, indices: np.ndarray, batch: int, lr_factor: float) -> None:
        """Train the samples ``indices`` in order, ``len(indices) // batch`` updates of ``batch``,
        at the run's LR times ``lr_factor``."""

    def evaluate(self) -> np.ndarray:
        """The held-out loss of every held-out sample (the same samples, in the same order, each call)."""


@dataclass(frozen=True)
class ProbeResult:
    """What one probe measured and what it cost."""

    batch: int  # the run's batch B, the base branch's
    window: int  # samples every branch trained
    factor: int  # the estimate's k: the critical batch is factor * batch (1: no larger batch recovered)
    rule: str | None  # the LR rule that recovered best at factor (None at 1)
    start_loss: float  # held-out loss before the window
    base_loss: float  # after the base branch
    losses: dict[tuple[int, str], float] = field(default_factory=dict)  # (k, rule): held-out loss after the window
    samples: int = 0  # samples the branches trained, all of them
    seconds: float = 0.0  # CPU seconds the probe took

    @property
    def critical_batch(self) -> int:
        return self.factor * self.batch

    def efficiency(self, factor: int, rule: str) -> float:
        """The branch's progress over the window as a fraction of the base branch's (1: as good)."""
        return (self.start_loss - self.losses[factor, rule]) / (self.start_loss - self.base_loss)


class CriticalBatchProbe:
    """Measures the critical batch from the run's state by branching (see the module).

    Args:
        window: samples every branch trains (a multiple of every ``k·B`` tried; see :meth:`window_for`).
        epsilon: a branch recovers with at least ``1 - epsilon`` of the base branch's progress.
        rules: the LR rules to try at each ``k`` (``"sqrt"``, ``"linear"``).
        max_factor: the largest ``k`` tried.
        z: standard errors the base branch's progress times ``epsilon`` must clear.
        clock: CPU seconds (``time.thread_time``: the training thread's, as the benchmarks count).
    """

    def __init__(self, window: int, *, epsilon: float = 0.2, rules: Sequence[str] = ("sqrt",), max_factor: int = 8,
                 z: float = 2.0, clock: Callable[[], float] = time.thread_time) -> None:
        self.window = positive_int(window, "window")
        self.epsilon = checked_float(epsilon, "epsilon", "a fraction in (0, 1) of the base branch's progress",
                                     lambda e: 0 < e < 1)
        self.rules = checked_rules(rules)
        self.max_factor = positive_int(max_factor, "max_factor")
        self.z = checked_float(z, "z", "a non-negative number of standard errors", lambda v: 0 <= v < math.inf)
        self.clock = clock

    def factors(self, batch: int, max_batch: int, runs: Callable[[int], bool]) -> list[int]:
        """``k = 2, 4, ...`` up to ``max_factor`` whose ``k·batch`` is within ``max_batch``, splits
        over the world (``runs``) and divides the window."""
        found, k = [], 2
        while k <= self.max_factor and k * batch <= max_batch and runs(k * batch) and self.window % (k * batch) == 0:
            found.append(k)
            k *= 2
        return found

    def run(self, branches: Branches, batch: int, *, max_batch: int, dataset_size: int,
            runs: Callable[[int], bool] = lambda b: True, samples_left: int | None = None, seed: int = 0,
            rules: Sequence[str] | None = None, factors: Sequence[int] | None = None) -> ProbeResult:
        """Probe from ``branches``' current state at the run's ``batch``; the state is as it was after.

        ``runs``: whether the world can split a global batch (the run's ``BatchSplit``);
        ``samples_left``: what is left of the run (None: unknown); ``seed``: draws the window's
        samples from the ``dataset_size`` (the same on every replica); ``rules``, ``factors``:
        instead of this probe's.
        """
        batch, max_batch = positive_int(batch, "batch"), positive_int(max_batch, "max_batch")
        rules = self.rules if rules is None else checked_rules(rules)
        factors = self.factors(batch, max_batch, runs) if factors is None else self._checked(factors, batch, runs)
        if not factors:
            raise InvalidValue(f"no batch above {batch} to probe: 2 x {batch} is above max_batch={max_batch}, does not "
                               f"split over the world or does not divide the window of {self.window} samples; give a "
                               "window that is a multiple of the batches to try, or a larger max_batch")
        if samples_left is not None and self.window > samples_left:
            raise InvalidValue(f"the probe's window of {self.window} samples is longer than what is left of the run "
                               f"({samples_left}): probe earlier, or with a shorter window")
        if self.window > dataset_size:
            raise InvalidValue(f"the probe's window of {self.window} samples is larger than the data set "
                               f"({dataset_size}): give a shorter window")
        indices = np.random.default_rng(seed).permutation(dataset_size)[:self.window]
        snapshot = branches.snapshot()
        if snapshot is None:
            raise InvalidState("this run cannot be snapshot, so a probe's branches could not be rolled back: probe a "
                               "run whose adapter can save and restore its whole state (not a sharded optimizer)")
        start, spent, losses = self.clock(), 0, {}
        try:
            before = _losses(branches)
            branches.train(indices, batch, 1.0)
            spent += self.window
            base = _losses(branches)
            self._check_resolution(before, base, spent, self.clock() - start)
            found, best_rule = 1, None
            for k in factors:
                recovered = {}
                for rule in rules:
                    branches.restore(snapshot)
                    branches.train(indices, k * batch, RULE_FACTORS[rule](k))
                    spent += self.window
                    losses[k, rule] = float(_losses(branches).mean())
                    progress, needed = before.mean() - losses[k, rule], (1 - self.epsilon) * (before - base).mean()
                    if progress >= needed:
                        recovered[rule] = losses[k, rule]
                if not recovered:
                    break
                found, best_rule = k, min(recovered, key=recovered.get)
        finally:
            branches.restore(snapshot)
        return ProbeResult(batch, self.window, found, best_rule, float(before.mean()), float(base.mean()), losses,
                           spent, self.clock() - start)

    def _checked(self, factors: Sequence[int], batch: int, runs: Callable[[int], bool]) -> list[int]:
        checked = sorted({positive_int(k, "factors[i]") for k in factors})
        for k in checked:
            if k < 2 or not runs(k * batch) or self.window % (k * batch):
                why = "is not above 1" if k < 2 else "does not divide the window" if runs(k * batch) else \
                    "does not split over the world's replicas in whole micro-batches"
                raise InvalidValue(f"the probe cannot try k={k} at batch {batch}: {k * batch} {why} (window "
                                   f"{self.window}); give factors whose k x batch the run can deal")
        return checked

    def _check_resolution(self, before: np.ndarray, base: np.ndarray, samples: int, seconds: float) -> None:
        """Refuse where ``epsilon`` of the base branch's progress is within ``z`` standard errors."""
        gained = before - base
        progress = float(gained.mean())
        error = float(gained.std(ddof=1) / math.sqrt(len(gained))) if len(gained) > 1 else math.inf
        if not progress > 0 or self.epsilon * progress < self.z * error:
            problem = ProbeUnresolved(
                f"the held-out set of {len(gained)} samples cannot tell epsilon={self.epsilon} of the base branch's "
                f"progress apart: it gained {progress:.3g} in held-out loss over {self.window} samples, standard error "
                f"{error:.3g} (needed: epsilon x progress >= {self.z} standard errors); give a larger held-out set, a "
                "longer window or a larger epsilon")
            problem.samples, problem.seconds = samples, seconds
            raise problem


def checked_rules(rules: Sequence[str]) -> tuple[str, ...]:
    """``rules`` as a tuple, each one of :data:`RULE_FACTORS`."""
    rules = (rules,) if isinstance(rules, str) else tuple(rules)
    unknown = [rule for rule in rules if rule not in RULE_FACTORS]
    if not rules or unknown:
        raise InvalidValue(f"the probe's LR rules must be some of {sorted(RULE_FACTORS)}, got {list(rules)!r}")
    return rules


def _losses(branches: Branches) -> np.ndarray:
    losses = np.asarray(branches.evaluate(), dtype=np.float64).ravel()
    if len(losses) == 1:  # a mean: the spread that tells a recovery from noise is gone (with z=0 it would pass)
        raise InvalidValue(f"the probe's held-out losses must be one per held-out sample (their spread gives the "
                           f"standard error), got one number ({losses[0]:.4g}): return the unreduced losses, e.g. "
                           "F.cross_entropy(..., reduction='none'), not their mean")
    if not len(losses) or not np.isfinite(losses).all():
        raise InvalidValue(f"the probe's held-out losses must be finite numbers, one per held-out sample, got "
                           f"{len(losses)} of them{'' if not len(losses) else ', not all finite'}")
    return losses
