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
from collections.abc import Callable

import torch

from aikit.autolrs.plot import plot_progress
from aikit.core.autolrs import Action, Controller
from aikit.elastic.Torch import collectives, random_state


class AutoLRS:
    """Searches a constant LR per training stage; see :class:`aikit.core.autolrs.Controller`
    for the options (``tau``, ``tau_max``, ``trials``, ``trial_ratio``, ``val_tau``,
    ``val_points``, ``warmup_steps``, ``warmup_lr``, ``kappa``, ``warm_start``, ``seed``).

    ``val_fn()`` returns the validation loss as a number; it is called only in the
    validation-scored stages. The first LR is set on construction. Call the hook once per
    real update (with gradient accumulation, after the step that updates). Example::

        autolrs = AutoLRS(model, optimizer, val_fn, min_lr=1e-3, max_lr=1.0)
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            autolrs.on_train_batch_end(loss)
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, val_fn: Callable[[], float],
                 min_lr: float, max_lr: float, **options):
        self.model, self.optimizer, self.val_fn = model, optimizer, val_fn
        self.controller = Controller(min_lr, max_lr, **options)
        self.device = next(model.parameters()).device
        self.replicas, self.rank = collectives.world(self.device)
        self._checkpoint: dict | None = None
        self.action: Action | None = None  # the latest decision, for tests and logs
        self._apply(self._decide(self.controller.begin))

    @property
    def lr(self) -> float:
        """The LR the next step uses (on every replica)."""
        return self.action.lr

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

    # -- internals --------------------------------------------------------------------------

    def _replica_mean(self, loss: torch.Tensor | float) -> float:
        if self.replicas == 1:
            return float(loss.detach() if isinstance(loss, torch.Tensor) else loss)
        total = torch.as_tensor(loss).detach().reshape(1).to(self.device, torch.float64)
        collectives.all_reduce_sum_([total])
        return total.item() / self.replicas

    def _decide(self, decide: Callable[[], Action]) -> Action:
        """Rank 0's decision, on every replica."""
        if self.replicas == 1:
            return decide()
        packed = torch.zeros(4, dtype=torch.float64, device=self.device)
        if self.rank == 0:
            action = decide()
            packed += torch.tensor([action.lr, action.checkpoint, action.restore, action.evaluate],
                                   dtype=torch.float64, device=self.device)
        collectives.broadcast_([packed])
        lr, checkpoint, restore, evaluate = packed.tolist()
        return Action(lr, bool(checkpoint), bool(restore), bool(evaluate))

    def _apply(self, action: Action) -> None:
        self.action = action
        if action.restore:
            self._restore()
        if action.checkpoint:
            self._save()
        for group in self.optimizer.param_groups:  # after a restore, so the new LR is in force
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(action.lr)
            else:
                group["lr"] = action.lr

    def _save(self) -> None:
        self._checkpoint = {
            "model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "rng": random_state.get_state(),
        }

    def _restore(self) -> None:
        self.model.load_state_dict(self._checkpoint["model"])
        # A copy: the optimizer updates its loaded state tensors in place.
        self.optimizer.load_state_dict(copy.deepcopy(self._checkpoint["optimizer"]))
        random_state.set_state(self._checkpoint["rng"])
