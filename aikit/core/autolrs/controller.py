"""The AutoLRS algorithm as a state machine with no framework in it: :class:`Controller`.

An adapter (through :class:`~aikit.core.autolrs.driver.Driver`) feeds it the loss after every
step and does what the returned :class:`Action` says: evaluate, restore the stage checkpoint,
take a new checkpoint, set the LR. The phases: an optional warmup, an optional LR range test
that sets the search range (:mod:`~aikit.core.autolrs.range_test`), then stages (their lengths:
:mod:`~aikit.core.autolrs.stages`; trials proposed by :mod:`~aikit.core.autolrs.search`, scored
by :mod:`~aikit.core.autolrs.loss_forecast`, the winner training the stage:
:mod:`~aikit.core.autolrs.trials`), and with a budget an anneal. A diverged stage or anneal is
rolled back to its checkpoint and retried lower (:mod:`~aikit.core.autolrs.divergence`). What
its ``state_dict`` holds: :mod:`~aikit.core.autolrs.state`.
"""
from __future__ import annotations

import copy
import logging
import math
from dataclasses import asdict, astuple, dataclass

import numpy as np

from aikit.core.autolrs.divergence import (
    DIVERGE_WINDOW,
    MAX_ROLLBACKS,
    ROLLBACK_FACTOR,
    diverged,
    hopeless,
    recent_loss,
)
from aikit.core.autolrs.range_test import (
    RANGE_END,
    RANGE_START,
    ramped,
    range_lrs,
    range_tracker,
    search_range,
    tracker_state,
)
from aikit.core.autolrs.search import LogLRSearch
from aikit.core.autolrs.settings import Settings
from aikit.core.autolrs.stages import (
    Record,
    Stage,
    Trial,
    budget_plan,
    exploits,
    stage_length,
    trial_length,
)
from aikit.core.autolrs.state import STATE, STATE_ADDED, restored, search_state
from aikit.core.autolrs.trials import VAL_FAILED, end_trial, settle, stage_search
from aikit.core.errors import InvalidState, TrainingFailed

log = logging.getLogger("aikit.autolrs")


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


class Controller:
    """The AutoLRS algorithm, driven step by step: :meth:`begin`, then :meth:`step` after every
    step (and :meth:`validation` when an action asks to evaluate). ``min_lr``, ``max_lr`` and
    the keyword ``options`` are :class:`~aikit.core.autolrs.settings.Settings`' (checked there);
    ``settings`` holds them.

    ``min_lr``, ``max_lr`` and ``tau`` start as given and are set when the run finds them (a
    range test, a budget's plan); ``stages``, ``history``, ``plan`` and ``schedule()`` show what
    the search did. ``momentum`` is the optimizer's heavy-ball momentum, which the adapter reads
    and a range test's ``max_lr`` accounts for (:func:`~aikit.core.autolrs.range_test.momentum_lag`;
    0: none, or Adam's).
    """

    def __init__(self, min_lr: float | None = None, max_lr: float | None = None, **options):
        self.settings = Settings(min_lr, max_lr, **options)
        self.momentum = 0.0  # the optimizer's heavy-ball momentum, set by the adapter (not an option)
        self.min_lr, self.max_lr, self.tau = self.settings.min_lr, self.settings.max_lr, self.settings.tau
        self.rng = np.random.default_rng(self.settings.seed)
        self.stages: list[Stage] = []
        self.history: list[Record] = []
        self.range_test: dict[str, list[float]] = {"lr": [], "loss": []}
        self.plan: list[list] | None = None  # [tau, trial steps, val_every] per stage (with a budget)
        self.steps = 0  # steps taken, search included
        self.phase = "idle"
        self.lr = math.nan
        self.rollbacks = 0
        self._rollbacks_in_row = 0  # since the latest checkpoint
        self._in_phase = 0
        self._evaluating = False
        self._reference = math.inf  # the loss at the latest checkpoint (for divergence)
        self._anneal_from = math.nan
        self._search: LogLRSearch | None = None
        self._range_lrs = range_lrs(self.settings.range_steps)
        self._kept: list[float] = []  # the LR of every step on the kept trajectory
        self._kept_mark = 0  # len(_kept) at the latest checkpoint
        self._segment_start = 0  # the step of the latest checkpoint or restore
        self._last_val_error = ""  # why val_fn failed last (for the message of a trial that failed on it)

    # -- the protocol ----------------------------------------------------------------------

    @property
    def kept(self) -> bool:
        """Whether the model now trained is the one the run keeps (not a trial or range test)."""
        return self.phase not in ("trial", "range")

    @property
    def anneal_steps(self) -> int:
        return self.settings.anneal_steps

    def begin(self, current_lr: float | None = None) -> Action:
        """The first action, before any step. ``current_lr``: the optimizer's own LR, which
        the first warmup step keeps (as in the original AutoLRS)."""
        if self.phase != "idle":
            raise InvalidState("Controller.begin() was already called")
        warmup_steps, warmup_lr = self.settings.warmup_steps, self.settings.warmup_lr
        if warmup_steps:
            self.phase = "warmup"
            return self._set(warmup_lr / warmup_steps if current_lr is None else float(current_lr))
        return self._after_warmup()

    def step(self, loss: float) -> Action:
        """Report the training loss of the step just taken; returns what to do next."""
        if self.phase == "idle":
            raise InvalidState("call Controller.begin() before the first step")
        if self._evaluating:
            raise InvalidState("an evaluate action is pending: report the validation loss with validation() first")
        loss = float(loss)
        self.steps += 1
        self._in_phase += 1
        self.history.append(Record(self.steps, self.lr, loss, self.phase))
        if self.kept:
            self._kept.append(self.lr)
        if self.phase == "warmup":
            if self._in_phase <= self.settings.warmup_steps:
                return self._set(self.settings.warmup_lr * self._in_phase / self.settings.warmup_steps)
            return self._after_warmup()
        if self.phase == "range":
            return self._range_step(loss)
        if self.phase in ("train", "anneal"):
            return self._train_step()
        if self.phase == "done":
            return self._set(self.lr)
        return self._trial_step(loss)

    def _trial_step(self, loss: float) -> Action:
        trial = self.stage.trials[-1]
        if self.stage.val_every is None or not math.isfinite(loss):
            trial.steps.append(self._in_phase)
            trial.losses.append(loss)
        if self._diverged():
            trial.failed = "diverged"
            return self._end_trial()
        if self.stage.val_every is None:
            return self._trial_step_done()
        if self._in_phase % self.stage.val_every == 0:
            self._evaluating = True
            return Action(self.lr, evaluate=True)
        return self._set(self.lr)

    def validation(self, loss: float) -> Action:
        """Report the validation loss asked for by an ``evaluate`` action."""
        trial = self._evaluated("validation()")
        trial.steps.append(self._in_phase)
        trial.losses.append(float(loss))
        if not math.isfinite(loss):
            trial.failed = f"{VAL_FAILED} returned {loss}"
            return self._end_trial()
        return self._trial_step_done()

    def validation_failed(self, reason: str) -> Action:
        """Say that the evaluation an ``evaluate`` action asked for could not be made (``val_fn``
        raised, or gave no number: ``reason``); the trial goes on without that point, and fails
        if fewer than 3 of its evaluations are left for the forecast."""
        trial = self._evaluated("validation_failed()")
        trial.missed += 1
        self._last_val_error = reason
        return self._trial_step_done()

    def _evaluated(self, answer: str) -> Trial:
        """The trial an ``evaluate`` action asked about, which ``answer`` now answers."""
        if not self._evaluating:
            raise InvalidState(f"{answer} answers an evaluate action; none is pending")
        self._evaluating = False
        return self.stage.trials[-1]

    def _trial_step_done(self) -> Action:
        """The trial ends at its last step; else it goes on at its LR."""
        return self._end_trial() if self._in_phase == self.stage.trial_steps else self._set(self.lr)

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
        state = {name: copy.deepcopy(getattr(self, name)) for name in (*STATE, *STATE_ADDED)}
        return {**state, "options": dict(self.settings.given), "rng": copy.deepcopy(self.rng.bit_generator.state),
                "stages": [asdict(stage) for stage in self.stages],
                "history": [astuple(record) for record in self.history], "search": search_state(self._search),
                "tracker": None if self.phase != "range" else tracker_state(self._tracker)}

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict`'s result. The controller must be built with the same
        options; a state that does not fit is refused and changes nothing."""
        rng, stages, history, search, tracker = restored(state, self.settings)  # checked: nothing changed yet
        for name in STATE:
            setattr(self, name, copy.deepcopy(state[name]))
        for name, before in STATE_ADDED.items():
            setattr(self, name, copy.deepcopy(state.get(name, before)))
        self.rng, self.stages, self.history, self._search = rng, stages, history, search
        if tracker is not None:
            self._tracker = tracker

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
                self._reference = recent_loss(self.history, trial.start_step, trial.start_step + self.stage.trial_steps)
            elif not flags.get("restore"):  # (a restore, then a checkpoint of that same state: as before)
                self._reference = recent_loss(self.history, 0, self.steps)
            self._kept_mark = len(self._kept)
            self._rollbacks_in_row = 0
        return Action(lr, **flags)

    def _diverged(self) -> bool:
        """:func:`~aikit.core.autolrs.divergence.diverged` since the latest checkpoint or restore;
        stage 0 after a range test is checked for a stall ``2 * DIVERGE_WINDOW`` steps after its
        ramp, once a run (a net that is slow to leave its first loss is not rolled back for ever)."""
        stall_due = (self._exploits(self.stage.index) and self.phase == "train" and not self.rollbacks
                     and self.steps - self._segment_start == self.settings.ramp_steps + 2 * DIVERGE_WINDOW)
        return diverged(self.history, self._segment_start, self._reference, self.settings.diverge,
                        min(self.range_test["loss"]) if stall_due else None)

    def _after_warmup(self) -> Action:
        if self.min_lr is not None:
            return self._start_stage(checkpoint=True)
        self.phase, self._in_phase = "range", 0
        self._tracker = range_tracker(self.settings.range_steps)
        log.info("AutoLRS: no min_lr/max_lr given; running an LR range test of %d steps (%.0e to %.0e) to set them",
                 self.settings.range_steps, RANGE_START, RANGE_END)
        return self._set(self._range_lrs[0], checkpoint=True)

    def _range_step(self, loss: float) -> Action:
        self.range_test["lr"].append(self.lr)
        self.range_test["loss"].append(self._tracker.update(loss))
        if self._tracker.stop_reason is None and self._in_phase < self.settings.range_steps:
            return self._set(self._range_lrs[self._in_phase])
        self.min_lr, self.max_lr = search_range(self.range_test, self._tracker.stop_reason, self.momentum)
        return self._start_stage(restore=True)

    def _exploits(self, index: int) -> bool:
        return exploits(index, self.settings, ranged=bool(self.range_test["lr"]))

    def _start_stage(self, checkpoint: bool = False, restore: bool = False) -> Action:
        if self.settings.total_steps is not None and self.plan is None:  # with a budget: the stages that fill it
            steps = self.settings.total_steps - self.steps - self.anneal_steps
            self.tau, self.plan = budget_plan(steps, self.tau, self.settings, ranged=bool(self.range_test["lr"]))
        index = len(self.stages)
        if self.plan is not None and index >= len(self.plan):
            return self._start_anneal()
        if self.plan is not None:
            tau, trial_steps, val_every = self.plan[index]
        else:
            tau = stage_length(index, self.tau, self.settings.tau_max or 8000, self.settings.growth)
            trial_steps, val_every = trial_length(tau, self.settings)
        self.stages.append(Stage(index, self.steps, tau, trial_steps, val_every))
        if self._exploits(index):
            self.stage.lr, self.phase, self._in_phase = self.max_lr, "train", 0
            log.info("AutoLRS stage 0 at step %d: %d steps at the range test's max_lr=%.4g, without trials",
                     self.steps, tau, self.stage.lr)
            action = self._set(self._ramped(self.stage.lr, 0), checkpoint=True, restore=restore)
            start = self.steps - len(self.range_test["lr"])  # the checkpoint's loss: the test's first losses
            self._reference = recent_loss(self.history, start, start + DIVERGE_WINDOW)
            return action
        self._search = stage_search(self.stages, self.settings, self.min_lr, self.max_lr, self.rng)
        return self._start_trial(checkpoint=True, restore=restore)

    def _start_trial(self, **flags: bool) -> Action:
        self.phase, self._in_phase = "trial", 0
        self.stage.trials.append(Trial(self._search.ask(), self.steps))
        return self._set(self.stage.trials[-1].lr, **flags)

    def _end_trial(self) -> Action:
        stage = self.stage
        chosen = end_trial(stage, self._search, self.settings, self._last_val_error)
        keep = self.settings.keep_winner and chosen == len(stage.trials) - 1  # the choice so far: keep its state
        if keep:
            stage.kept = chosen
        if len(stage.trials) < self.settings.trials:
            return self._start_trial(restore=True, keep_trial=keep)
        self.phase = "train"
        settle(stage, chosen)
        if stage.kept is not None:  # the winner's steps are the stage's first steps
            self._in_phase = stage.trial_steps
            self._kept.extend([stage.lr] * stage.trial_steps)
            log.info("AutoLRS stage %d: chose lr=%.4g; continuing the winning trial for %d more steps",
                     stage.index, stage.lr, stage.tau - self._in_phase)
            return self._set(stage.lr, keep_trial=keep, resume_trial=True, checkpoint=True)
        self._in_phase = 0
        log.info("AutoLRS stage %d: chose lr=%.4g for %d steps", stage.index, stage.lr, stage.tau)
        return self._set(stage.lr, restore=True)

    def _train_step(self) -> Action:
        if self._diverged():
            self.rollbacks += 1
            self._rollbacks_in_row += 1
            if self._rollbacks_in_row > MAX_ROLLBACKS:
                raise TrainingFailed(hopeless(self.history, self.lr, self._rollbacks_in_row, self.steps))
            lowered = (self._anneal_from if self.phase == "anneal" else self.stage.lr) / ROLLBACK_FACTOR
            if self.phase == "anneal":
                self._anneal_from = lowered
            else:
                self.stage.lr = lowered
            log.warning("AutoLRS: the loss diverged at step %d (lr=%.4g); rolled back to the %s's checkpoint "
                        "and retrying at lr=%.4g", self.steps, self.lr, "anneal" if self.phase == "anneal"
                        else "stage", lowered)
            return self._set(self._ramped(lowered, 0) if self.phase == "train" else self._anneal_lr(), restore=True)
        if self.phase == "anneal":
            if self._in_phase >= self.anneal_steps:
                self.phase = "done"
                log.info("AutoLRS: the %d-step budget is spent; the LR stays at %.4g", self.settings.total_steps, 0.0)
                return self._set(0.0)
            return self._set(self._anneal_lr())
        if self._in_phase >= self.stage.tau:
            return self._start_stage(checkpoint=True)
        return self._set(self._ramped(self.stage.lr, self.steps - self._segment_start))

    def _ramped(self, lr: float, since: int) -> float:
        """``lr``, ramped up to in stage 0 after a range test (``since`` its start or rollback)."""
        return ramped(lr, since, self.settings.ramp_steps) if self._exploits(self.stage.index) else lr

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


