"""A stage's trials: the search they ask, and as each ends its score, the winner, the LR the stage trains at.

A trial fails when its loss diverged, when ``val_fn`` failed it (a validation loss that is not
finite, or fewer than 3 evaluations left for the forecast), or when its forecast cannot be
believed (:mod:`~aikit.core.autolrs.loss_forecast`). The stage trains at the largest LR whose
forecast lies within ``tie`` standard errors of the best (:func:`winner`); where every trial
failed, at the smallest LR tried, and where ``val_fn`` failed every one the run stops.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import numpy as np

from aikit.core.autolrs.loss_forecast import failed_forecast, forecast, standard_error
from aikit.core.autolrs.search import LogLRSearch
from aikit.core.autolrs.settings import Settings
from aikit.core.autolrs.stages import Stage, Trial
from aikit.core.errors import TrainingFailed

log = logging.getLogger("aikit.autolrs")

VAL_FAILED = "val_fn"  # how the reason a trial failed on its validation losses begins


def stage_search(stages: list[Stage], settings: Settings, min_lr: float, max_lr: float,
                 rng: np.random.Generator) -> LogLRSearch:
    """The search the trials of the latest of ``stages`` ask, over ``min_lr`` to ``max_lr``: its
    first trial at the previous stage's LR with ``warm_start``."""
    stage = stages[-1]
    previous = stages[-2].lr if stage.index > 0 and settings.warm_start else None
    search = LogLRSearch(min_lr, max_lr, settings.kappa, rng, first=previous, design=settings.design)
    log.info("AutoLRS stage %d at step %d: tau=%d, %d trials of %d steps scored on %s losses",
             stage.index, stage.start_step, stage.tau, settings.trials, stage.trial_steps,
             "training" if stage.val_every is None else "validation")
    return search


def end_trial(stage: Stage, search: LogLRSearch, settings: Settings, last_val_error: str) -> int | None:
    """Score the stage's latest trial, tell the search, and return the index of the winner so
    far (None: every trial so far failed). ``last_val_error``: why ``val_fn`` failed last, for
    a trial left with too few evaluations."""
    trial = stage.trials[-1]
    if not trial.failed and len(trial.losses) < 3:  # validations skipped: too few left to forecast
        trial.failed = (f"{VAL_FAILED} failed at {trial.missed} of its {trial.missed + len(trial.losses)} "
                        f"evaluations (last: {last_val_error})")
    if not trial.failed:
        trial.score = forecast(trial.steps, trial.losses, at=stage.tau)
        trial.failed = failed_forecast(trial.losses, trial.score)
    search.tell(trial.lr, math.inf if trial.failed else trial.score)
    log.info("AutoLRS stage %d trial %d/%d: lr=%.4g, last loss=%.4g, forecast at step %d: %.4g%s",
             stage.index, len(stage.trials), settings.trials, trial.lr, (trial.losses or [math.nan])[-1],
             stage.tau, trial.score,
             f" (failed: {trial.failed})" if trial.failed else "")
    return winner(stage.trials, settings.tie)


def winner(trials: Sequence[Trial], tie: float) -> int | None:
    """The index of the trial to train on: the largest LR whose forecast lies within ``tie``
    standard errors of the best forecast (a larger LR's noisier loss should not lose to
    noise); None if every trial failed."""
    good = [i for i, t in enumerate(trials) if not t.failed]
    if not good:
        return None
    best = min(good, key=lambda i: trials[i].score)
    margin = tie * standard_error(trials[best].losses)
    return max((i for i in good if trials[i].score <= trials[best].score + margin), key=lambda i: trials[i].lr)


def settle(stage: Stage, chosen: int | None) -> None:
    """The LR the stage trains at once its trials are over, the ``chosen`` one's, and whether
    it keeps that trial's state (only if the trial slot still holds it); refused where
    ``val_fn`` failed every trial."""
    if chosen is None and all(t.failed.startswith(VAL_FAILED) for t in stage.trials):
        raise TrainingFailed(
            f"every trial of AutoLRS stage {stage.index} failed on its validation loss ("
            + "; ".join(f"lr={t.lr:.4g}: {t.failed}" for t in stage.trials)
            + "): val_fn must return the validation loss as a finite number; check it (and the model in "
            "eval mode), or score trials on training losses (a larger val_tau)")
    if chosen is None:
        stage.lr, stage.kept = min(t.lr for t in stage.trials), None
        log.warning("AutoLRS stage %d: every trial failed; training at the smallest LR tried, %.4g. "
                    "Lower min_lr.", stage.index, stage.lr)
    else:
        stage.lr = stage.trials[chosen].lr
        if stage.kept != chosen:  # its state was overwritten by a trial chosen for a while
            stage.kept = None
