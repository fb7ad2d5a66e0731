"""The Keras 3 callback over :class:`aikit.core.autolrs.Controller`.

Keras hands callbacks the *running mean* of the loss over the epoch, which would smear every
trial's curve; the callback reads the loss tracker's running sums before and after each step
instead, so the controller sees each step's own loss. Checkpoints are in memory: every model
variable (Keras 3 counts dropout's seed state among them), every optimizer variable and
Python's and NumPy's random state. Under ``tf.distribute`` the callback runs once per worker on
the reduced loss, so every worker's (equally seeded) controller takes the same decisions.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import keras
import numpy as np

from aikit.autolrs.plot import plot_progress
from aikit.core.autolrs import Action, Controller


class AutoLRS(keras.callbacks.Callback):
    """Searches a constant LR per training stage; see :class:`aikit.core.autolrs.Controller`
    for the options (``tau``, ``tau_max``, ``trials``, ``trial_ratio``, ``val_tau``,
    ``val_points``, ``warmup_steps``, ``warmup_lr``, ``kappa``, ``warm_start``, ``seed``).

    ``val_fn()`` returns the validation loss as a number; it runs only in validation-scored
    stages, so keep it cheap and leave the model's metrics alone (``model.evaluate`` resets
    them), e.g. ``lambda: float(loss_fn(y_val, model(x_val, training=False)))``. A step is
    one call of the train function: with ``steps_per_execution=k`` a step is k batches.
    """

    def __init__(self, val_fn: Callable[[], float], min_lr: float, max_lr: float, **options):
        super().__init__()
        self.val_fn = val_fn
        self.controller = Controller(min_lr, max_lr, **options)
        self.action: Action | None = None
        self._checkpoint: dict | None = None
        self._sums_before = (0.0, 0.0)

    @property
    def lr(self) -> float | None:
        """The LR the next step uses (None before training begins)."""
        return None if self.action is None else self.action.lr

    def on_train_begin(self, logs=None):
        optimizer = self.model.optimizer
        if isinstance(getattr(optimizer, "_learning_rate", None), keras.optimizers.schedules.LearningRateSchedule):
            raise ValueError(
                f"AutoLRS sets the learning rate itself, but the optimizer follows {optimizer._learning_rate!r}: "
                "compile the model with an optimizer built with a float learning_rate"
            )
        if not optimizer.built:  # its slots must exist before the first checkpoint
            optimizer.build(self.model.trainable_variables)
        if self.controller.phase == "idle":  # a second fit() continues where the first stopped
            self._apply(self.controller.begin())

    def on_train_batch_begin(self, batch, logs=None):
        self._sums_before = self._loss_sums()

    def on_train_batch_end(self, batch, logs=None):
        total, count = self._loss_sums()
        loss = (total - self._sums_before[0]) / (count - self._sums_before[1])
        action = self.controller.step(loss)
        if action.evaluate:
            action = self.controller.validation(float(self.val_fn()))
        self._apply(action)

    def plot(self, path=None):
        """LR and loss over every step taken (see :func:`aikit.autolrs.plot.plot_progress`)."""
        return plot_progress(self.controller, path, title="AutoLRS (Keras)")

    # -- internals --------------------------------------------------------------------------

    def _loss_sums(self) -> tuple[float, float]:
        tracker = next((m for m in self.model.metrics if m.name == "loss"), None)
        if tracker is None:
            raise RuntimeError("AutoLRS needs the model's loss tracker: compile the model with a loss")
        return float(tracker.total.numpy()), float(tracker.count.numpy())

    def _variables(self) -> list:
        return [*self.model.variables, *self.model.optimizer.variables]

    def _apply(self, action: Action) -> None:
        self.action = action
        if action.restore:
            for variable, value in zip(self._variables(), self._checkpoint["variables"], strict=True):
                variable.assign(value)
            np.random.set_state(self._checkpoint["numpy"])
            random.setstate(self._checkpoint["python"])
        if action.checkpoint:
            self._checkpoint = {
                "variables": [np.array(v.numpy(), copy=True) for v in self._variables()],
                "numpy": np.random.get_state(),
                "python": random.getstate(),
            }
        self.model.optimizer.learning_rate = action.lr  # after a restore, so the new LR is in force
