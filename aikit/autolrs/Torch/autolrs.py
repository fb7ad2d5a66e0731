"""The PyTorch hook over :class:`aikit.core.autolrs.Controller`.

Call ``on_train_batch_end(loss)`` after every ``optimizer.step()``; the hook checkpoints and
restores in memory (model, optimizer, RNG) and sets the LR of every param group. Under a
data-parallel engine (torch.distributed, Horovod, torch_xla) the loss is averaged over the
replicas, rank 0's controller decides, and its decision is broadcast, so every replica sets
the same LR and restores at the same step. ``val_fn`` runs on every replica (it may reduce
across them); rank 0's value is used.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable, Sequence

import numpy as np
import torch

from aikit.autolrs.plot import plot_progress
from aikit.core.autolrs import Action, Controller, read_schedule, replay_lr, write_schedule
from aikit.core.validate import positive_int
from aikit.runtime.Torch import collectives, random_state

log = logging.getLogger("aikit.autolrs")
SLOTS = ("stage", "trial")


class AutoLRS:
    """Searches the LR schedule while training; see :class:`aikit.core.autolrs.Controller` for
    the options (``total_steps``, ``tau``, ``trials``, ``keep_winner``, ``anneal``,
    ``warmup_steps``, ``warmup_lr``, ``seed``, ...).

    ``val_fn()`` returns the validation loss as a number; it is called only in the
    validation-scored stages. Without ``min_lr``/``max_lr`` the first steps are a short LR
    range test that sets them (logged). Call the hook once per real update (with gradient
    accumulation, after the step that updates). Example::

        autolrs = AutoLRS(model, optimizer, val_fn, total_steps=4000)
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            autolrs.on_train_batch_end(loss)

    The original AutoLRS's call ``AutoLRS(net, optimizer, val_fn, listening_host=...,
    listening_port=..., warmup_steps=..., warmup_lr=..., summary_steps=...)`` works unchanged:
    there is no server (host and port are accepted and unused) and the range its server took on
    the command line comes from the range test. ``summary_steps`` logs checkpoint, restore and
    evaluate decisions at steps that are a multiple of it.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, val_fn: Callable[[], float],
                 min_lr: float | str | None = None, max_lr: float | int | None = None, *,
                 listening_host: str | None = None, listening_port: int | None = None, summary_steps: int = 1,
                 **options):
        if isinstance(min_lr, str):  # the original's positional (listening_host, listening_port)
            listening_host, min_lr = min_lr, None
            if max_lr is not None:
                listening_port, max_lr = max_lr, None
        if listening_host is not None or listening_port is not None:
            log.info("AutoLRS runs in-process: listening_host=%r and listening_port=%r are not used",
                     listening_host, listening_port)
        self.model, self.optimizer, self.val_fn = model, optimizer, val_fn
        self.summary_steps = positive_int(summary_steps, "summary_steps")
        self.controller = Controller(min_lr, max_lr, **options)
        self.device = next(model.parameters()).device
        self.replicas, self.rank = collectives.world(self.device)
        self._slots: dict[str, dict | None] = dict.fromkeys(SLOTS)
        self.action: Action | None = None  # the latest decision, for tests and logs
        current = float(optimizer.param_groups[0]["lr"])
        self._apply(self._decide(lambda: self.controller.begin(current)))

    @property
    def lr(self) -> float:
        """The LR the next step uses (on every replica)."""
        return self.action.lr

    @property
    def kept(self) -> bool:
        """Whether the model now in memory is on the run AutoLRS keeps (not a trial it may undo)."""
        return self._kept

    def on_train_batch_end(self, loss: torch.Tensor | float) -> None:
        """Report the loss of the step just taken and prepare the next step."""
        loss = self._replica_mean(loss)
        action = self._decide(lambda: self.controller.step(loss))
        if action.evaluate:
            value = float(self.val_fn())
            action = self._decide(lambda: self.controller.validation(value))
        self._apply(action)

    def plot(self, path=None):
        """LR and loss over every step taken (see :func:`aikit.autolrs.plot.plot_progress`)."""
        return plot_progress(self.controller, path, title="AutoLRS (PyTorch)")

    def export_schedule(self, path: str | os.PathLike) -> None:
        """Write the schedule the run kept as a ``step,lr`` CSV; :class:`ReplaySchedule` replays it."""
        write_schedule(path, self.controller.schedule())

    def state_dict(self) -> dict:
        """The search's state and its in-memory checkpoints (tensors, numbers, strings, lists):
        save it with the model's and optimizer's, ``torch.load(..., weights_only=True)`` reads it."""
        return {"controller": self.controller.state_dict(), "action": None if self.action is None else
                vars(self.action).copy(), "slots": {k: _portable(v) for k, v in self._slots.items()}}

    def load_state_dict(self, state: dict) -> None:
        """Resume a saved search (load the model and optimizer as usual). Nothing is set on the
        optimizer here: the saved state already holds the LR of the next step."""
        slots = {k: _unportable(state["slots"][k]) for k in SLOTS}
        action = Action(**state["action"]) if state["action"] is not None else None
        self.controller.load_state_dict(state["controller"])  # validates; raises before any change
        self._slots, self.action = slots, action

    # -- internals --------------------------------------------------------------------------

    def _replica_mean(self, loss: torch.Tensor | float) -> float:
        if self.replicas == 1:
            return float(loss.detach() if isinstance(loss, torch.Tensor) else loss)
        total = torch.as_tensor(loss).detach().reshape(1).to(self.device, torch.float64)
        collectives.all_reduce_sum_([total])
        return total.item() / self.replicas

    def _decide(self, decide: Callable[[], Action]) -> Action:
        """Rank 0's decision (and whether the model is then on the kept run), on every replica."""
        if self.replicas == 1:
            action = decide()
            self._kept = self.controller.kept
            return action
        fields = ("checkpoint", "restore", "evaluate", "keep_trial", "resume_trial")
        packed = torch.zeros(2 + len(fields), dtype=torch.float64, device=self.device)
        if self.rank == 0:
            action = decide()
            packed += torch.tensor([action.lr, self.controller.kept, *(getattr(action, f) for f in fields)],
                                   dtype=torch.float64, device=self.device)
        collectives.broadcast_([packed])
        lr, kept, *flags = packed.tolist()
        self._kept = bool(kept)
        return Action(lr, **{f: bool(v) for f, v in zip(fields, flags, strict=True)})

    def _apply(self, action: Action) -> None:
        self.action = action
        if self.controller.steps % self.summary_steps == 0:
            done = [f for f in ("keep_trial", "restore", "resume_trial", "checkpoint") if getattr(action, f)]
            if done:
                log.info("[AutoLRS at %d] %s; lr=%.4g", self.controller.steps, ", ".join(done), action.lr)
        if action.keep_trial:
            self._slots["trial"] = self._snapshot()
        if action.restore:
            self._load(self._slots["stage"])
        if action.resume_trial:
            self._load(self._slots["trial"])
        if action.checkpoint:
            self._slots["stage"] = self._snapshot()
        for group in self.optimizer.param_groups:  # after a restore, so the new LR is in force
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(action.lr)
            else:
                group["lr"] = action.lr

    def _snapshot(self) -> dict:
        return {
            "model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "rng": random_state.get_state(),
        }

    def _load(self, snapshot: dict) -> None:
        self.model.load_state_dict(snapshot["model"])
        # A copy: the optimizer updates its loaded state tensors in place.
        self.optimizer.load_state_dict(copy.deepcopy(snapshot["optimizer"]))
        random_state.set_state(snapshot["rng"])


def _portable(snapshot: dict | None) -> dict | None:
    """A snapshot that ``torch.load(weights_only=True)`` reads: NumPy's key array as a list."""
    if snapshot is None:
        return None
    name, key, pos, has_gauss, cached = snapshot["rng"]["numpy"]
    return {**snapshot, "rng": {**snapshot["rng"], "numpy": (name, key.tolist(), pos, has_gauss, cached)}}


def _unportable(snapshot: dict | None) -> dict | None:
    if snapshot is None:
        return None
    name, key, pos, has_gauss, cached = snapshot["rng"]["numpy"]
    numpy_state = (name, np.asarray(key, dtype=np.uint32), pos, has_gauss, cached)
    return {**snapshot, "rng": {**snapshot["rng"], "numpy": numpy_state}}


class ReplaySchedule(torch.optim.lr_scheduler.LRScheduler):
    """Replays a schedule AutoLRS found (``export_schedule``'s CSV, or a list of LRs) as a plain
    LR scheduler, with no search: call ``step()`` after each ``optimizer.step()``. Past the
    schedule's end the last LR stays."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: str | os.PathLike | Sequence[float],
                 last_epoch: int = -1):
        self.lrs = read_schedule(schedule) if isinstance(schedule, (str, os.PathLike)) else [float(x) for x in
                                                                                               schedule]
        if not self.lrs:
            raise ValueError("the schedule to replay is empty")
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [replay_lr(self.lrs, self.last_epoch)] * len(self.optimizer.param_groups)
