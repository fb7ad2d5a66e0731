"""The critical-batch probe's branches in PyTorch: :class:`TorchBranches`.

:mod:`aikit.core.critical_batch` runs the probe and the policy; this module only supplies the
training they branch from: the whole state snapshot and put back exactly (weights and buffers,
the optimizer's state, the gradients, torch's RNG), a window of samples trained at a batch and
an LR factor with the wrapped torch optimizer, and the held-out loss of every held-out sample.
Each replica trains every branch over the whole window alone, on the same samples, so every
replica decides the same with no collective (a probe costs each replica the whole window).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from aikit.core.errors import InvalidType, InvalidValue
from aikit.elastic.Torch.adaptive import AdaptiveOptimizer


class TorchBranches:
    """The training a probe branches from (:class:`aikit.core.critical_batch.Branches`).

    Args:
        model: the model trained (the plain module, as ``AdaptiveOptimizer`` takes it).
        optimizer: the run's ``AdaptiveOptimizer`` (its wrapped torch optimizer trains the
            branches, at the run's LR times the probe's factor).
        losses: ``losses(model, x, y)``: one loss per sample (a branch trains on their mean).
        dataset: the training set (indexable; a ``TensorDataset`` is read in one gather).
        held_out: ``(x, y)`` the branches are compared on.
    """

    def __init__(self, model: torch.nn.Module, optimizer: AdaptiveOptimizer,
                 losses: Callable[[torch.nn.Module, Any, Any], torch.Tensor], dataset: Any,
                 held_out: tuple[Any, Any]) -> None:
        if not isinstance(optimizer, AdaptiveOptimizer):
            raise InvalidType(f"TorchBranches needs the run's AdaptiveOptimizer, got {optimizer!r:.60}")
        self.model, self.run, self.losses, self.dataset, self.held_out = model, optimizer, losses, dataset, held_out
        self.dataset_size = len(dataset)

    @property
    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.run.param_groups for p in group["params"]]

    def snapshot(self) -> tuple | None:
        """The model's state, the wrapped optimizer's, the gradients and torch's RNG (None: a
        sharded optimizer, whose state is not this replica's alone)."""
        inner = self.run.optimizer
        if hasattr(inner, "consolidate_state_dict"):  # ZeroRedundancyOptimizer: each rank holds a shard
            return None
        grads = [None if p.grad is None else p.grad.detach().clone() for p in self._params]
        return (copy.deepcopy(self.model.state_dict()), copy.deepcopy(inner.state_dict()), grads,
                torch.get_rng_state())

    @torch.no_grad()
    def restore(self, snapshot: tuple) -> None:
        model, optimizer, grads, rng = snapshot
        self.model.load_state_dict(model)
        self.run.optimizer.load_state_dict(copy.deepcopy(optimizer))
        for p, grad in zip(self._params, grads, strict=True):
            p.grad = None if grad is None else grad.clone()
        torch.set_rng_state(rng)

    def train(self, indices: np.ndarray, batch: int, lr_factor: float) -> None:
        """``len(indices) // batch`` updates of the wrapped optimizer at the run's LR times ``lr_factor``."""
        inner, norms = self.run.optimizer, self.run.noise.norms
        base = [group["lr"] for group in inner.param_groups]
        scale = self.run.controller.lr_scale() * lr_factor
        active, norms.active = norms.active, False  # the run's noise hooks record nothing of a branch
        try:
            for group, lr in zip(inner.param_groups, base, strict=True):
                group["lr"] = lr * scale
            for start in range(0, len(indices) - batch + 1, batch):
                x, y = self._gather(indices[start:start + batch])
                inner.zero_grad(set_to_none=True)
                self.losses(self.model, x, y).mean().backward()
                inner.step()
        finally:
            norms.active = active
            for group, lr in zip(inner.param_groups, base, strict=True):
                group["lr"] = lr

    @torch.no_grad()
    def evaluate(self) -> np.ndarray:
        training = self.model.training
        self.model.eval()
        try:
            losses = self.losses(self.model, *self.held_out)
        finally:
            self.model.train(training)
        samples = len(self.held_out[1])
        if not isinstance(losses, torch.Tensor) or tuple(losses.shape) != (samples,):
            got = (f"a tensor of shape {tuple(losses.shape)}" if isinstance(losses, torch.Tensor)
                   else f"{type(losses).__name__} {losses!r:.40}")
            raise InvalidValue(
                f"TorchBranches' losses(model, x, y) must give one loss per held-out sample, {samples} here (the "
                f"probe compares branches sample by sample, with their standard error), got {got}: return the "
                "unreduced losses, e.g. F.cross_entropy(model(x), y, reduction='none'), not their mean")
        return losses.double().cpu().numpy()

    def _gather(self, indices: np.ndarray) -> tuple[Any, Any]:
        tensors = getattr(self.dataset, "tensors", None)
        if tensors is not None:
            index = torch.as_tensor(indices)
            return tuple(t[index] for t in tensors)
        items = [self.dataset[int(i)] for i in indices]
        return tuple(torch.utils.data.default_collate(items))

