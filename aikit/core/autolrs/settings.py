"""AutoLRS's options, checked and with their defaults resolved in one place: the
:class:`Settings` a :class:`~aikit.core.autolrs.Controller` is built from."""

from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass, field, fields

from aikit.core.autolrs.search import DESIGN
from aikit.core.errors import InvalidValue
from aikit.core.validate import checked_float, checked_int, positive_float, positive_int

RANGE_STEPS = 100  # the range test's steps without a budget
RAMP = 0.05  # with a budget, stage 0 ramps up to max_lr over this fraction of it
ANNEAL = 0.4  # with a budget, the LR decays to zero over this last fraction of it


@dataclass(frozen=True)
class Settings:
    """The options of an AutoLRS run (both adapters take them as keywords).

    ``min_lr``, ``max_lr``: the log-scale search range; when either is None a short LR range
    test (``range_steps`` steps climbing from 1e-6 to 10, then undone; default 100, with a
    budget a tenth of it, 20 to 100) sets both: ``max_lr`` a third of the LR where its smoothed
    loss bottoms out (:func:`~aikit.core.lr_range.suggest`'s ``"bottom"``), read a step or two of
    the test earlier under the optimizer's heavy-ball momentum
    (:func:`~aikit.core.autolrs.range_test.momentum_lag`), ``min_lr`` three decades below.

    ``total_steps``: the run's whole budget, search included. With it the stages are planned
    to fill the budget exactly, the last ``anneal`` fraction (default 0.4) decays the LR to zero
    on a cosine, and ``tau`` defaults to a length that gives ``stages`` doubling stages
    (default 1: range test, ramp, hold, anneal; a searched stage did not pay at budgets of
    300 and 900 steps, ``benchmarks/lr_free.py``). Without it stages go on forever (the
    paper's AutoLRS). ``ramp_steps``: stage 0 after a range test ramps linearly up to
    ``max_lr`` over this many steps (default with a budget 5 % of it, else 0); a stage 0 that
    has not left its first loss ``2 * DIVERGE_WINDOW`` steps after its ramp (a net the LR
    killed) is rolled back once, like a divergence.

    ``tau``, ``tau_max``, ``growth``: stage lengths (paper: 1000 doubling to 8000).
    ``trials`` LRs per stage, each trained ``tau // trial_ratio`` steps (paper: 10 and 10;
    with ``total_steps``: 3 and 5). With ``exploit`` (default) and a range test, stage 0 trains
    at ``max_lr`` without trials (the range test was its search; a stage that diverges there is
    rolled back lower like any other). ``design``: the first trials spread over the range;
    ``tie``: take the largest LR forecast within ``tie`` standard errors of the best.
    With ``keep_winner`` the stage continues from the best trial's end state (its steps are
    the stage's first steps) instead of retraining from the stage start.
    Stages of ``val_tau`` steps or more (default ``tau_max``) score trials on ``val_points``
    validation losses per trial instead of training losses.
    ``warmup_steps`` at ``warmup_lr`` come first, as in the original AutoLRS: step 0 at the
    optimizer's own LR, step k (1..n) at ``warmup_lr * k / n``.
    ``kappa`` weighs exploration in the search, ``seed`` makes it repeatable. With
    ``warm_start`` each stage's first trial is the previous stage's LR. ``diverge``: a trial
    or stage whose mean loss over 5 steps exceeds ``diverge`` times the loss at its checkpoint
    (and the run's first loss), or turns NaN/inf, has diverged: a trial fails, a stage is
    rolled back and retried at a third of its LR.

    Built, the fields hold the checked values with the budget's defaults filled in (``trials``
    is 3 or 10, never None); ``given`` keeps the options as they were passed, which a saved
    search is compared with.
    """

    min_lr: float | None = None
    max_lr: float | None = None
    _: KW_ONLY
    total_steps: int | None = None
    tau: int | None = None
    tau_max: int | None = None
    growth: int = 2
    stages: int = 1
    trials: int | None = None
    trial_ratio: int | None = None
    keep_winner: bool = True
    anneal: float | None = None
    val_tau: int | None = None
    val_points: int = 16
    warmup_steps: int = 0
    warmup_lr: float = 0.0
    range_steps: int | None = None
    ramp_steps: int | None = None
    design: int = 3
    tie: float = 0.0
    kappa: float = 2.0
    warm_start: bool = True
    diverge: float = 5.0
    exploit: bool = True
    seed: int | None = 0
    given: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._resolve(given={f.name: getattr(self, f.name) for f in fields(self) if f.init})
        self._check_range()
        self._check_stages()
        self._check_scoring()
        self._check_warmup_and_range_test()
        self._check_search()

    def resolved(self) -> dict:
        """Every option as the run uses it, defaults filled in: what a resumed run must match."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.init}

    def check_saved(self, options: dict) -> None:
        """Refuse the ``options`` a saved state recorded where they resolve to other settings
        than these, naming each (a default that changed between releases is a difference too)."""
        then, now = settings_of_state(options).resolved(), self.resolved()
        differ = {k: (then[k], v) for k, v in now.items() if then[k] != v}
        if differ:
            raise InvalidValue("the AutoLRS state was saved with other options: "
                               + "; ".join(f"{k} {a!r} saved, {b!r} here" for k, (a, b) in differ.items())
                               + "; build the AutoLRS with the options it was saved with ("
                               + ", ".join(f"{k}={a!r}" for k, (a, _) in differ.items()) + ")")

    @property
    def budget(self) -> bool:
        """Whether the run has a step budget (``total_steps``), which sets other defaults."""
        return self.total_steps is not None

    @property
    def anneal_steps(self) -> int:
        """The budget's last steps, in which the LR decays to zero."""
        return 0 if self.total_steps is None else round(self.anneal * self.total_steps)

    def _resolve(self, **values) -> None:
        for name, value in values.items():
            object.__setattr__(self, name, value)  # a frozen dataclass: set once, here

    def _check_range(self) -> None:
        min_lr, max_lr = self.given["min_lr"], self.given["max_lr"]
        if (min_lr is None) != (max_lr is None):
            raise InvalidValue(f"give both min_lr and max_lr or neither (for a range test), got min_lr={min_lr!r} "
                               f"and max_lr={max_lr!r}")
        self._resolve(min_lr=None if min_lr is None else positive_float(min_lr, "min_lr"),
                      max_lr=None if max_lr is None else positive_float(max_lr, "max_lr"))
        if self.min_lr is not None and self.min_lr >= self.max_lr:
            raise InvalidValue(f"min_lr must be below max_lr, got min_lr={min_lr!r} and max_lr={max_lr!r}")

    def _check_stages(self) -> None:
        """The budget, the stages' lengths and their trials (defaults measured on MNIST-1D with a
        budget, docs/autolrs.md; the paper's without)."""
        given = self.given
        self._resolve(total_steps=None if given["total_steps"] is None else positive_int(given["total_steps"],
                                                                                           "total_steps"))
        self._resolve(growth=positive_int(self.growth, "growth"), stages=positive_int(self.stages, "stages"))
        trials = (3 if self.budget else 10) if given["trials"] is None else given["trials"]
        self._resolve(trials=positive_int(trials, "trials"))
        trial_ratio = (5 if self.budget else 10) if given["trial_ratio"] is None else given["trial_ratio"]
        self._resolve(trial_ratio=positive_int(trial_ratio, "trial_ratio"))
        self._resolve(keep_winner=bool(self.keep_winner), warm_start=bool(self.warm_start))
        anneal = (ANNEAL if self.budget else 0.0) if given["anneal"] is None else given["anneal"]
        anneal = checked_float(anneal, "anneal", "a fraction in [0, 1) of total_steps",
                               lambda fraction: 0 <= fraction < 1)
        if anneal and not self.budget:
            raise InvalidValue(f"anneal={anneal!r} is a fraction of total_steps: give total_steps too")
        self._resolve(anneal=float(anneal))
        tau, tau_max = given["tau"], given["tau_max"]
        self._resolve(tau=None if tau is None else positive_int(tau, "tau"))
        if self.tau is None and not self.budget:
            self._resolve(tau=1000)
        self._resolve(tau_max=None if tau_max is None else positive_int(tau_max, "tau_max"))
        if self.tau is not None and self.tau_max is not None and self.tau_max < self.tau:
            raise InvalidValue(f"tau_max must be >= tau, got tau={tau} and tau_max={tau_max}")
        if self.tau is not None and self.tau // self.trial_ratio < 3:
            raise InvalidValue(f"tau={tau} with trial_ratio={self.trial_ratio} gives {self.tau // self.trial_ratio} "
                               "steps per trial; the forecast needs at least 3: raise tau or lower trial_ratio")

    def _check_scoring(self) -> None:
        self._resolve(val_tau=None if self.val_tau is None else positive_int(self.val_tau, "val_tau"),
                      val_points=positive_int(self.val_points, "val_points"))
        if self.val_points < 3:
            raise InvalidValue(f"val_points must be >= 3 for the forecast, got {self.given['val_points']}")

    def _check_warmup_and_range_test(self) -> None:
        self._resolve(warmup_steps=checked_int(self.warmup_steps, "warmup_steps", 0, None, "an integer >= 0"))
        self._resolve(warmup_lr=float(self.warmup_lr) if not self.warmup_steps else checked_float(
            self.warmup_lr, "warmup_lr", "a finite number > 0 when warmup_steps > 0", lambda lr: 0 < lr < math.inf))
        range_steps = self.given["range_steps"]
        if range_steps is None:  # with a budget, a tenth of it (an undone test costs what it takes)
            range_steps = min(RANGE_STEPS, max(20, self.total_steps // 10)) if self.budget else RANGE_STEPS
        self._resolve(range_steps=positive_int(range_steps, "range_steps"))
        ramp_steps = self.given["ramp_steps"]
        if ramp_steps is None:
            ramp_steps = round(RAMP * self.total_steps) if self.budget and self.exploit else 0
        self._resolve(ramp_steps=checked_int(ramp_steps, "ramp_steps", 0, None, "an integer >= 0"))
        if self.min_lr is None and self.range_steps < 10:
            raise InvalidValue(f"range_steps must be >= 10 for a range test, got {self.given['range_steps']}")

    def _check_search(self) -> None:
        self._resolve(kappa=float(self.kappa))
        self._resolve(design=checked_int(self.design, "design", 0, len(DESIGN), f"an integer from 0 to {len(DESIGN)}"))
        self._resolve(tie=checked_float(self.tie, "tie", "a finite number >= 0 (standard errors)",
                                        lambda errors: 0 <= errors < math.inf))
        self._resolve(diverge=checked_float(self.diverge, "diverge",
                                            "a number > 1 (a multiple of the checkpoint's loss)",
                                            lambda factor: factor > 1))
        self._resolve(exploit=bool(self.exploit))


def settings_of_state(options: dict) -> Settings:
    """The settings a saved AutoLRS state ran with, from the options it recorded. A state saved
    before ``ramp_steps`` existed ran with that release's defaults: no ramp, ``anneal`` 0.5 with
    a budget, a 100-step range test and 2 stages (this release's defaults differ)."""
    if "ramp_steps" in options:
        return Settings(**options)
    legacy = {"range_steps": 100, "stages": 2, **options, "ramp_steps": 0}
    if legacy.get("anneal") is None:
        legacy["anneal"] = 0.5 if legacy.get("total_steps") is not None else 0.0
    return Settings(**legacy)
