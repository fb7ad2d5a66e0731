"""How AutoLRS picks the next LR to try: Bayesian optimisation over log-LR, a Matérn-5/2
Gaussian process and a lower confidence bound."""

from __future__ import annotations

import math

import numpy as np

from aikit.core.errors import InvalidState

LENGTH_SCALES = np.geomspace(0.03, 3.0, 25)  # in units of the whole log-LR range
NOISES = (1e-6, 1e-3, 1e-2, 1e-1)  # relative to the signal variance: forecasts are noisy
DESIGN = (0.5, 5 / 6, 1 / 6)  # the spread start's positions in the log range


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
            raise InvalidState(f"no untried LR left at min_gap={self.min_gap}; lower it or run fewer trials")
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
