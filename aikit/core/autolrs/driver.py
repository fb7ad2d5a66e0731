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
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any, Protocol

from aikit.core.autolrs.controller import Action, Controller

log = logging.getLogger("aikit.autolrs")

FLAGS = tuple(f.name for f in fields(Action) if f.name != "lr")  # an Action's flags, in its field order
DECISION_SIZE = 2 + len(FLAGS)  # numbers in a packed decision: lr, kept and the flags
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
        """The user's ``val_fn()`` (anything ``float()`` takes), on every replica (it may reduce
        across them); the chief's value counts."""

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
    are logged (the original AutoLRS's option)."""

    def __init__(self, controller: Controller, training: Training, summary_steps: int | None = None):
        self.controller, self.training, self.summary_steps = controller, training, summary_steps
        self.action: Action | None = None
        self.kept = True
        self.slots: dict[str, Any] = dict.fromkeys(SLOTS)

    def begin(self, current_lr: float, *, alone: bool = False) -> None:
        """The first decision, before the first step (``current_lr``: the optimizer's own, which
        the original AutoLRS's warmup keeps). ``alone``: every replica decides for itself, with
        no collective (a constructor's choice; the controller decides alike from alike options,
        and the adapter checks the replicas agreed at the first step)."""
        if alone:
            self._apply(*unpack(self._decided(lambda: self.controller.begin(current_lr))))
        else:
            self._apply(*self._agreed(lambda: self.controller.begin(current_lr)))

    def step(self, loss: float) -> None:
        """Report the loss of the step just taken (the same number on every replica); evaluate
        if the controller asks, then keep, restore or resume and set the next LR."""
        action, kept = self._agreed(lambda: self.controller.step(loss))
        if action.evaluate:
            value = self._validation_loss()
            action, kept = self._agreed(lambda: self.controller.validation(value))
        self._apply(action, kept)

    def _validation_loss(self) -> float:
        """The one place ``val_fn`` runs: every replica calls it, the chief's value decides."""
        return float(self.training.validation_loss())

    def _decided(self, decide: Callable[[], Action]) -> list:
        action = decide()
        return pack(action, self.controller.kept)  # kept: after the decision, as the model will be

    def _agreed(self, decide: Callable[[], Action]) -> tuple[Action, bool]:
        return unpack(self.training.agree(lambda: self._decided(decide)))

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
