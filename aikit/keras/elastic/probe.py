"""The critical-batch probe's branches in Keras (TensorFlow, JAX or torch backend): :class:`KerasBranches`.

:mod:`aikit.core.critical_batch` runs the probe and the policy; this module only supplies the
training they branch from, as ``aikit.elastic.Torch.TorchBranches`` does for PyTorch: the whole
state read to the host and assigned back bit for bit (the model's variables, its layers' seed
generators among them, its metrics', and aikit's GA optimizer's with the wrapped optimizer's), a
window of samples trained at a batch and an LR factor (one update of one micro-step per batch,
through the run's own compiled step), and the held-out loss of every held-out sample. A probed
Keras run is :func:`~aikit.keras.elastic.adaptive.fit_adaptive` with a
:class:`~aikit.core.critical_batch.ProbeController` this is attached to.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from aikit.core.errors import InvalidType, InvalidValue
from aikit.keras.optimizers import Optimizer
from aikit.runtime.Keras.backend import ops, to_numpy
from aikit.runtime.Keras.training import replicas_of, seam


class KerasBranches:
    """The training a probe branches from (:class:`aikit.core.critical_batch.Branches`).

    Args:
        model: the compiled Keras model the run trains (or aikit's ``Model`` wrapper), its
            optimizer aikit's GA ``Optimizer`` (``NoiseOptimizer`` in ``fit_adaptive``).
        losses: ``losses(model, x, y)``: one loss per sample (a tensor or array).
        x, y: the training set (numpy arrays, as ``fit_adaptive`` takes them).
        held_out: ``(x, y)`` the branches are compared on.
    """

    def __init__(self, model: Any, losses: Callable[[Any, Any, Any], Any], x: np.ndarray, y: np.ndarray,
                 held_out: tuple[Any, Any]) -> None:
        self.model = getattr(model, "model", model)
        optimizer = getattr(self.model, "optimizer", None)
        if not isinstance(optimizer, Optimizer):
            raise InvalidType(f"KerasBranches needs the model compiled with aikit's Keras GA optimizer "
                              f"(aikit.keras.NoiseOptimizer in fit_adaptive), got {type(optimizer).__name__}")
        if replicas_of(self.model) != 1:
            raise InvalidValue(f"KerasBranches trains a probe's branches on one replica, but the model trains on "
                               f"{replicas_of(self.model)}: probe a one-device Keras run (PyTorch's TorchBranches "
                               "probes under torchrun)")
        if len(x) != len(y):
            raise InvalidValue(f"x has {len(x)} samples but y has {len(y)}")
        self.optimizer, self.losses, self.x, self.y, self.held_out = optimizer, losses, x, y, held_out
        self.dataset_size = len(x)

    def _variables(self) -> list:
        seen, found = set(), []
        for v in (*self.model.variables, *self.model.metrics_variables, *self.optimizer.variables):
            if id(v) not in seen:
                seen.add(id(v))
                found.append(v)
        return found

    def snapshot(self) -> list[np.ndarray] | None:
        """Every variable's value, on the host (None before the optimizer's first update built
        its state: there is no run to branch from yet)."""
        if not self.optimizer.built:
            return None
        return [np.array(to_numpy(v), copy=True) for v in self._variables()]

    def restore(self, snapshot: list[np.ndarray]) -> None:
        for variable, value in zip(self._variables(), snapshot, strict=True):
            variable.assign(value)

    def train(self, indices: np.ndarray, batch: int, lr_factor: float) -> None:
        """``len(indices) // batch`` updates of one micro-step each at the run's LR (the last
        update's) times ``lr_factor``."""
        steps, lr = self.optimizer.steps, float(to_numpy(self.optimizer.learning_rate))
        self.optimizer.steps, self.optimizer.learning_rate = 1, lr * lr_factor
        try:
            for start in range(0, len(indices) - batch + 1, batch):
                seam.train_micro_step(self.model, self.x, self.y, [np.asarray(indices[start:start + batch])])
        finally:
            self.optimizer.steps, self.optimizer.learning_rate = steps, lr

    def evaluate(self) -> np.ndarray:
        losses = ops.stop_gradient(self.losses(self.model, *self.held_out))  # (torch: no graph kept to read it)
        return np.asarray(to_numpy(losses), dtype=np.float64).ravel()
