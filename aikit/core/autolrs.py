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
the loss scale, a NaN trial scores worst, and a restore always comes with the LR to use next.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import least_squares

from aikit.core.plan import positive_int
from aikit.core.scaling import warmup_fraction

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


class LogLRSearch:
    """Ask/tell Bayesian optimisation of one LR in ``[min_lr, max_lr]`` on a log scale.

    The first LR is ``first`` or else drawn at random; later ones minimise
    ``mean - kappa*std`` of a GP over the scores seen so far, among grid points at least
    ``min_gap`` (a fraction of the log range) away from every LR already tried, so no LR is
    tried twice. A non-finite score (a diverged trial) enters the GP as worse than every
    finite one.
    """

    def __init__(self, min_lr: float, max_lr: float, kappa: float = 2.0, rng: np.random.Generator | None = None,
                 grid: int = 1001, min_gap: float = 0.01, first: float | None = None):
        self.min_lr, self.max_lr = min_lr, max_lr
        self.low, self.high = math.log(min_lr), math.log(max_lr)
        self.kappa, self.min_gap, self.first = kappa, min_gap, first
        self.rng = rng if rng is not None else np.random.default_rng()
        self.grid = np.linspace(0.0, 1.0, grid)
        self.x: list[float] = []
        self.scores: list[float] = []

    def to_lr(self, x: float) -> float:
        lr = math.exp(self.low + x * (self.high - self.low))
        return float(min(max(lr, self.min_lr), self.max_lr))  # only rounding can leave the range

    def ask(self) -> float:
        if not self.x:
            return self.first if self.first is not None else self.to_lr(float(self.rng.uniform()))
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


def stage_lengths(tau: int, tau_max: int, growth: int = 2) -> Iterator[int]:
    """``tau, growth*tau, ...`` capped at ``tau_max``, then ``tau_max`` forever."""
    while True:
        yield tau
        tau = min(tau * growth, tau_max)


@dataclass(frozen=True)
class Action:
    """What the adapter does after a step, in this order: evaluate (then report the value
    with :meth:`Controller.validation`, which returns the real action), restore the stage
    checkpoint, take a stage checkpoint, and set ``lr`` for the next step."""

    lr: float
    checkpoint: bool = False
    restore: bool = False
    evaluate: bool = False


@dataclass
class Trial:
    lr: float
    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    score: float = math.nan


@dataclass
class Stage:
    index: int
    start_step: int
    tau: int
    trial_steps: int
    val_every: int | None  # None: trials are scored on training losses
    trials: list[Trial] = field(default_factory=list)
    lr: float | None = None  # the chosen LR, once the search is over


@dataclass(frozen=True)
class Record:
    step: int
    lr: float
    loss: float
    phase: str  # "warmup", "trial" or "train"


def _positive_float(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


class Controller:
    """The AutoLRS algorithm, driven step by step; see the module docstring.

    ``tau``, ``tau_max`` and ``growth``: stage lengths (paper: 1000 doubling to 8000).
    ``trials`` LRs per stage, each trained ``tau // trial_ratio`` steps (paper: 10 and 10).
    Stages of ``val_tau`` steps or more (default ``tau_max``) score trials on ``val_points``
    validation losses per trial instead of training losses. ``warmup_steps`` at
    ``warmup_lr`` ramped linearly come first and are not searched. ``kappa`` weighs
    exploration in the search, ``seed`` makes it repeatable. With ``warm_start`` (not in the
    paper) each stage's first trial is the previous stage's LR rather than a random one, so
    carrying on as before is always among the candidates.
    """

    def __init__(self, min_lr: float, max_lr: float, *, tau: int = 1000, tau_max: int = 8000, growth: int = 2,
                 trials: int = 10, trial_ratio: int = 10, val_tau: int | None = None, val_points: int = 16,
                 warmup_steps: int = 0, warmup_lr: float = 0.0, kappa: float = 2.0, warm_start: bool = True,
                 seed: int | None = 0):
        self.min_lr, self.max_lr = _positive_float(min_lr, "min_lr"), _positive_float(max_lr, "max_lr")
        if self.min_lr >= self.max_lr:
            raise ValueError(f"min_lr must be below max_lr, got min_lr={min_lr!r} and max_lr={max_lr!r}")
        self.tau, self.tau_max = positive_int(tau, "tau"), positive_int(tau_max, "tau_max")
        if self.tau_max < self.tau:
            raise ValueError(f"tau_max must be >= tau, got tau={tau} and tau_max={tau_max}")
        self.growth = positive_int(growth, "growth")
        self.trials, self.trial_ratio = positive_int(trials, "trials"), positive_int(trial_ratio, "trial_ratio")
        self.val_tau = self.tau_max if val_tau is None else positive_int(val_tau, "val_tau")
        self.val_points = positive_int(val_points, "val_points")
        if self.tau // self.trial_ratio < 3:
            raise ValueError(f"tau={tau} with trial_ratio={trial_ratio} gives {self.tau // self.trial_ratio} steps "
                             "per trial; the forecast needs at least 3: raise tau or lower trial_ratio")
        if self.val_points < 3:
            raise ValueError(f"val_points must be >= 3 for the forecast, got {val_points}")
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {warmup_steps!r}")
        if warmup_steps and not (isinstance(warmup_lr, (int, float)) and warmup_lr > 0 and math.isfinite(warmup_lr)):
            raise ValueError(f"warmup_lr must be a finite number > 0 when warmup_steps > 0, got {warmup_lr!r}")
        self.warmup_steps, self.warmup_lr = warmup_steps, float(warmup_lr)
        self.kappa, self.warm_start = float(kappa), bool(warm_start)
        self.rng = np.random.default_rng(seed)
        self._lengths = stage_lengths(self.tau, self.tau_max, self.growth)
        self.stages: list[Stage] = []
        self.history: list[Record] = []
        self.steps = 0  # steps taken, search included
        self.phase = "idle"
        self.lr = math.nan
        self._in_phase = 0
        self._evaluating = False
        self._search: LogLRSearch | None = None

    # -- the protocol ----------------------------------------------------------------------

    def begin(self) -> Action:
        """The first action, before any step: the warmup LR, or a checkpoint and a trial LR."""
        if self.phase != "idle":
            raise RuntimeError("Controller.begin() was already called")
        if self.warmup_steps:
            self.phase = "warmup"
            return self._set(self.warmup_lr * warmup_fraction(0, self.warmup_steps))
        return self._start_stage()

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
        if self.phase == "warmup":
            if self.steps < self.warmup_steps:
                return self._set(self.warmup_lr * warmup_fraction(self.steps, self.warmup_steps))
            return self._start_stage()
        if self.phase == "train":
            return self._start_stage() if self._in_phase == self.stage.tau else self._set(self.lr)
        trial = self.stage.trials[-1]
        if not math.isfinite(loss):  # diverged: no point in training it further
            trial.steps.append(self._in_phase)
            trial.losses.append(loss)
            return self._end_trial()
        if self.stage.val_every is None:
            trial.steps.append(self._in_phase)
            trial.losses.append(loss)
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
        if self._in_phase == self.stage.trial_steps or not math.isfinite(loss):
            return self._end_trial()
        return self._set(self.lr)

    @property
    def stage(self) -> Stage:
        return self.stages[-1]

    # -- transitions ------------------------------------------------------------------------

    def _set(self, lr: float, **flags: bool) -> Action:
        self.lr = lr
        return Action(lr, **flags)

    def _start_stage(self) -> Action:
        tau = next(self._lengths)
        trial_steps = tau // self.trial_ratio
        val_every = None
        if tau >= self.val_tau:
            val_every = max(1, trial_steps // self.val_points)
            trial_steps = val_every * min(self.val_points, trial_steps)
        self.stages.append(Stage(len(self.stages), self.steps, tau, trial_steps, val_every))
        previous = self.stages[-2].lr if len(self.stages) > 1 and self.warm_start else None
        self._search = LogLRSearch(self.min_lr, self.max_lr, self.kappa, self.rng, first=previous)
        log.info("AutoLRS stage %d at step %d: tau=%d, %d trials of %d steps scored on %s losses",
                 self.stage.index, self.steps, tau, self.trials, trial_steps,
                 "training" if val_every is None else "validation")
        return self._start_trial(checkpoint=True)

    def _start_trial(self, checkpoint: bool = False) -> Action:
        self.phase, self._in_phase = "trial", 0
        self.stage.trials.append(Trial(self._search.ask()))
        return self._set(self.stage.trials[-1].lr, checkpoint=checkpoint, restore=not checkpoint)

    def _end_trial(self) -> Action:
        stage, trial = self.stage, self.stage.trials[-1]
        trial.score = forecast(trial.steps, trial.losses, at=stage.tau)  # inf if it diverged
        self._search.tell(trial.lr, trial.score)
        log.info("AutoLRS stage %d trial %d/%d: lr=%.4g, last loss=%.4g, forecast at step %d: %.4g",
                 stage.index, len(stage.trials), self.trials, trial.lr, trial.losses[-1], stage.tau, trial.score)
        if len(stage.trials) < self.trials:
            return self._start_trial()
        scores = [t.score for t in stage.trials]
        if all(math.isinf(s) for s in scores):
            stage.lr = min(t.lr for t in stage.trials)
            log.warning("AutoLRS stage %d: every trial diverged; training at the smallest LR tried, %.4g. "
                        "Lower min_lr.", stage.index, stage.lr)
        else:
            stage.lr = stage.trials[int(np.argmin(scores))].lr
        log.info("AutoLRS stage %d: chose lr=%.4g for %d steps", stage.index, stage.lr, stage.tau)
        self.phase, self._in_phase = "train", 0
        return self._set(stage.lr, restore=True)
