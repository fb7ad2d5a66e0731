"""An AutoLRS run's stages: their lengths, with a budget or without, and the records the
controller keeps of every stage, trial and step (plain data: what ``state_dict`` saves)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field


def stage_length(index: int, tau: int, tau_max: int, growth: int = 2) -> int:
    """Stage ``index``'s length without a budget: ``tau * growth**index`` capped at ``tau_max``."""
    return min(tau * growth ** min(index, 64), tau_max)


def plan_stages(steps: int, tau: int, tau_max: int, growth: int,
                stage_cost: Callable[[int, int], int]) -> tuple[list[int], int]:
    """Stage lengths whose ``stage_cost`` fits in ``steps``: ``tau``, ``growth*tau``, ...
    (capped at ``tau_max``) while the next one fits; and the steps left over, which the last
    stage trains on (its trials stay those of its planned length). Empty if none fits."""
    lengths, used = [], 0
    while used + stage_cost(len(lengths), stage_length(len(lengths), tau, tau_max, growth)) <= steps:
        lengths.append(stage_length(len(lengths), tau, tau_max, growth))
        used += stage_cost(len(lengths) - 1, lengths[-1])
    return lengths, steps - used


@dataclass
class Trial:
    lr: float
    start_step: int = 0  # steps taken before its first step
    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    score: float = math.nan
    failed: str = ""  # why the trial cannot win ("" if it can)
    missed: int = 0  # evaluations val_fn failed to give (skipped)


@dataclass
class Stage:
    index: int
    start_step: int
    tau: int
    trial_steps: int
    val_every: int | None  # None: trials are scored on training losses
    trials: list[Trial] = field(default_factory=list)
    lr: float | None = None  # the chosen LR, once the search is over
    kept: int | None = None  # the index of the trial whose progress the stage keeps


@dataclass(frozen=True)
class Record:
    step: int
    lr: float
    loss: float
    phase: str  # "warmup", "range", "trial", "train", "anneal" or "done"
