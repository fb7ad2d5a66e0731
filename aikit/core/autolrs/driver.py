"""The one loop both AutoLRS adapters run around the :class:`~aikit.core.autolrs.Controller`:
after each step, the chief decides, every replica follows, evaluates when asked, and keeps,
restores or resumes its training state in one fixed order before the next LR is set.

The adapters (the torch hook, the Keras callback) implement :class:`Training` with their
framework's tensors and collectives and keep nothing else: where the loss comes from, what a
snapshot holds, how the chief's numbers reach the other replicas. The order of the steps, what
the decision carries (:data:`FLAGS`) and the state a preempted search resumes from live here.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any, Protocol

from aikit.core.autolrs.controller import Action, Controller
from aikit.core.errors import AikitError, TrainingFailed
from aikit.core.validate import one_number

log = logging.getLogger("aikit.autolrs")

FLAGS = tuple(f.name for f in fields(Action) if f.name != "lr")  # an Action's flags, in its field order
DECISION_SIZE = 3 + len(FLAGS)  # numbers a decision travels as: lr, kept, the flags and the refusal
# The refusal travelling with a decision, so that every replica raises where the chief did (a chief
# raising alone would leave the others waiting in the next collective):
GO_ON, REFUSED_AFTER, STOPPED = 0, 1, 2  # go on; apply the decision, then raise; raise, nothing to apply
SLOTS = ("stage", "trial")  # the stage checkpoint and the kept trial's state


class Training(Protocol):
    """What an adapter does for the :class:`Driver`, with its framework's tensors and collectives."""

    def snapshot(self) -> Any:
        """A copy of everything a restore must bring back: weights, optimizer state, RNG streams."""

    def restore(self, snapshot: Any) -> None:
        """Load a :meth:`snapshot` (it stays valid: a stage checkpoint is restored once per trial)."""

    def set_lr(self, lr: float) -> None:
        """Make ``lr`` the LR of the next step (called after any restore, so it is in force)."""

    def validation_loss(self) -> float:
        """The user's ``val_fn()`` (a number, or a tensor holding one), on every replica (it may
        reduce across them); the chief's value counts."""

    def agree(self, decide: Callable[[], Sequence[float]]) -> Sequence[float]:
        """``decide()``'s numbers on every replica, ``decide`` run by the chief alone (on one
        replica: ``decide()`` as it is). The one collective of a decision."""


def pack(action: Action, kept: bool) -> list:
    """A decision as the numbers :meth:`Training.agree` sends: ``[lr, kept, *FLAGS]``."""
    return [action.lr, kept, *(getattr(action, flag) for flag in FLAGS)]


def unpack(numbers: Sequence[float]) -> tuple[Action, bool]:
    """The decision :func:`pack` made, from the numbers every replica received."""
    lr, kept, *flags = numbers
    return Action(lr, **{flag: bool(value) for flag, value in zip(FLAGS, flags, strict=True)}), bool(kept)


class Driver:
    """Runs the :class:`Controller` for one :class:`Training`: :meth:`begin` before the first
    step, :meth:`step` after every step. ``action`` is the latest decision, ``kept`` whether the
    model now in memory is on the run AutoLRS keeps (not a trial or range test it will undo).
    With ``summary_steps``, checkpoint and restore decisions at steps that are a multiple of it
    are logged (the original AutoLRS's option).

    ``val_fn`` runs here and only here (:meth:`step`): one that raises is logged and that
    evaluation skipped (the trial goes on without it), so the search stays usable; one that
    returns no number is refused by name once the step is done. An error the controller raises
    on the chief (a budget too short, a loss that never turns finite) reaches every replica with
    the decision, and each raises it (the others as :class:`TrainingFailed` pointing at the chief).
    """

    def __init__(self, controller: Controller, training: Training, summary_steps: int | None = None):
        self.controller, self.training, self.summary_steps = controller, training, summary_steps
        self.action: Action | None = None
        self.kept = True
        self.slots: dict[str, Any] = dict.fromkeys(SLOTS)
        self._refusal: Exception | None = None  # the chief's error, raised once every replica knows

    def begin(self, current_lr: float, *, alone: bool = False) -> None:
        """The first decision, before the first step (``current_lr``: the optimizer's own, which
        the original AutoLRS's warmup keeps). ``alone``: every replica decides for itself, with
        no collective (a constructor's choice; the controller decides alike from alike options,
        and the adapter checks the replicas agreed at the first step)."""
        decide = lambda: self.controller.begin(current_lr)  # noqa: E731
        self._follow(self._decided(decide) if alone else self.training.agree(lambda: self._decided(decide)))

    def step(self, loss: float) -> None:
        """Report the loss of the step just taken (the same number on every replica); evaluate
        if the controller asks, then keep, restore or resume and set the next LR."""
        numbers = self.training.agree(lambda: self._decided(lambda: self.controller.step(loss)))
        if numbers[-1] == GO_ON and unpack(numbers[:-1])[0].evaluate:
            outcome = self._validation_loss()
            numbers = self.training.agree(lambda: self._decided(lambda: self._report(outcome)))
        self._follow(numbers)

    def _validation_loss(self) -> float | Exception:
        """The one place ``val_fn`` runs: every replica calls it, the chief's value decides. What
        it raised is returned, to be logged and skipped by the chief (every replica goes on alike)."""
        try:
            return self.training.validation_loss()
        except Exception as error:  # the user's function: any error, logged with its traceback
            return error

    def _report(self, outcome: Any) -> Action:
        """The chief tells the controller what ``val_fn`` gave: a number, or that this evaluation
        failed (skipped; a value that is no number is refused too, after the step is done)."""
        if isinstance(outcome, Exception):
            log.warning("AutoLRS: val_fn raised %s at step %d; that evaluation is skipped and the trial goes on",
                        _describe(outcome), self.controller.steps, exc_info=outcome)
            return self.controller.validation_failed(_describe(outcome))
        try:
            value = one_number(outcome, "val_fn", "the validation loss as one number")
        except AikitError as error:
            action = self.controller.validation_failed(str(error))
            self._refusal = error
            return action
        return self.controller.validation(value)

    def _decided(self, decide: Callable[[], Action]) -> list:
        """``decide()``'s action as the numbers :meth:`Training.agree` sends, with the refusal:
        an error ``decide`` raised becomes :data:`STOPPED` (kept to raise once every replica knows)."""
        try:
            action = decide()
        except AikitError as error:
            self._refusal = error
            return [math.nan] * (DECISION_SIZE - 1) + [STOPPED]
        refusal = GO_ON if self._refusal is None else REFUSED_AFTER
        return [*pack(action, self.controller.kept), refusal]  # kept: after the decision, as the model will be

    def _follow(self, numbers: Sequence[float]) -> None:
        """Apply the agreed decision and raise the chief's refusal, if any, on every replica."""
        refusal = numbers[-1]
        if refusal != STOPPED:
            self._apply(*unpack(numbers[:-1]))
        if refusal != GO_ON:
            error, self._refusal = self._refusal, None
            raise error if error is not None else TrainingFailed(
                "AutoLRS raised an error on the chief (rank 0, worker 0), whose message says why; every replica "
                "raises with it")

    def _apply(self, action: Action, kept: bool) -> None:
        """Do what the decision says, in :class:`Action`'s order; the LR last, after any restore."""
        self.action, self.kept = action, kept
        if self.summary_steps and self.controller.steps % self.summary_steps == 0:
            done = [flag for flag in ("keep_trial", "restore", "resume_trial", "checkpoint") if getattr(action, flag)]
            if done:
                log.info("[AutoLRS at %d] %s; lr=%.4g", self.controller.steps, ", ".join(done), action.lr)
        if action.keep_trial:
            self.slots["trial"] = self.training.snapshot()
        if action.restore:
            self.training.restore(self.slots["stage"])
        if action.resume_trial:
            self.training.restore(self.slots["trial"])
        if action.checkpoint:
            self.slots["stage"] = self.training.snapshot()
        self.training.set_lr(action.lr)

    def state_dict(self) -> dict:
        """The search's state (the controller's, plain data), the latest decision and the
        snapshots in their slots, as the adapter took them (it makes them portable)."""
        return {"controller": self.controller.state_dict(), "kept": self.kept,
                "action": None if self.action is None else vars(self.action).copy(), "slots": dict(self.slots)}

    def load_state_dict(self, state: dict) -> None:
        """Resume from :meth:`state_dict`'s result; nothing is set on the training state (the
        saved model already is where the search was). A state that does not fit changes nothing.
        A state without ``kept`` (saved by the torch hook before it had one) keeps the current."""
        action = Action(**state["action"]) if state["action"] is not None else None
        slots = {slot: state["slots"][slot] for slot in SLOTS}
        kept = bool(state["kept"]) if "kept" in state else self.kept
        self.controller.load_state_dict(state["controller"])  # validates; raises before any change
        self.slots, self.action, self.kept = slots, action, kept


def _describe(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"
