"""An AutoLRS run's stages: their lengths and their trials', with a budget or without, and the
records the controller keeps of every stage, trial and step (plain data: what ``state_dict``
saves)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from aikit.core.autolrs.settings import Settings
from aikit.core.errors import InvalidValue

log = logging.getLogger("aikit.autolrs")


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


def exploits(index: int, settings: Settings, ranged: bool) -> bool:
    """With ``exploit``, stage 0 after a range test (``ranged``) trains at ``max_lr`` without
    trials: the range test was its search, and trials that start from an untrained net barely
    move it."""
    return index == 0 and settings.exploit and ranged


def trial_length(tau: int, settings: Settings) -> tuple[int, int | None]:
    """The steps of each trial of a stage of ``tau`` steps, and every how many of them a trial
    is validated (None: it is scored on its training losses)."""
    trial_steps = max(3, tau // settings.trial_ratio)
    if tau < (settings.val_tau or settings.tau_max or math.inf):
        return trial_steps, None
    val_every = max(1, trial_steps // settings.val_points)
    return val_every * min(settings.val_points, trial_steps), val_every


def stage_cost(index: int, tau: int, settings: Settings, ranged: bool) -> int:
    """The steps stage ``index`` of ``tau`` steps takes, its trials included."""
    if exploits(index, settings, ranged):
        return tau
    trial_steps = trial_length(tau, settings)[0]
    return settings.trials * trial_steps + tau - (trial_steps if settings.keep_winner else 0)


def budget_plan(steps: int, tau: int | None, settings: Settings, ranged: bool) -> tuple[int, list[list]]:
    """With a budget: ``tau`` (as given, else the length that fits ``settings.stages`` stages of
    tau, 2 tau, 4 tau... in ``steps``), and ``[tau, trial steps, val_every]`` of every stage that
    fits in the ``steps`` the budget leaves for the search (after warmup and range test, before
    the anneal), the last one training on for the steps left over; refused if none fits."""
    def cost(index: int, length: int) -> int:
        return stage_cost(index, length, settings, ranged)

    if tau is None:  # cost ~ (1 + 2 + 4) tau * per-step cost
        per_tau = sum(cost(i, 10**6 * settings.growth**i) for i in range(settings.stages)) / 10**6
        tau = max(3 * settings.trial_ratio, int(steps / per_tau))
    lengths, left = plan_stages(steps, tau, settings.tau_max or 10**12, settings.growth, cost)
    if not lengths:
        raise InvalidValue(f"total_steps={settings.total_steps} leaves {steps} steps for the search after warmup, "
                           f"range test and anneal, less than one stage of tau={tau} "
                           f"({cost(0, tau)} steps): raise total_steps or lower tau or trials")
    plan = [[length, *trial_length(length, settings)] for length in lengths]
    plan[-1][0] += left  # the last stage trains on for what is left
    log.info("AutoLRS plan for %d steps: stages of %s steps, then %d annealing steps",
             settings.total_steps, [length for length, _, _ in plan], settings.anneal_steps)
    return tau, plan


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
