"""How AutoLRS scores a trial: its loss ``tau`` steps after the stage start, forecast by an
exponential ``a*exp(b*t) + c`` fitted robustly by variable projection; and when a forecast
cannot be believed (a failed trial) or two forecasts are within noise of each other."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.optimize import least_squares

from aikit.core.errors import InvalidValue

RATE_GRID = 160  # decay rates tried before the fine search (log-spaced)
MAX_RATE_PER_SPAN = 50.0  # faster decays are over within 2% of the data: no longer identifiable
HUBER_K = 1.345  # Huber's constant: 95% efficiency on Gaussian noise, bounded pull of spikes
ROBUST_PASSES = 8


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
        raise InvalidValue(f"steps and losses must be 1-D and the same length, got {t.shape} and {y.shape}")
    if len(y) < 3:
        raise InvalidValue(f"an exponential fit needs at least 3 losses, got {len(y)}")
    if not (np.all(np.isfinite(t)) and np.all(np.isfinite(y))):
        raise InvalidValue("steps and losses must be finite; score a trial with a NaN loss as worst instead")
    span = t[-1] - t[0]
    if not np.all(np.diff(t) > 0):
        raise InvalidValue("steps must be strictly increasing")
    centre, scale = y.mean(), y.std()
    if scale == 0.0:
        return 0.0, -1.0 / span, float(centre)
    u, z = (t - t[0]) / span, (y - centre) / scale
    low = 0.1 if min_rate is None else min_rate * span
    if not 0.0 < low < MAX_RATE_PER_SPAN:
        raise InvalidValue(f"min_rate must be positive and below {MAX_RATE_PER_SPAN}/span, got {min_rate!r}")
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
        raise InvalidValue(f"forecast step {at} must lie after the last step {steps[-1]}")
    span = float(steps[-1]) - float(steps[0])
    a, b, c = fit_exponential(steps, y, min_rate=1.0 / span if min_rate is None else min_rate)
    return a * math.exp(b * at) + c


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


def standard_error(losses: Sequence[float]) -> float:
    """The noise of a trial's mean loss: the per-step noise from successive differences (robust
    to the trend, by the median absolute difference) over the square root of the count."""
    y = np.asarray(losses, dtype=np.float64)
    if len(y) < 3:
        return 0.0
    return float(1.4826 * np.median(np.abs(np.diff(y))) / math.sqrt(2.0) / math.sqrt(len(y)))
