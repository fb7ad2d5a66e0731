"""The PyTorch hook over :class:`aikit.core.autolrs.Driver`.

Call ``on_train_batch_end(loss)`` after every ``optimizer.step()``; the hook checkpoints and
restores in memory (model, optimizer, RNG) and sets the LR of every param group. Under a
data-parallel engine (torch.distributed, Horovod, torch_xla) the loss is averaged over the
replicas, rank 0's controller decides, and its decision is broadcast, so every replica sets
the same LR and restores at the same step. ``val_fn`` runs on every replica (it may reduce
across them); rank 0's value is used.

The constructor is local: every replica makes the first decision (the LR of the first step)
alone, from the same options, and the first ``on_train_batch_end`` checks that they all made
rank 0's before its collectives go on as above.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable, Sequence

import numpy as np
import torch

from aikit.core.autolrs import (
    DECISION_SIZE,
    SLOTS,
    Action,
    Controller,
    Driver,
    pack,
    replay_lr,
    schedule_lrs,
    write_schedule,
)
from aikit.core.errors import InvalidState, InvalidType, InvalidValue
from aikit.core.validate import one_number, positive_int
from aikit.runtime.plots import plot_progress
from aikit.runtime.Torch import collectives, random_state
from aikit.runtime.Torch.amp import update_skipped
from aikit.runtime.Torch.lr_free import SCHEDULE_FREE, lr_free_kind

log = logging.getLogger("aikit.autolrs")


class AutoLRS:
    """Searches the LR schedule while training; see :class:`aikit.core.autolrs.Settings` for
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

    The constructor sets the first step's LR (and, without a warmup, takes the first
    checkpoint) without any collective; build it alike on every replica (same options, seed and optimizer LR): the
    first ``on_train_batch_end`` refuses replicas that began differently from rank 0.
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
        refuse_lr_free(optimizer)
        self.model, self.optimizer, self.val_fn = model, optimizer, val_fn
        self.summary_steps = positive_int(summary_steps, "summary_steps")
        first = next(iter(model.parameters()), None)
        if first is None:
            raise InvalidValue(f"AutoLRS got a model without parameters ({type(model).__name__}): give it the model "
                               "whose parameters the optimizer trains")
        self.controller = Controller(min_lr, max_lr, **options)
        self.controller.momentum = heavy_ball(optimizer)
        self.device = first.device
        self.num_replicas, self.rank = collectives.world(self.device)
        self._training = _TorchTraining(model, optimizer, val_fn, self.device, self.num_replicas, self.rank)
        self._driver = Driver(self.controller, self._training, self.summary_steps)
        self._driver.begin(float(optimizer.param_groups[0]["lr"]), alone=True)
        self._first_step_checked = self.num_replicas == 1  # the replicas' first decisions: at the first step

    @property
    def action(self) -> Action:
        """The latest decision (for tests and logs)."""
        return self._driver.action

    @property
    def lr(self) -> float:
        """The LR the next step uses (on every replica)."""
        return self._driver.action.lr

    @property
    def kept(self) -> bool:
        """Whether the model now in memory is on the run AutoLRS keeps (not a trial it may undo)."""
        return self._driver.kept

    def on_train_batch_end(self, loss: torch.Tensor | float) -> None:
        """Report the loss of the step just taken and prepare the next step. A step that made no
        update (one AMP skipped for inf/NaN gradients, seen in an aikit optimizer's ``updated`` or
        Accelerate's ``step_was_skipped``; a GA optimizer's micro-step) is no step of the search:
        nothing advances, and the next update runs at the same LR."""
        loss = _checked_loss(loss)
        if collectives.per_update(self.device):  # TorchFT: the replicas may change at every update
            raise InvalidState(
                "AutoLRS under TorchFT's replica groups: its trials and rollbacks need the same replicas from one step "
                "to the next, and its snapshots, which a group that heals does not fetch; train the replica groups at "
                "an LR found by LRFinder before group.start(), or a trace optimizer's rule (docs/resize.md, No "
                "restart: TorchFT)")
        if update_skipped(self.optimizer):  # the same on every replica: their gradients are summed
            return
        first_decision = None if self._first_step_checked else pack(self._driver.action, self._driver.kept)
        loss = self._training.replica_mean(loss, first_decision)
        self._first_step_checked = True
        self._driver.step(loss)

    def plot(self, path=None):
        """LR and loss over every step taken (see :func:`aikit.runtime.plots.plot_progress`)."""
        return plot_progress(self.controller, path, title="AutoLRS (PyTorch)")

    def export_schedule(self, path: str | os.PathLike) -> None:
        """Write the schedule the run kept as a ``step,lr`` CSV; :class:`ReplaySchedule` replays it."""
        write_schedule(path, self.controller.schedule())

    def state_dict(self) -> dict:
        """The search's state and its in-memory checkpoints (tensors, numbers, strings, lists):
        save it with the model's and optimizer's, ``torch.load(..., weights_only=True)`` reads it."""
        state = self._driver.state_dict()
        return {**state, "slots": {slot: _portable(snapshot) for slot, snapshot in state["slots"].items()}}

    def load_state_dict(self, state: dict) -> None:
        """Resume a saved search (load the model and optimizer as usual). Nothing is set on the
        optimizer here: the saved state already holds the LR of the next step."""
        self._driver.load_state_dict({**state, "slots": {slot: _unportable(state["slots"][slot]) for slot in SLOTS}})


def _checked_loss(loss: object) -> torch.Tensor | float:
    """The step's loss as one number, refused as ``val_fn``'s answer is when it is none (a string,
    None, several elements); a one-element tensor is kept as it is (not read: the replicas average
    it on its device)."""
    if isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.dtype.is_floating_point:
        return loss
    return one_number(loss, "AutoLRS.on_train_batch_end's loss", "the step's training loss as one number", verb="be")


def heavy_ball(optimizer: torch.optim.Optimizer) -> float:
    """The first param group's heavy-ball ``momentum`` (SGD's, RMSprop's; 0 for Adam, whose
    ``betas`` average), which the range test's ``max_lr`` accounts for
    (:func:`aikit.core.autolrs.momentum_lag`), as the Keras callback's."""
    groups = getattr(optimizer, "param_groups", None) or [{}]
    return float(groups[0].get("momentum", 0.0) or 0.0)


def refuse_lr_free(optimizer) -> None:
    """AutoLRS sets the LR of every step; an LR-free optimizer has no LR for it to search."""
    kind = lr_free_kind(optimizer)
    if kind == SCHEDULE_FREE:
        raise InvalidType(
            f"{type(optimizer).__name__} is Schedule-Free: its averaging of the iterates replaces the LR schedule "
            "(and an LR it is given sets the averaging weights), so AutoLRS's stages, restores and anneal would "
            "fight it: train it at its constant LR, or run AutoLRS over AdamW or SGD (docs/autolrs.md, "
            "'LR-free optimizers')"
        )
    if kind is not None:
        raise InvalidType(
            f"{type(optimizer).__name__} estimates its own step size (its lr multiplies the estimate d, 1 by "
            "default), so an LR searched by AutoLRS would fight the estimate: tune its d_coef instead, or run "
            "AutoLRS over AdamW or SGD (docs/autolrs.md, 'LR-free optimizers')"
        )


class _TorchTraining:
    """:class:`aikit.core.autolrs.Training` for a torch model and optimizer: snapshots in memory,
    rank 0 decides, and the collectives of :mod:`aikit.runtime.Torch.collectives`."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, val_fn: Callable[[], float],
                 device: torch.device, num_replicas: int, rank: int):
        self.model, self.optimizer, self.val_fn = model, optimizer, val_fn
        self.device, self.num_replicas, self.rank = device, num_replicas, rank

    def replica_mean(self, loss: torch.Tensor | float, first_decision: list | None = None) -> float:
        """The loss averaged over the replicas. With ``first_decision`` (packed; each replica
        made it alone) rank 0's is broadcast first, and the loss's all-reduce also counts the
        replicas whose own differs: if any does, every replica refuses to go on."""
        if self.num_replicas == 1:
            return float(loss.detach() if isinstance(loss, torch.Tensor) else loss)
        total = torch.as_tensor(loss).detach().reshape(1).to(self.device, torch.float64)
        if first_decision is not None:
            chief = torch.tensor(first_decision, dtype=torch.float64, device=self.device)
            mine = chief.clone()
            collectives.broadcast_([chief])
            total = torch.cat([total, (chief != mine).any().to(torch.float64).reshape(1)])
        collectives.all_reduce_sum_([total])
        if first_decision is not None and total[1].item() > 0:
            raise InvalidValue(
                f"AutoLRS began differently on {int(total[1].item())} of {self.num_replicas} replicas than on rank 0 "
                f"(lr, kept and flags here: {first_decision}): its constructor decides the first step alone on every "
                "replica, so build it with the same options, seed and optimizer LR on each"
            )
        return total[0].item() / self.num_replicas

    def agree(self, decide: Callable[[], Sequence[float]]) -> Sequence[float]:
        """Rank 0's decision, on every replica."""
        if self.num_replicas == 1:
            return decide()
        packed = torch.zeros(DECISION_SIZE, dtype=torch.float64, device=self.device)
        if self.rank == 0:
            packed += torch.tensor(decide(), dtype=torch.float64, device=self.device)
        collectives.broadcast_([packed])
        return packed.tolist()

    def validation_loss(self) -> float:
        return self.val_fn()

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr

    def snapshot(self) -> dict:
        return {
            "model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "rng": random_state.get_state(),
        }

    def restore(self, snapshot: dict) -> None:
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
        self.lrs = schedule_lrs(schedule)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [replay_lr(self.lrs, self.last_epoch)] * len(self.optimizer.param_groups)
