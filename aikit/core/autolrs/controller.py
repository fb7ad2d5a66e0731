"""The AutoLRS algorithm as a state machine with no framework in it: :class:`Controller`.

An adapter (through :class:`~aikit.core.autolrs.driver.Driver`) feeds it the loss after every
step and does what the returned :class:`Action` says: evaluate, restore the stage checkpoint,
take a new checkpoint, set the LR. The phases: an optional warmup, an optional LR range test
that sets the search range, then stages (trials scored by :mod:`~aikit.core.autolrs.loss_forecast`,
proposed by :mod:`~aikit.core.autolrs.search`, then the chosen LR trains the stage), and with
a budget an anneal. A diverged stage or anneal is rolled back to its checkpoint and retried
lower.
"""

from __future__ import annotations

import copy
import logging
import math
from dataclasses import asdict, astuple, dataclass

import numpy as np

from aikit.core.autolrs.loss_forecast import failed_forecast, forecast, standard_error
from aikit.core.autolrs.search import LogLRSearch
from aikit.core.autolrs.settings import Settings, settings_of_state
from aikit.core.autolrs.stages import Record, Stage, Trial, plan_stages, stage_length
from aikit.core.errors import InvalidState, InvalidValue, TrainingFailed
from aikit.core.lr_range import LossTracker, lr_sequence, suggest

log = logging.getLogger("aikit.autolrs")

RANGE_START, RANGE_END = 1e-6, 10.0  # the default range test's sweep
RANGE_BELOW_HOT = 3.0  # max_lr = (the LR where the range test's loss bottoms out) / 3: that LR is already too hot
RANGE_SMOOTHING = 5.0  # the range test's losses are averaged over about range_steps / this many steps
RANGE_DECADES = 3  # min_lr = max_lr / 10**3
ROLLBACK_FACTOR = 3.0  # a diverged stage is retried at lr / 3 (again and again if needed)
DIVERGE_WINDOW = 5  # losses averaged to call a divergence (a single noisy batch is not one)
PROGRESS = 1.5  # a checkpoint's loss this far below the first loss is progress a divergence can lose
MAX_ROLLBACKS = 8  # rollbacks in a row (LR / 3**8) after which the loss is not the LR's doing: stop
VAL_FAILED = "val_fn"  # how the reason a trial failed on its validation losses begins


def range_tracker(range_steps: int) -> LossTracker:
    """The range test's loss tracker, averaging over a fixed fraction of the test (0.05,
    torch-lr-finder's, at 100 steps), so that a shorter test does not find where its loss
    bottoms out later in its sweep than a longer one."""
    return LossTracker(min(0.5, RANGE_SMOOTHING / range_steps))


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


_STATE = ("min_lr", "max_lr", "tau", "plan", "steps", "phase", "lr", "rollbacks", "range_test", "_in_phase",
          "_evaluating", "_reference", "_anneal_from", "_kept", "_kept_mark", "_segment_start")
_STATE_ADDED = {"_rollbacks_in_row": 0, "_last_val_error": ""}  # state added later: the value a state saved
# before it had


class Controller:
    """The AutoLRS algorithm, driven step by step: :meth:`begin`, then :meth:`step` after every
    step (and :meth:`validation` when an action asks to evaluate). ``min_lr``, ``max_lr`` and
    the keyword ``options`` are :class:`~aikit.core.autolrs.settings.Settings`' (checked there);
    ``settings`` holds them.

    ``min_lr``, ``max_lr`` and ``tau`` start as given and are set when the run finds them (a
    range test, a budget's plan); ``stages``, ``history``, ``plan`` and ``schedule()`` show what
    the search did.
    """

    def __init__(self, min_lr: float | None = None, max_lr: float | None = None, **options):
        self.settings = Settings(min_lr, max_lr, **options)
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
        self._range_lrs = lr_sequence(RANGE_START, RANGE_END, self.settings.range_steps)  # a range test's LRs
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
            raise InvalidState("validation() answers an evaluate action; none is pending")
        self._evaluating = False
        trial = self.stage.trials[-1]
        trial.steps.append(self._in_phase)
        trial.losses.append(float(loss))
        if not math.isfinite(loss):
            trial.failed = f"{VAL_FAILED} returned {loss}"
            return self._end_trial()
        if self._in_phase == self.stage.trial_steps:
            return self._end_trial()
        return self._set(self.lr)

    def validation_failed(self, reason: str) -> Action:
        """Say that the evaluation an ``evaluate`` action asked for could not be made (``val_fn``
        raised, or gave no number: ``reason``); the trial goes on without that point, and fails
        if fewer than 3 of its evaluations are left for the forecast."""
        if not self._evaluating:
            raise InvalidState("validation_failed() answers an evaluate action; none is pending")
        self._evaluating = False
        trial = self.stage.trials[-1]
        trial.missed += 1
        self._last_val_error = reason
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
        state = {name: copy.deepcopy(getattr(self, name)) for name in (*_STATE, *_STATE_ADDED)}
        state["options"] = dict(self.settings.given)
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
            raise InvalidValue(f"not an AutoLRS state: keys {sorted(missing)} are missing")
        if not isinstance(state["options"], dict):
            raise InvalidValue(f"not an AutoLRS state: its options are a {type(state['options']).__name__}")
        then, now = settings_of_state(state["options"]).resolved(), self.settings.resolved()
        differ = {k: (then[k], v) for k, v in now.items() if then[k] != v}
        if differ:  # compared as resolved: a default that changed between releases is a difference too
            raise InvalidValue("the AutoLRS state was saved with other options: "
                               + "; ".join(f"{k} {a!r} saved, {b!r} here" for k, (a, b) in differ.items())
                               + "; build the AutoLRS with the options it was saved with ("
                               + ", ".join(f"{k}={a!r}" for k, (a, _) in differ.items()) + ")")
        rng = np.random.default_rng()
        rng.bit_generator.state = state["rng"]
        stages = [Stage(**{**s, "trials": [Trial(**t) for t in s["trials"]]}) for s in state["stages"]]
        history = [Record(*r) for r in state["history"]]
        search = tracker = None
        if state["search"] is not None:
            search = LogLRSearch(state["min_lr"], state["max_lr"], self.settings.kappa, rng,
                                 first=state["search"]["first"], design=self.settings.design)
            search.x, search.scores = list(state["search"]["x"]), list(state["search"]["scores"])
        if state["tracker"] is not None:
            tracker = range_tracker(self.settings.range_steps)
            tracker.best, tracker.last, tracker.stop_reason = (state["tracker"][k] for k in ("best", "last",
                                                                                             "stop_reason"))
        for name in _STATE:
            setattr(self, name, copy.deepcopy(state[name]))
        for name, before in _STATE_ADDED.items():
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
                self._reference = self._recent_loss(trial.start_step, trial.start_step + self.stage.trial_steps)
            elif not flags.get("restore"):  # (a restore, then a checkpoint of that same state: as before)
                self._reference = self._recent_loss(0, self.steps)
            self._kept_mark = len(self._kept)
            self._rollbacks_in_row = 0
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
        return mean > self.settings.diverge * self._reference or self._stalled(first, mean)

    def _stalled(self, first: float, mean: float) -> bool:
        """Stage 0 after a range test has not made a quarter of the range test's drop of the
        loss by ``2 * DIVERGE_WINDOW`` steps after its ramp: the range test's LR killed the net
        (a dead ReLU net sits at its first loss, which no blow-up rule sees)."""
        if not self._exploits(self.stage.index) or self.phase != "train" or self.rollbacks:
            return False  # once a run: a net that is slow to leave its first loss is not rolled back for ever
        if self.steps - self._segment_start != self.settings.ramp_steps + 2 * DIVERGE_WINDOW:
            return False
        lowest = min(self.range_test["loss"])
        return math.isfinite(first) and mean > first - (first - lowest) / 4

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
        lrs, losses = self.range_test["lr"], self.range_test["loss"]
        if not math.isfinite(losses[-1]):
            lrs, losses = lrs[:-1], losses[:-1]
        if len(losses) < 2:
            raise TrainingFailed(
                f"the LR range test stopped at its first LRs {self.range_test['lr']} with losses "
                f"{self.range_test['loss']}: a loss that is not finite at an LR of {RANGE_START:g} comes from the "
                "model, the data or the loss function, not the LR; check them (or give min_lr and max_lr)")
        hot = suggest(lrs, losses, method="bottom").lr  # where the loss bottoms out
        self.max_lr = hot / RANGE_BELOW_HOT
        self.min_lr = self.max_lr / 10**RANGE_DECADES
        log.info("AutoLRS: range test over %d steps (%s): the loss bottoms out at lr=%.4g; searching min_lr=%.4g to "
                 "max_lr=%.4g", len(self.range_test["lr"]), self._tracker.stop_reason or "completed",
                 hot, self.min_lr, self.max_lr)
        return self._start_stage(restore=True)

    def _stage_cost(self, index: int, tau: int) -> int:
        if self._exploits(index):
            return tau
        trial_steps = self._trial_steps(tau)[0]
        return self.settings.trials * trial_steps + tau - (trial_steps if self.settings.keep_winner else 0)

    def _exploits(self, index: int) -> bool:
        """With ``exploit``, stage 0 after a range test trains at ``max_lr`` without trials: the
        range test was its search, and trials that start from an untrained net barely move it."""
        return index == 0 and self.settings.exploit and bool(self.range_test["lr"])

    def _trial_steps(self, tau: int) -> tuple[int, int | None]:
        trial_steps = max(3, tau // self.settings.trial_ratio)
        if tau < (self.settings.val_tau or self.settings.tau_max or math.inf):
            return trial_steps, None
        val_every = max(1, trial_steps // self.settings.val_points)
        return val_every * min(self.settings.val_points, trial_steps), val_every

    def _make_plan(self) -> None:
        """With a budget: the stage lengths that fill it (after warmup and range test, before
        the anneal)."""
        settings = self.settings
        steps = settings.total_steps - self.steps - self.anneal_steps
        if self.tau is None:  # stages of tau, 2 tau, 4 tau...: cost ~ (1 + 2 + 4) tau * per-step cost
            per_tau = sum(self._stage_cost(i, 10**6 * settings.growth**i) for i in range(settings.stages)) / 10**6
            self.tau = max(3 * settings.trial_ratio, int(steps / per_tau))
        lengths, left = plan_stages(steps, self.tau, settings.tau_max or 10**12, settings.growth, self._stage_cost)
        # [tau, trial steps, val_every] per stage; the last stage trains on for what is left
        self.plan = [[tau, *self._trial_steps(tau)] for tau in lengths]
        if self.plan:
            self.plan[-1][0] += left
        if not self.plan:
            raise InvalidValue(f"total_steps={settings.total_steps} leaves {steps} steps for the search after warmup, "
                               f"range test and anneal, less than one stage of tau={self.tau} "
                               f"({self._stage_cost(0, self.tau)} steps): raise total_steps or lower tau or trials")
        log.info("AutoLRS plan for %d steps: stages of %s steps, then %d annealing steps",
                 settings.total_steps, [tau for tau, _, _ in self.plan], self.anneal_steps)

    def _start_stage(self, checkpoint: bool = False, restore: bool = False) -> Action:
        if self.settings.total_steps is not None and self.plan is None:
            self._make_plan()
        index = len(self.stages)
        if self.plan is not None and index >= len(self.plan):
            return self._start_anneal()
        if self.plan is not None:
            tau, trial_steps, val_every = self.plan[index]
        else:
            tau = stage_length(index, self.tau, self.settings.tau_max or 8000, self.settings.growth)
            trial_steps, val_every = self._trial_steps(tau)
        self.stages.append(Stage(index, self.steps, tau, trial_steps, val_every))
        if self._exploits(index):
            self.stage.lr, self.phase, self._in_phase = self.max_lr, "train", 0
            log.info("AutoLRS stage 0 at step %d: %d steps at the range test's max_lr=%.4g, without trials",
                     self.steps, tau, self.stage.lr)
            action = self._set(self._ramped(self.stage.lr, 0), checkpoint=True, restore=restore)
            start = self.steps - len(self.range_test["lr"])  # the checkpoint's loss: the test's first losses
            self._reference = self._recent_loss(start, start + DIVERGE_WINDOW)
            return action
        previous = self.stages[-2].lr if index > 0 and self.settings.warm_start else None
        self._search = LogLRSearch(self.min_lr, self.max_lr, self.settings.kappa, self.rng, first=previous,
                                   design=self.settings.design)
        log.info("AutoLRS stage %d at step %d: tau=%d, %d trials of %d steps scored on %s losses",
                 index, self.steps, tau, self.settings.trials, trial_steps,
                 "training" if val_every is None else "validation")
        self.phase, self._in_phase = "trial", 0
        self.stage.trials.append(Trial(self._search.ask(), self.steps))
        return self._set(self.stage.trials[-1].lr, checkpoint=True, restore=restore)

    def _start_trial(self, keep_trial: bool) -> Action:
        self.phase, self._in_phase = "trial", 0
        self.stage.trials.append(Trial(self._search.ask(), self.steps))
        return self._set(self.stage.trials[-1].lr, restore=True, keep_trial=keep_trial)

    def _end_trial(self) -> Action:
        stage, trial = self.stage, self.stage.trials[-1]
        if not trial.failed and len(trial.losses) < 3:  # validations skipped: too few left to forecast
            trial.failed = (f"{VAL_FAILED} failed at {trial.missed} of its {trial.missed + len(trial.losses)} "
                            f"evaluations (last: {self._last_val_error})")
        if not trial.failed:
            trial.score = forecast(trial.steps, trial.losses, at=stage.tau)
            trial.failed = failed_forecast(trial.losses, trial.score)
        self._search.tell(trial.lr, math.inf if trial.failed else trial.score)
        log.info("AutoLRS stage %d trial %d/%d: lr=%.4g, last loss=%.4g, forecast at step %d: %.4g%s",
                 stage.index, len(stage.trials), self.settings.trials, trial.lr, (trial.losses or [math.nan])[-1],
                 stage.tau, trial.score,
                 f" (failed: {trial.failed})" if trial.failed else "")
        chosen = self._choice(stage)
        keep = self.settings.keep_winner and chosen == len(stage.trials) - 1  # the choice so far: keep its state
        if keep:
            stage.kept = chosen
        if len(stage.trials) < self.settings.trials:
            return self._start_trial(keep_trial=keep)
        self.phase = "train"
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
        margin = self.settings.tie * standard_error(stage.trials[best].losses)
        return max((i for i in good if stage.trials[i].score <= stage.trials[best].score + margin),
                   key=lambda i: stage.trials[i].lr)

    def _train_step(self) -> Action:
        if self._diverged():
            self.rollbacks += 1
            self._rollbacks_in_row += 1
            if self._rollbacks_in_row > MAX_ROLLBACKS:
                raise TrainingFailed(self._hopeless())
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
        """``lr``, or less in the first ``ramp_steps`` steps of stage 0 after a range test
        (``since`` its start or rollback): a linear warmup from the untrained net to the range
        test's LR, which trains an untrained net too hard at once."""
        ramp = self.settings.ramp_steps
        if self._exploits(self.stage.index) and since < ramp:
            return lr * (since + 1) / (ramp + 1)
        return lr

    def _hopeless(self) -> str:
        """Why the run stops after :data:`MAX_ROLLBACKS` rollbacks in a row."""
        recent = [r.loss for r in self.history[-DIVERGE_WINDOW:]]
        highest = self.lr * ROLLBACK_FACTOR ** (self._rollbacks_in_row - 1)
        finite = any(math.isfinite(r.loss) for r in self.history)
        cause = ("no step has had a finite loss: that comes from the model, the data or the loss function, not the "
                 "LR; check them" if not finite else
                 "the loss blows up however low the LR: check the model, the data and the loss (or give a lower "
                 "min_lr and max_lr)")
        return (f"AutoLRS rolled back {MAX_ROLLBACKS} times in a row to the checkpoint before step {self.steps} "
                f"(lowering the LR from {highest:.4g} to {self.lr:.4g}), and the loss still diverged (last losses "
                f"{[round(x, 6) for x in recent]}): {cause}")

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


