"""AutoLRS (Jin et al., ICLR 2021): a learning-rate schedule found by Bayesian optimisation on the fly.

Training is split into *stages* of ``tau`` steps. At the start of a stage the model is
checkpointed; then ``trials`` learning rates are each trained for ``tau' = tau // trial_ratio``
steps from that checkpoint, and each trial is scored by forecasting its loss ``tau`` steps
after the stage start with an exponential ``a*exp(b*t) + c`` fitted to the trial's losses.
Bayesian optimisation over log-LR picks the next LR to try; the best-scoring LR then trains
the stage from the checkpoint. ``tau`` doubles from stage to stage up to ``tau_max``; stages
of ``val_tau`` steps or more score trials on validation losses instead of training losses.

:class:`Controller` is the whole algorithm as a small state machine with no framework in it.
An adapter feeds it the loss after every step and does what the returned :class:`Action`
says: evaluate, restore the stage checkpoint, take a new checkpoint, set the LR. The
original's flaws are fixed here: the forecast is unbiased on clean data and does not depend on
the loss scale, a diverged trial or an unbelievable forecast fails the trial, a diverged stage
is rolled back, and a restore always comes with the LR to use next. With a step budget
(``total_steps``) the stages are planned to fit it, the winning trial's progress is kept and
the run ends with an anneal; without ``min_lr``/``max_lr`` a short LR range test sets them
and the first stage trains at its ``max_lr`` without trials.
"""

from __future__ import annotations

import copy
import csv
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, astuple, dataclass, field

import numpy as np
from scipy.optimize import least_squares

from aikit.core.lr_range import LossTracker, lr_sequence, suggest
from aikit.core.validate import checked_float, checked_int, positive_float, positive_int

log = logging.getLogger("aikit.autolrs")

RATE_GRID = 160  # decay rates tried before the fine search (log-spaced)
MAX_RATE_PER_SPAN = 50.0  # faster decays are over within 2% of the data: no longer identifiable
HUBER_K = 1.345  # Huber's constant: 95% efficiency on Gaussian noise, bounded pull of spikes
ROBUST_PASSES = 8


# --------------------------------------------------------------------------------------------
# Forecast: a*exp(b*t) + c, fitted robustly by variable projection
# --------------------------------------------------------------------------------------------


def _linear_fit(e: np.ndarray, z: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weighted least squares of ``z ~ a*e + c`` for every row of ``e``: ``(a, c, residuals)``."""
    sw, se, see = w.sum(), e @ w, (e * e) @ w
    sz, sez = w @ z, (e * z) @ w
    det = sw * see - se * se
    a = np.where(det > 0, (sw * sez - se * sz) / np.where(det > 0, det, 1.0), 0.0)
    c = (sz - a * se) / sw
    return a, c, z - a[..., None] * e - c[..., None]


def _best_rate(u: np.ndarray, z: np.ndarray, w: np.ndarray, low: float, high: float, polish: bool) -> float:
    """The decay rate (per unit of ``u``) whose best linear fit leaves the least weighted error:
    the best of a log grid, polished by least squares on the residuals (exact on clean data)."""
    grid = np.linspace(math.log(low), math.log(high), RATE_GRID)
    residuals = _linear_fit(np.exp(-np.exp(grid)[:, None] * u), z, w)[2]
    i = int(np.argmin((residuals * residuals) @ w))
    if not polish:
        return math.exp(grid[i])
    root_w = np.sqrt(w)
    polished = least_squares(
        lambda g: root_w * _linear_fit(np.exp(-math.exp(g[0]) * u)[None, :], z, w)[2][0],
        x0=[grid[i]], bounds=([grid[max(i - 1, 0)]], [grid[min(i + 1, RATE_GRID - 1)]]),
        xtol=1e-15, ftol=1e-15, gtol=1e-15,
    )
    return math.exp(float(polished.x[0]))


def fit_exponential(
    steps: Sequence[float], losses: Sequence[float], min_rate: float | None = None
) -> tuple[float, float, float]:
    """Fit ``loss = a*exp(b*step) + c`` with ``b < 0``; returns ``(a, b, c)``.

    For a fixed ``b`` the best ``a, c`` are a linear least-squares problem, so only ``b`` is
    searched (a log grid, then a least-squares polish). The data are centred and scaled first,
    so the fit is exact on clean data and moves with the losses under ``k*loss + m``. Noise
    spikes are down-weighted by Huber weights from the residuals' median absolute deviation.
    ``-b`` stays within ``[min_rate, 50/span]`` (default ``min_rate``: ``0.1/span``).
    """
    t = np.asarray(steps, dtype=np.float64)
    y = np.asarray(losses, dtype=np.float64)
    if t.shape != y.shape or t.ndim != 1:
        raise ValueError(f"steps and losses must be 1-D and the same length, got {t.shape} and {y.shape}")
    if len(y) < 3:
        raise ValueError(f"an exponential fit needs at least 3 losses, got {len(y)}")
    if not (np.all(np.isfinite(t)) and np.all(np.isfinite(y))):
        raise ValueError("steps and losses must be finite; score a trial with a NaN loss as worst instead")
    span = t[-1] - t[0]
    if not np.all(np.diff(t) > 0):
        raise ValueError("steps must be strictly increasing")
    centre, scale = y.mean(), y.std()
    if scale == 0.0:
        return 0.0, -1.0 / span, float(centre)
    u, z = (t - t[0]) / span, (y - centre) / scale
    low = 0.1 if min_rate is None else min_rate * span
    if not 0.0 < low < MAX_RATE_PER_SPAN:
        raise ValueError(f"min_rate must be positive and below {MAX_RATE_PER_SPAN}/span, got {min_rate!r}")
    w = np.ones_like(z)
    for _ in range(ROBUST_PASSES):  # Huber weights by iteratively reweighted least squares
        rate = _best_rate(u, z, w, low, MAX_RATE_PER_SPAN, polish=False)
        residual = np.abs(_linear_fit(np.exp(-rate * u)[None, :], z, w)[2][0])
        spread = 1.4826 * np.median(residual)
        if spread < 1e-9:  # (almost) clean data: plain least squares is right
            break
        new_w = np.minimum(1.0, HUBER_K * spread / np.maximum(residual, 1e-300))
        if np.max(np.abs(new_w - w)) < 1e-3:
            break
        w = new_w
    rate = _best_rate(u, z, w, low, MAX_RATE_PER_SPAN, polish=True)
    a, c, _ = _linear_fit(np.exp(-rate * u)[None, :], z, w)
    b = -rate / span
    return float(a[0] * scale * math.exp(-b * t[0])), float(b), float(c[0] * scale + centre)


def forecast(steps: Sequence[float], losses: Sequence[float], at: float, min_rate: float | None = None) -> float:
    """The loss at step ``at`` forecast from a trial's ``losses`` (``inf`` if any is NaN/inf).

    Decays slower than ``min_rate`` (default: one e-fold over the trial's own span) are fitted
    at that rate: a loss still falling in a straight line at the end of a short, noisy trial is
    extrapolated about as far as it was seen to fall, not ten times as far. Without this a
    small LR's slow steady decline out-forecasts a larger LR's noisier but deeper fall.
    """
    y = np.asarray(losses, dtype=np.float64)
    if not np.all(np.isfinite(y)):
        return math.inf
    if at <= float(steps[-1]):
        raise ValueError(f"forecast step {at} must lie after the last step {steps[-1]}")
    span = float(steps[-1]) - float(steps[0])
    a, b, c = fit_exponential(steps, y, min_rate=1.0 / span if min_rate is None else min_rate)
    return a * math.exp(b * at) + c


# --------------------------------------------------------------------------------------------
# Bayesian optimisation over log-LR: a Matérn-5/2 Gaussian process and a lower confidence bound
# --------------------------------------------------------------------------------------------

LENGTH_SCALES = np.geomspace(0.03, 3.0, 25)  # in units of the whole log-LR range
NOISES = (1e-6, 1e-3, 1e-2, 1e-1)  # relative to the signal variance: forecasts are noisy


def _matern52(d: np.ndarray, length: float) -> np.ndarray:
    r = math.sqrt(5.0) * np.abs(d) / length
    return (1.0 + r + r * r / 3.0) * np.exp(-r)


class GaussianProcess:
    """A 1-D GP on ``[0, 1]`` whose length scale and noise maximise the marginal likelihood
    (the signal variance has a closed form); enough for ten points, with no extra dependency."""

    def __init__(self, x: np.ndarray, y: np.ndarray):
        self.x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        self.mean, self.scale = y.mean(), (y.std() or 1.0)
        z = (y - self.mean) / self.scale
        n, best = len(z), None
        for length in LENGTH_SCALES:
            corr = _matern52(self.x[:, None] - self.x[None, :], length)
            for noise in NOISES:
                chol = np.linalg.cholesky(corr + noise * np.eye(n))
                alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, z))
                variance = max(float(z @ alpha) / n, 1e-12)
                nll = 0.5 * n * math.log(variance) + float(np.log(np.diag(chol)).sum())
                if best is None or nll < best[0]:
                    best = (nll, length, chol, alpha, variance)
        _, self.length, self._chol, self._alpha, self._variance = best

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation of the latent function at ``x``."""
        cross = _matern52(np.asarray(x)[:, None] - self.x[None, :], self.length)
        v = np.linalg.solve(self._chol, cross.T)
        var = np.maximum(self._variance * (1.0 - (v * v).sum(axis=0)), 0.0)
        return self.mean + self.scale * (cross @ self._alpha), self.scale * np.sqrt(var)


DESIGN = (0.5, 5 / 6, 1 / 6)  # the spread start's positions in the log range


class LogLRSearch:
    """Ask/tell Bayesian optimisation of one LR in ``[min_lr, max_lr]`` on a log scale.

    The first LR is ``first`` (if given); then the first ``design`` positions of ``DESIGN``
    (the middle, the top and the bottom sixth of the log range) that are not next to an LR
    tried; without either, a random LR. Later ones minimise
    ``mean - kappa*std`` of a GP over the scores seen so far, among grid points at least
    ``min_gap`` (a fraction of the log range) away from every LR already tried, so no LR is
    tried twice. A non-finite score (a diverged trial) enters the GP as worse than every
    finite one.
    """

    def __init__(self, min_lr: float, max_lr: float, kappa: float = 2.0, rng: np.random.Generator | None = None,
                 grid: int = 1001, min_gap: float = 0.01, first: float | None = None, design: int = 0):
        self.min_lr, self.max_lr = min_lr, max_lr
        self.low, self.high = math.log(min_lr), math.log(max_lr)
        self.kappa, self.min_gap, self.first, self.design = kappa, min_gap, first, design
        self.rng = rng if rng is not None else np.random.default_rng()
        self.grid = np.linspace(0.0, 1.0, grid)
        self.x: list[float] = []
        self.scores: list[float] = []

    def to_lr(self, x: float) -> float:
        lr = math.exp(self.low + x * (self.high - self.low))
        return float(min(max(lr, self.min_lr), self.max_lr))  # only rounding can leave the range

    def ask(self) -> float:
        if not self.x and self.first is not None:
            return self.first
        for x in DESIGN[:self.design]:  # a spread start: the GP needs more than one corner to go on
            far = not self.x or min(abs(x - np.asarray(self.x))) >= 2 * self.min_gap
            if far and len(self.x) < self.design:
                return self.to_lr(x)
        if not self.x:
            return self.to_lr(float(self.rng.uniform()))
        free = np.min(np.abs(self.grid[:, None] - np.asarray(self.x)[None, :]), axis=1) >= self.min_gap
        if not free.any():
            raise RuntimeError(f"no untried LR left at min_gap={self.min_gap}; lower it or run fewer trials")
        mean, std = GaussianProcess(np.asarray(self.x), self._filled_scores()).predict(self.grid[free])
        return self.to_lr(float(self.grid[free][int(np.argmin(mean - self.kappa * std))]))

    def tell(self, lr: float, score: float) -> None:
        self.x.append((math.log(lr) - self.low) / (self.high - self.low))
        self.scores.append(float(score))

    def _filled_scores(self) -> np.ndarray:
        """Scores for the GP: a blow-up (finite but far above the rest, or inf) is capped just
        above the others, so it marks its region bad without flattening every other score."""
        s = np.asarray(self.scores)
        finite = np.isfinite(s)
        if not finite.any():
            return np.zeros_like(s)
        best, middle = s[finite].min(), np.median(s[finite])
        cap = middle + 3.0 * (middle - best) if middle > best else s[finite].max()
        s = np.where(finite, np.minimum(s, cap), np.inf)
        top = s[finite].max()
        return np.where(finite, s, top + ((top - best) or 1.0))


# --------------------------------------------------------------------------------------------
# The stage plan and the state machine the adapters drive
# --------------------------------------------------------------------------------------------

RANGE_START, RANGE_END = 1e-6, 10.0  # the default range test's sweep
RANGE_BELOW_HOT = 3.0  # max_lr = (LR at the range test's lowest loss) / 3: that LR is already too hot
RANGE_DECADES = 3  # min_lr = max_lr / 10**3
ROLLBACK_FACTOR = 3.0  # a diverged stage is retried at lr / 3 (again and again if needed)
DIVERGE_WINDOW = 5  # losses averaged to call a divergence (a single noisy batch is not one)
PROGRESS = 1.5  # a checkpoint's loss this far below the first loss is progress a divergence can lose


def stage_length(index: int, tau: int, tau_max: int, growth: int = 2) -> int:
    """Stage ``index``'s length without a budget: ``tau * growth**index`` capped at ``tau_max``."""
    return min(tau * growth ** min(index, 64), tau_max)


def plan_stages(steps: int, tau: int, tau_max: int, growth: int, stage_cost) -> tuple[list[int], int]:
    """Stage lengths whose ``stage_cost`` fits in ``steps``: ``tau``, ``growth*tau``, ...
    (capped at ``tau_max``) while the next one fits; and the steps left over, which the last
    stage trains on (its trials stay those of its planned length). Empty if none fits."""
    lengths, used = [], 0
    while used + stage_cost(len(lengths), stage_length(len(lengths), tau, tau_max, growth)) <= steps:
        lengths.append(stage_length(len(lengths), tau, tau_max, growth))
        used += stage_cost(len(lengths) - 1, lengths[-1])
    return lengths, steps - used


@dataclass(frozen=True)
class Action:
    """What the adapter does after a step, in this order: evaluate (then report the value
    with :meth:`Controller.validation`, which returns the real action); ``keep_trial``: copy
    the current state into the trial slot; ``restore``: load the stage checkpoint, or
    ``resume_trial``: load the trial slot; ``checkpoint``: copy the current state into the
    stage checkpoint; and set ``lr`` for the next step."""

    lr: float
    checkpoint: bool = False
    restore: bool = False
    evaluate: bool = False
    keep_trial: bool = False
    resume_trial: bool = False


@dataclass
class Trial:
    lr: float
    start_step: int = 0  # steps taken before its first step
    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    score: float = math.nan
    failed: str = ""  # why the trial cannot win ("" if it can)


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


def _standard_error(losses: Sequence[float]) -> float:
    """The noise of a trial's mean loss: the per-step noise from successive differences (robust
    to the trend, by the median absolute difference) over the square root of the count."""
    y = np.asarray(losses, dtype=np.float64)
    if len(y) < 3:
        return 0.0
    return float(1.4826 * np.median(np.abs(np.diff(y))) / math.sqrt(2.0) / math.sqrt(len(y)))


def failed_forecast(losses: Sequence[float], score: float) -> str:
    """Why a trial's forecast cannot be believed ("" if it can): below zero for losses that
    never were, or below the lowest loss seen by more than the whole range the trial saw (a fit
    thrown off by a spike extrapolates a fall the trial never showed)."""
    y = np.asarray(losses, dtype=np.float64)
    if not math.isfinite(score):
        return "diverged"
    if score < 0.0 <= y.min():
        return f"forecast {score:.4g} below zero for non-negative losses"
    if score < y.min() - (y.max() - y.min()):
        return f"forecast {score:.4g} far below every loss seen ({y.min():.4g} to {y.max():.4g})"
    return ""


_STATE = ("min_lr", "max_lr", "tau", "plan", "steps", "phase", "lr", "rollbacks", "range_test", "_in_phase",
          "_evaluating", "_reference", "_anneal_from", "_kept", "_kept_mark", "_segment_start")


class Controller:
    """The AutoLRS algorithm, driven step by step; see the module docstring.

    ``min_lr``, ``max_lr``: the log-scale search range; when either is None a short LR range
    test (``range_steps`` steps climbing from 1e-6 to 10, then undone) sets both: ``max_lr``
    a third of the LR at its lowest smoothed loss, ``min_lr`` three decades below.

    ``total_steps``: the run's whole budget, search included. With it the stages are planned
    to fill the budget exactly, the last ``anneal`` fraction (default 0.5) decays the LR to zero
    on a cosine, and ``tau`` defaults to a length that gives ``stages`` doubling stages.
    Without it stages go on forever (the paper's AutoLRS).

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
    """

    def __init__(self, min_lr: float | None = None, max_lr: float | None = None, *, total_steps: int | None = None,
                 tau: int | None = None, tau_max: int | None = None, growth: int = 2, stages: int = 2,
                 trials: int | None = None, trial_ratio: int | None = None, keep_winner: bool = True,
                 anneal: float | None = None,
                 val_tau: int | None = None, val_points: int = 16, warmup_steps: int = 0, warmup_lr: float = 0.0,
                 range_steps: int = 100, design: int = 3, tie: float = 0.0, kappa: float = 2.0,
                 warm_start: bool = True, diverge: float = 5.0, exploit: bool = True,
                 seed: int | None = 0):
        self._options = {name: value for name, value in locals().items() if name != "self"}
        if (min_lr is None) != (max_lr is None):
            raise ValueError(f"give both min_lr and max_lr or neither (for a range test), got min_lr={min_lr!r} "
                             f"and max_lr={max_lr!r}")
        self.min_lr = None if min_lr is None else positive_float(min_lr, "min_lr")
        self.max_lr = None if max_lr is None else positive_float(max_lr, "max_lr")
        if self.min_lr is not None and self.min_lr >= self.max_lr:
            raise ValueError(f"min_lr must be below max_lr, got min_lr={min_lr!r} and max_lr={max_lr!r}")
        self.total_steps = None if total_steps is None else positive_int(total_steps, "total_steps")
        self.growth, self.stages_planned = positive_int(growth, "growth"), positive_int(stages, "stages")
        budget = self.total_steps is not None  # defaults measured on MNIST-1D (docs/autolrs.md); else the paper's
        self.trials = positive_int((3 if budget else 10) if trials is None else trials, "trials")
        self.trial_ratio = positive_int((5 if budget else 10) if trial_ratio is None else trial_ratio, "trial_ratio")
        self.keep_winner, self.warm_start = bool(keep_winner), bool(warm_start)
        anneal = (0.5 if budget else 0.0) if anneal is None else anneal
        anneal = checked_float(anneal, "anneal", "a fraction in [0, 1) of total_steps",
                               lambda fraction: 0 <= fraction < 1)
        if anneal and self.total_steps is None:
            raise ValueError(f"anneal={anneal!r} is a fraction of total_steps: give total_steps too")
        self.anneal = float(anneal)
        self.tau = None if tau is None else positive_int(tau, "tau")
        if self.tau is None and self.total_steps is None:
            self.tau = 1000
        self.tau_max = None if tau_max is None else positive_int(tau_max, "tau_max")
        if self.tau is not None and self.tau_max is not None and self.tau_max < self.tau:
            raise ValueError(f"tau_max must be >= tau, got tau={tau} and tau_max={tau_max}")
        if self.tau is not None and self.tau // self.trial_ratio < 3:
            raise ValueError(f"tau={tau} with trial_ratio={self.trial_ratio} gives {self.tau // self.trial_ratio} "
                             "steps per trial; the forecast needs at least 3: raise tau or lower trial_ratio")
        self.val_tau = None if val_tau is None else positive_int(val_tau, "val_tau")
        self.val_points = positive_int(val_points, "val_points")
        if self.val_points < 3:
            raise ValueError(f"val_points must be >= 3 for the forecast, got {val_points}")
        self.warmup_steps = checked_int(warmup_steps, "warmup_steps", 0, None, "an integer >= 0")
        self.warmup_lr = float(warmup_lr) if not self.warmup_steps else checked_float(
            warmup_lr, "warmup_lr", "a finite number > 0 when warmup_steps > 0", lambda lr: 0 < lr < math.inf)
        self.range_steps = positive_int(range_steps, "range_steps")
        if self.min_lr is None and self.range_steps < 10:
            raise ValueError(f"range_steps must be >= 10 for a range test, got {range_steps}")
        self.kappa = float(kappa)
        self.design = checked_int(design, "design", 0, len(DESIGN), f"an integer from 0 to {len(DESIGN)}")
        self.tie = checked_float(tie, "tie", "a finite number >= 0 (standard errors)",
                                 lambda errors: 0 <= errors < math.inf)
        self.diverge = checked_float(diverge, "diverge", "a number > 1 (a multiple of the checkpoint's loss)",
                                     lambda factor: factor > 1)
        self.exploit = bool(exploit)
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.stages: list[Stage] = []
        self.history: list[Record] = []
        self.range_test: dict[str, list[float]] = {"lr": [], "loss": []}
        self.plan: list[list] | None = None  # [tau, trial steps, val_every] per stage (with a budget)
        self.steps = 0  # steps taken, search included
        self.phase = "idle"
        self.lr = math.nan
        self.rollbacks = 0
        self._in_phase = 0
        self._evaluating = False
        self._reference = math.inf  # the loss at the latest checkpoint (for divergence)
        self._anneal_from = math.nan
        self._search: LogLRSearch | None = None
        self._kept: list[float] = []  # the LR of every step on the kept trajectory
        self._kept_mark = 0  # len(_kept) at the latest checkpoint
        self._segment_start = 0  # the step of the latest checkpoint or restore

    # -- the protocol ----------------------------------------------------------------------

    @property
    def kept(self) -> bool:
        """Whether the model now trained is the one the run keeps (not a trial or range test)."""
        return self.phase not in ("trial", "range")

    @property
    def anneal_steps(self) -> int:
        return 0 if self.total_steps is None else round(self.anneal * self.total_steps)

    def begin(self, current_lr: float | None = None) -> Action:
        """The first action, before any step. ``current_lr``: the optimizer's own LR, which
        the first warmup step keeps (as in the original AutoLRS)."""
        if self.phase != "idle":
            raise RuntimeError("Controller.begin() was already called")
        if self.warmup_steps:
            self.phase = "warmup"
            return self._set(self.warmup_lr / self.warmup_steps if current_lr is None else float(current_lr))
        return self._after_warmup()

    def step(self, loss: float) -> Action:
        """Report the training loss of the step just taken; returns what to do next."""
        if self.phase == "idle":
            raise RuntimeError("call Controller.begin() before the first step")
        if self._evaluating:
            raise RuntimeError("an evaluate action is pending: report the validation loss with validation() first")
        loss = float(loss)
        self.steps += 1
        self._in_phase += 1
        self.history.append(Record(self.steps, self.lr, loss, self.phase))
        if self.kept:
            self._kept.append(self.lr)
        if self.phase == "warmup":
            if self._in_phase <= self.warmup_steps:
                return self._set(self.warmup_lr * self._in_phase / self.warmup_steps)
            return self._after_warmup()
        if self.phase == "range":
            return self._range_step(loss)
        if self.phase in ("train", "anneal"):
            return self._train_step()
        if self.phase == "done":
            return self._set(self.lr)
        trial = self.stage.trials[-1]
        if self.stage.val_every is None or not math.isfinite(loss):
            trial.steps.append(self._in_phase)
            trial.losses.append(loss)
        if self._diverged():
            trial.failed = "diverged"
            return self._end_trial()
        if self.stage.val_every is None:
            return self._end_trial() if self._in_phase == self.stage.trial_steps else self._set(self.lr)
        if self._in_phase % self.stage.val_every == 0:
            self._evaluating = True
            return Action(self.lr, evaluate=True)
        return self._set(self.lr)

    def validation(self, loss: float) -> Action:
        """Report the validation loss asked for by an ``evaluate`` action."""
        if not self._evaluating:
            raise RuntimeError("validation() answers an evaluate action; none is pending")
        self._evaluating = False
        trial = self.stage.trials[-1]
        trial.steps.append(self._in_phase)
        trial.losses.append(float(loss))
        if not math.isfinite(loss):
            trial.failed = "diverged"
            return self._end_trial()
        if self._in_phase == self.stage.trial_steps:
            return self._end_trial()
        return self._set(self.lr)

    @property
    def stage(self) -> Stage:
        return self.stages[-1]

    def schedule(self) -> list[tuple[int, float]]:
        """``(step, lr)`` of every step of the run AutoLRS kept, numbered from 0: its warmup,
        its stages (a kept winning trial's steps included), its anneal; not the trials it undid,
        the range test or the steps a rollback undid. Replaying it (:func:`write_schedule`,
        ``ReplaySchedule``) trains the same way without any search."""
        return list(enumerate(self._kept))

    def state_dict(self) -> dict:
        """Everything the search has seen and decided, as plain numbers, strings, lists and
        dicts (JSON-able). With the adapter's model checkpoints, a preempted run resumes its
        search where it was."""
        state = {name: copy.deepcopy(getattr(self, name)) for name in _STATE}
        state["options"] = dict(self._options)
        state["rng"] = copy.deepcopy(self.rng.bit_generator.state)
        state["stages"] = [asdict(stage) for stage in self.stages]
        state["history"] = [astuple(record) for record in self.history]
        state["search"] = None if self._search is None else {
            "x": list(self._search.x), "scores": list(self._search.scores), "first": self._search.first}
        state["tracker"] = None if self.phase != "range" else {
            "best": self._tracker.best, "last": self._tracker.last, "stop_reason": self._tracker.stop_reason}
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict`'s result. The controller must be built with the same
        options; a state that does not fit is refused and changes nothing."""
        missing = {*_STATE, "options", "rng", "stages", "history", "search", "tracker"} - set(state)
        if missing:
            raise ValueError(f"not an AutoLRS state: keys {sorted(missing)} are missing")
        differ = {k: (state["options"].get(k), v) for k, v in self._options.items() if state["options"].get(k) != v}
        if differ:
            raise ValueError("the AutoLRS state was saved with other options (saved, here): "
                             + ", ".join(f"{k}={a!r}, {b!r}" for k, (a, b) in differ.items())
                             + "; build the AutoLRS with the options it was saved with")
        rng = np.random.default_rng()
        rng.bit_generator.state = state["rng"]
        stages = [Stage(**{**s, "trials": [Trial(**t) for t in s["trials"]]}) for s in state["stages"]]
        history = [Record(*r) for r in state["history"]]
        search = tracker = None
        if state["search"] is not None:
            search = LogLRSearch(state["min_lr"], state["max_lr"], self.kappa, rng, first=state["search"]["first"],
                                 design=self.design)
            search.x, search.scores = list(state["search"]["x"]), list(state["search"]["scores"])
        if state["tracker"] is not None:
            tracker = LossTracker()
            tracker.best, tracker.last, tracker.stop_reason = (state["tracker"][k] for k in ("best", "last",
                                                                                             "stop_reason"))
        for name in _STATE:
            setattr(self, name, copy.deepcopy(state[name]))
        self.rng, self.stages, self.history, self._search = rng, stages, history, search
        if tracker is not None:
            self._tracker = tracker
            self._range_lrs = lr_sequence(RANGE_START, RANGE_END, self.range_steps)

    # -- transitions ------------------------------------------------------------------------

    def _set(self, lr: float, **flags: bool) -> Action:
        self.lr = lr
        if flags.get("restore") or flags.get("checkpoint") or flags.get("resume_trial"):
            self._segment_start = self.steps
        if flags.get("restore") and self.kept:  # a rollback undoes the kept steps since the checkpoint
            del self._kept[self._kept_mark:]
        if flags.get("checkpoint"):
            if flags.get("resume_trial"):  # the winner's state: its own latest training losses
                trial = self.stage.trials[self.stage.kept]
                self._reference = self._recent_loss(trial.start_step, trial.start_step + self.stage.trial_steps)
            elif not flags.get("restore"):  # (a restore, then a checkpoint of that same state: as before)
                self._reference = self._recent_loss(0, self.steps)
            self._kept_mark = len(self._kept)
        return Action(lr, **flags)

    def _recent_loss(self, after: int, upto: int) -> float:
        """The median of the last 10 finite training losses of steps ``after+1 .. upto``."""
        finite = [r.loss for r in self.history[after:upto] if math.isfinite(r.loss)][-10:]
        return float(np.median(finite)) if finite else math.inf

    def _diverged(self) -> bool:
        """The losses since the latest checkpoint or restore have blown up: NaN/inf, or their
        mean over the last few steps has lost half the progress the run had made by the
        checkpoint (a network killed by a large LR falls back to its first loss) or, before any
        progress (a loss less than 1/``PROGRESS`` of the first: else noise would trip it), grown
        ``diverge``-fold. Noise late in training is neither."""
        recent = [r.loss for r in self.history[-DIVERGE_WINDOW:] if r.step > self._segment_start]
        if not all(math.isfinite(x) for x in recent):
            return True
        if len(recent) < DIVERGE_WINDOW:
            return False
        first, mean = self.history[0].loss, float(np.mean(recent))
        if math.isfinite(first) and first > PROGRESS * self._reference:
            return mean > self._reference + (first - self._reference) / 2
        return mean > self.diverge * self._reference

    def _after_warmup(self) -> Action:
        if self.min_lr is not None:
            return self._start_stage(checkpoint=True)
        self.phase, self._in_phase = "range", 0
        self._range_lrs = lr_sequence(RANGE_START, RANGE_END, self.range_steps)
        self._tracker = LossTracker()
        log.info("AutoLRS: no min_lr/max_lr given; running an LR range test of %d steps (%.0e to %.0e) to set them",
                 self.range_steps, RANGE_START, RANGE_END)
        return self._set(self._range_lrs[0], checkpoint=True)

    def _range_step(self, loss: float) -> Action:
        self.range_test["lr"].append(self.lr)
        self.range_test["loss"].append(self._tracker.update(loss))
        if self._tracker.stop_reason is None and self._in_phase < self.range_steps:
            return self._set(self._range_lrs[self._in_phase])
        lrs, losses = self.range_test["lr"], self.range_test["loss"]
        if not math.isfinite(losses[-1]):
            lrs, losses = lrs[:-1], losses[:-1]
        if len(losses) < 2:
            raise RuntimeError(f"the LR range test diverged at its first LRs ({self.range_test['lr']}): "
                               "give min_lr and max_lr")
        hot = suggest(lrs, losses, method="minimum").lr * 10  # the LR at the lowest loss
        self.max_lr = hot / RANGE_BELOW_HOT
        self.min_lr = self.max_lr / 10**RANGE_DECADES
        log.info("AutoLRS: range test over %d steps (%s): lowest loss at lr=%.4g; searching min_lr=%.4g to "
                 "max_lr=%.4g", len(self.range_test["lr"]), self._tracker.stop_reason or "completed",
                 hot, self.min_lr, self.max_lr)
        return self._start_stage(restore=True)

    def _stage_cost(self, index: int, tau: int) -> int:
        if self._exploits(index):
            return tau
        trial_steps = self._trial_steps(tau)[0]
        return self.trials * trial_steps + tau - (trial_steps if self.keep_winner else 0)

    def _exploits(self, index: int) -> bool:
        """With ``exploit``, stage 0 after a range test trains at ``max_lr`` without trials: the
        range test was its search, and trials that start from an untrained net barely move it."""
        return index == 0 and self.exploit and bool(self.range_test["lr"])

    def _trial_steps(self, tau: int) -> tuple[int, int | None]:
        trial_steps = max(3, tau // self.trial_ratio)
        if tau < (self.val_tau or self.tau_max or math.inf):
            return trial_steps, None
        val_every = max(1, trial_steps // self.val_points)
        return val_every * min(self.val_points, trial_steps), val_every

    def _make_plan(self) -> None:
        """With a budget: the stage lengths that fill it (after warmup and range test, before
        the anneal)."""
        steps = self.total_steps - self.steps - self.anneal_steps
        if self.tau is None:  # stages of tau, 2 tau, 4 tau...: cost ~ (1 + 2 + 4) tau * per-step cost
            per_tau = sum(self._stage_cost(i, 10**6 * self.growth**i) for i in range(self.stages_planned)) / 10**6
            self.tau = max(3 * self.trial_ratio, int(steps / per_tau))
        lengths, left = plan_stages(steps, self.tau, self.tau_max or 10**12, self.growth, self._stage_cost)
        # [tau, trial steps, val_every] per stage; the last stage trains on for what is left
        self.plan = [[tau, *self._trial_steps(tau)] for tau in lengths]
        if self.plan:
            self.plan[-1][0] += left
        if not self.plan:
            raise ValueError(f"total_steps={self.total_steps} leaves {steps} steps for the search after warmup, "
                             f"range test and anneal, less than one stage of tau={self.tau} "
                             f"({self._stage_cost(0, self.tau)} steps): raise total_steps or lower tau or trials")
        log.info("AutoLRS plan for %d steps: stages of %s steps, then %d annealing steps",
                 self.total_steps, [tau for tau, _, _ in self.plan], self.anneal_steps)

    def _start_stage(self, checkpoint: bool = False, restore: bool = False) -> Action:
        if self.total_steps is not None and self.plan is None:
            self._make_plan()
        index = len(self.stages)
        if self.plan is not None and index >= len(self.plan):
            return self._start_anneal()
        if self.plan is not None:
            tau, trial_steps, val_every = self.plan[index]
        else:
            tau = stage_length(index, self.tau, self.tau_max or 8000, self.growth)
            trial_steps, val_every = self._trial_steps(tau)
        self.stages.append(Stage(index, self.steps, tau, trial_steps, val_every))
        if self._exploits(index):
            self.stage.lr, self.phase, self._in_phase = self.max_lr, "train", 0
            log.info("AutoLRS stage 0 at step %d: %d steps at the range test's max_lr=%.4g, without trials",
                     self.steps, tau, self.stage.lr)
            action = self._set(self.stage.lr, checkpoint=True, restore=restore)
            start = self.steps - len(self.range_test["lr"])  # the checkpoint's loss: the test's first losses
            self._reference = self._recent_loss(start, start + DIVERGE_WINDOW)
            return action
        previous = self.stages[-2].lr if index > 0 and self.warm_start else None
        self._search = LogLRSearch(self.min_lr, self.max_lr, self.kappa, self.rng, first=previous,
                                   design=self.design)
        log.info("AutoLRS stage %d at step %d: tau=%d, %d trials of %d steps scored on %s losses",
                 index, self.steps, tau, self.trials, trial_steps, "training" if val_every is None else "validation")
        self.phase, self._in_phase = "trial", 0
        self.stage.trials.append(Trial(self._search.ask(), self.steps))
        return self._set(self.stage.trials[-1].lr, checkpoint=True, restore=restore)

    def _start_trial(self, keep_trial: bool) -> Action:
        self.phase, self._in_phase = "trial", 0
        self.stage.trials.append(Trial(self._search.ask(), self.steps))
        return self._set(self.stage.trials[-1].lr, restore=True, keep_trial=keep_trial)

    def _end_trial(self) -> Action:
        stage, trial = self.stage, self.stage.trials[-1]
        if not trial.failed:
            trial.score = forecast(trial.steps, trial.losses, at=stage.tau)
            trial.failed = failed_forecast(trial.losses, trial.score)
        self._search.tell(trial.lr, math.inf if trial.failed else trial.score)
        log.info("AutoLRS stage %d trial %d/%d: lr=%.4g, last loss=%.4g, forecast at step %d: %.4g%s",
                 stage.index, len(stage.trials), self.trials, trial.lr, (trial.losses or [math.nan])[-1], stage.tau,
                 trial.score,
                 f" (failed: {trial.failed})" if trial.failed else "")
        chosen = self._choice(stage)
        keep = self.keep_winner and chosen == len(stage.trials) - 1  # the choice so far: keep its state
        if keep:
            stage.kept = chosen
        if len(stage.trials) < self.trials:
            return self._start_trial(keep_trial=keep)
        self.phase = "train"
        if chosen is None:
            stage.lr, stage.kept = min(t.lr for t in stage.trials), None
            log.warning("AutoLRS stage %d: every trial failed; training at the smallest LR tried, %.4g. "
                        "Lower min_lr.", stage.index, stage.lr)
        else:
            stage.lr = stage.trials[chosen].lr
            if stage.kept != chosen:  # its state was overwritten by a trial chosen for a while
                stage.kept = None
        if stage.kept is not None:  # the winner's steps are the stage's first steps
            self._in_phase = stage.trial_steps
            self._kept.extend([stage.lr] * stage.trial_steps)
            log.info("AutoLRS stage %d: chose lr=%.4g; continuing the winning trial for %d more steps",
                     stage.index, stage.lr, stage.tau - self._in_phase)
            return self._set(stage.lr, keep_trial=keep, resume_trial=True, checkpoint=True)
        self._in_phase = 0
        log.info("AutoLRS stage %d: chose lr=%.4g for %d steps", stage.index, stage.lr, stage.tau)
        return self._set(stage.lr, restore=True)

    def _choice(self, stage: Stage) -> int | None:
        """The trial to train on: the largest LR whose forecast lies within ``tie`` standard
        errors of the best forecast (a larger LR's noisier loss should not lose to noise); None
        if every trial failed."""
        good = [i for i, t in enumerate(stage.trials) if not t.failed]
        if not good:
            return None
        best = min(good, key=lambda i: stage.trials[i].score)
        margin = self.tie * _standard_error(stage.trials[best].losses)
        return max((i for i in good if stage.trials[i].score <= stage.trials[best].score + margin),
                   key=lambda i: stage.trials[i].lr)

    def _train_step(self) -> Action:
        if self._diverged():
            self.rollbacks += 1
            lowered = self.lr / ROLLBACK_FACTOR
            if self.phase == "anneal":
                self._anneal_from /= ROLLBACK_FACTOR
            else:
                self.stage.lr = lowered
            log.warning("AutoLRS: the loss diverged at step %d (lr=%.4g); rolled back to the %s's checkpoint "
                        "and retrying at lr=%.4g", self.steps, self.lr, "anneal" if self.phase == "anneal"
                        else "stage", lowered)
            return self._set(lowered if self.phase == "train" else self._anneal_lr(), restore=True)
        if self.phase == "anneal":
            if self._in_phase >= self.anneal_steps:
                self.phase = "done"
                log.info("AutoLRS: the %d-step budget is spent; the LR stays at %.4g", self.total_steps, 0.0)
                return self._set(0.0)
            return self._set(self._anneal_lr())
        if self._in_phase >= self.stage.tau:
            return self._start_stage(checkpoint=True)
        return self._set(self.lr)

    def _start_anneal(self) -> Action:
        self.phase, self._in_phase = "anneal", 0
        self._anneal_from = self.stage.lr
        if not self.anneal_steps:
            self.phase = "done"
            return self._set(self.lr)
        log.info("AutoLRS: annealing from lr=%.4g to 0 over the last %d steps", self._anneal_from, self.anneal_steps)
        return self._set(self._anneal_lr(), checkpoint=True)

    def _anneal_lr(self) -> float:
        return self._anneal_from * 0.5 * (1.0 + math.cos(math.pi * self._in_phase / self.anneal_steps))


def write_schedule(path: str | os.PathLike, schedule: Sequence[tuple[int, float]]) -> None:
    """Save ``(step, lr)`` pairs as a CSV with a ``step,lr`` header (floats by ``repr``, so
    reading them back gives the same bits)."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["step", "lr"])
        for step, lr in schedule:
            writer.writerow([int(step), repr(float(lr))])


def read_schedule(path: str | os.PathLike) -> list[float]:
    """The LR of steps 0, 1, 2, ... from a ``step,lr`` CSV; steps must run 0, 1, 2, ... with no gap
    and LRs must be finite and >= 0."""
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle))
    if not rows or [c.strip() for c in rows[0]] != ["step", "lr"]:
        raise ValueError(f"{path}: expected a 'step,lr' header, got {rows[0] if rows else 'an empty file'}")
    lrs = []
    for line, row in enumerate(rows[1:], start=2):
        try:
            step, lr = int(row[0]), float(row[1])
        except (ValueError, IndexError):
            raise ValueError(f"{path} line {line}: expected 'step,lr' numbers, got {row}") from None
        if step != len(lrs):
            raise ValueError(f"{path} line {line}: step {step}, expected {len(lrs)} (steps run 0, 1, 2, ...)")
        if not (math.isfinite(lr) and lr >= 0):
            raise ValueError(f"{path} line {line}: lr must be finite and >= 0, got {lr}")
        lrs.append(lr)
    if not lrs:
        raise ValueError(f"{path}: no steps after the header")
    return lrs


def replay_lr(lrs: Sequence[float], step: int) -> float:
    """The replayed LR of ``step``; past the schedule's end its last LR (said in the docs)."""
    return lrs[min(step, len(lrs) - 1)]
