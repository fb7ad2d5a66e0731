"""AutoLRS (Jin et al., ICLR 2021): a learning-rate schedule found by Bayesian optimisation on the fly.

Training is split into *stages* of ``tau`` steps. At the start of a stage the model is
checkpointed; then ``trials`` learning rates are each trained for ``tau' = tau // trial_ratio``
steps from that checkpoint, and each trial is scored by forecasting its loss ``tau`` steps
after the stage start with an exponential ``a*exp(b*t) + c`` fitted to the trial's losses.
Bayesian optimisation over log-LR picks the next LR to try; the best-scoring LR then trains
the stage from the checkpoint. ``tau`` doubles from stage to stage up to ``tau_max``; stages
of ``val_tau`` steps or more score trials on validation losses instead of training losses.

The original's flaws are fixed here: the forecast is unbiased on clean data and does not depend
on the loss scale, a diverged trial or an unbelievable forecast fails the trial, a diverged
stage is rolled back, and a restore always comes with the LR to use next. With a step budget
(``total_steps``) the stages are planned to fit it, the winning trial's progress is kept and
the run ends with an anneal; without ``min_lr``/``max_lr`` a short LR range test sets them
and the first stage trains at its ``max_lr`` without trials.

One module per idea, none importing a framework:

* ``loss_forecast``: the exponential fit and forecast that score a trial,
  and when a forecast fails;
* ``search``: the Gaussian process over log-LR that proposes trials;
* ``settings``: the options, checked in one place (:class:`Settings`);
* ``stages``: stage and trial lengths, with a budget or without, and the records of stages,
  trials, steps;
* ``range_test``: the LR range test that sets the search range when none is given, and
  the ramp of the stage that trains at its ``max_lr``;
* ``trials``: a stage's trials: the search they ask, each scored as it ends, the winner, the
  stage's LR;
* ``divergence``: when the loss has diverged, and when rolling back no longer helps;
* ``controller``: the state machine over them (:class:`Controller`, :class:`Action`);
* ``state``: what the controller's ``state_dict`` holds, checked and read back before a load;
* ``driver``: the step → evaluate → keep/restore/resume loop both
  adapters run (:class:`Driver`), over the small :class:`Training` protocol they implement;
* ``schedule``: the kept schedule as a ``step,lr`` CSV, and its replay.
"""

from aikit.core.autolrs.controller import Action, Controller
from aikit.core.autolrs.divergence import DIVERGE_WINDOW, MAX_ROLLBACKS, PROGRESS, ROLLBACK_FACTOR
from aikit.core.autolrs.driver import DECISION_SIZE, FLAGS, SLOTS, Driver, Training, pack, unpack
from aikit.core.autolrs.loss_forecast import (
    HUBER_K,
    MAX_RATE_PER_SPAN,
    RATE_GRID,
    ROBUST_PASSES,
    failed_forecast,
    fit_exponential,
    forecast,
    standard_error,
)
from aikit.core.autolrs.range_test import (
    RANGE_BELOW_HOT,
    RANGE_DECADES,
    RANGE_END,
    RANGE_SMOOTHING,
    RANGE_START,
    momentum_lag,
    range_tracker,
)
from aikit.core.autolrs.schedule import read_schedule, replay_lr, schedule_lrs, write_schedule
from aikit.core.autolrs.search import DESIGN, LENGTH_SCALES, NOISES, GaussianProcess, LogLRSearch
from aikit.core.autolrs.settings import Settings
from aikit.core.autolrs.stages import Record, Stage, Trial, plan_stages, stage_length

__all__ = [
    "DECISION_SIZE",
    "DESIGN",
    "DIVERGE_WINDOW",
    "FLAGS",
    "HUBER_K",
    "LENGTH_SCALES",
    "MAX_RATE_PER_SPAN",
    "MAX_ROLLBACKS",
    "NOISES",
    "PROGRESS",
    "RANGE_BELOW_HOT",
    "RANGE_DECADES",
    "RANGE_END",
    "RANGE_SMOOTHING",
    "RANGE_START",
    "RATE_GRID",
    "ROBUST_PASSES",
    "ROLLBACK_FACTOR",
    "SLOTS",
    "Action",
    "Controller",
    "Driver",
    "GaussianProcess",
    "LogLRSearch",
    "Record",
    "Settings",
    "Stage",
    "Training",
    "Trial",
    "failed_forecast",
    "fit_exponential",
    "forecast",
    "momentum_lag",
    "pack",
    "plan_stages",
    "range_tracker",
    "read_schedule",
    "replay_lr",
    "schedule_lrs",
    "stage_length",
    "standard_error",
    "unpack",
    "write_schedule",
]
