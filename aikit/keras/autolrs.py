"""The Keras 3 callback over :class:`aikit.core.autolrs.Driver`, on every backend.

Keras hands callbacks the *running mean* of the loss over the epoch, which would smear every
trial's curve; the callback reads the loss tracker's running sums before and after each step
instead, so the controller sees each step's own loss. Checkpoints are in memory: every model
variable (Keras 3 counts dropout's seed state among them), every optimizer variable and
Python's and NumPy's random state. Under ``tf.distribute`` with more than one replica the
chief (worker 0) decides and its decision reaches every worker through one collective (a
sum over the replicas, to which only global replica 0 contributes): the workers follow the
chief, they do not merely run equally seeded controllers. On JAX every read and write goes
through ``Callback.model``, which syncs the state Keras' jitted steps carry into the variables
(a copy kept of the model would be stale mid-epoch).
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable, Sequence

import numpy as np

from aikit.core.autolrs import DECISION_SIZE, Action, Controller, Driver, schedule_lrs, write_schedule
from aikit.core.errors import InvalidState, InvalidType, InvalidValue
from aikit.runtime.Keras.backend import check_backend, keras, seam, to_numpy
from aikit.runtime.plots import plot_progress


class AutoLRS(keras.callbacks.Callback):
    """Searches the LR schedule while ``fit`` trains; see
    :class:`aikit.core.autolrs.Settings` for the options (``total_steps``, ``tau``,
    ``trials``, ``keep_winner``, ``anneal``, ``warmup_steps``, ``warmup_lr``, ``seed``, ...).

    ``val_fn()`` returns the validation loss as a number; it runs only in validation-scored
    stages, so keep it cheap and leave the model's metrics alone (``model.evaluate`` resets
    them), e.g. ``lambda: float(loss_fn(y_val, model(x_val, training=False)))``. Without
    ``min_lr``/``max_lr`` the first steps are a short LR range test that sets them. A step is
    one call of the train function: with ``steps_per_execution=k`` a step is k batches.
    """

    def __init__(self, val_fn: Callable[[], float], min_lr: float | None = None, max_lr: float | None = None,
                 **options):
        check_backend("aikit.keras.autolrs.AutoLRS")
        super().__init__()
        self.val_fn = val_fn
        self.controller = Controller(min_lr, max_lr, **options)
        self._driver = Driver(self.controller, _KerasTraining(self))
        self._sums_before = (0.0, 0.0)

    @property
    def action(self) -> Action | None:
        """The latest decision (None before training begins)."""
        return self._driver.action

    @property
    def lr(self) -> float | None:
        """The LR the next step uses (None before training begins)."""
        return None if self.action is None else self.action.lr

    @property
    def kept(self) -> bool:
        """Whether the model now trained is on the run AutoLRS keeps (not a trial it may undo)."""
        return self._driver.kept

    def on_train_begin(self, logs=None):
        optimizer = self.model.optimizer
        if isinstance(getattr(optimizer, "_learning_rate", None), keras.optimizers.schedules.LearningRateSchedule):
            raise InvalidValue(
                f"AutoLRS sets the learning rate itself, but the optimizer follows {optimizer._learning_rate!r}: "
                "compile the model with an optimizer built with a float learning_rate"
            )
        inner = getattr(optimizer, "inner", optimizer)  # (aikit's GA optimizer: the one it wraps)
        if isinstance(inner, getattr(keras.optimizers, "ScheduleFreeAdamW", ())):  # (Keras 3.13 and later)
            raise InvalidType(
                f"{type(inner).__name__} is Schedule-Free: its averaging of the iterates replaces the LR schedule, "
                "so AutoLRS's stages, restores and anneal would fight it: train it at its constant LR, or run "
                "AutoLRS over AdamW or SGD (docs/autolrs.md, 'LR-free optimizers')"
            )
        if not optimizer.built:  # its slots must exist before the first checkpoint
            optimizer.build(self.model.trainable_variables)
        self.controller.momentum = heavy_ball(optimizer)
        if self.action is None:  # a second fit() (or a loaded state) continues where it was
            self._driver.begin(float(keras.ops.convert_to_numpy(optimizer.learning_rate)))

    def on_train_batch_begin(self, batch, logs=None):
        self._sums_before = self._loss_sums()

    def on_train_batch_end(self, batch, logs=None):
        total, count = self._loss_sums()
        self._driver.step((total - self._sums_before[0]) / (count - self._sums_before[1]))

    def plot(self, path=None):
        """LR and loss over every step taken (see :func:`aikit.runtime.plots.plot_progress`)."""
        return plot_progress(self.controller, path, title="AutoLRS (Keras)")

    def export_schedule(self, path: str | os.PathLike) -> None:
        """Write the schedule the run kept as a ``step,lr`` CSV; :class:`ReplaySchedule` replays it."""
        write_schedule(path, self.controller.schedule())

    def state_dict(self) -> dict:
        """The search's state and its in-memory checkpoints (NumPy arrays, numbers, lists):
        save it beside the model's weights to resume a preempted search."""
        state = self._driver.state_dict()
        return {**state, "slots": {k: None if v is None else dict(v) for k, v in state["slots"].items()}}

    def load_state_dict(self, state: dict) -> None:
        """Resume a saved search; load the model's and optimizer's weights as usual, then
        ``fit`` again. A state that does not fit this callback's options changes nothing."""
        self._driver.load_state_dict(state)

    def _loss_sums(self) -> tuple[float, float]:
        tracker = next((m for m in self.model.metrics if m.name == "loss"), None)
        if tracker is None:
            raise InvalidState("AutoLRS needs the model's loss tracker: compile the model with a loss")
        return float(to_numpy(tracker.total)), float(to_numpy(tracker.count))


class _KerasTraining:
    """:class:`aikit.core.autolrs.Training` for the callback's model: its variables and Python's
    and NumPy's random state in memory; under ``tf.distribute`` the chief decides."""

    def __init__(self, callback: AutoLRS):
        self.callback = callback

    def agree(self, decide: Callable[[], Sequence[float]]) -> Sequence[float]:
        """The chief's decision on every worker (one collective when there are replicas)."""
        return seam.chief_decides(self.callback.model, decide, DECISION_SIZE)

    def validation_loss(self) -> float:
        return self.callback.val_fn()

    def set_lr(self, lr: float) -> None:
        """Set ``lr``, an SGD's velocity rescaled to it (:func:`torch_convention`)."""
        optimizer = self.callback.model.optimizer
        velocities = sgd_velocities(optimizer)
        if velocities:
            torch_convention(velocities, float(to_numpy(optimizer.learning_rate)), lr)
        optimizer.learning_rate = lr

    def _variables(self) -> list:
        model = self.callback.model
        return [*model.variables, *model.optimizer.variables]

    def snapshot(self) -> dict:
        return {"variables": [np.array(to_numpy(v), copy=True) for v in self._variables()],
                "numpy": np.random.get_state(), "python": random.getstate()}

    def restore(self, snapshot: dict) -> None:
        for variable, value in zip(self._variables(), snapshot["variables"], strict=True):
            variable.assign(value)
        np.random.set_state(snapshot["numpy"])
        random.setstate(snapshot["python"])


def innermost(optimizer):
    """The optimizer that updates, inside aikit's GA optimizer or a ``LossScaleOptimizer``."""
    while True:
        inner = getattr(optimizer, "inner", None) or getattr(optimizer, "inner_optimizer", None)
        if inner is None:
            return optimizer
        optimizer = inner


def heavy_ball(optimizer) -> float:
    """The heavy-ball momentum of an SGD or RMSprop (0 for Adam and the rest), which the range
    test's ``max_lr`` accounts for (:func:`aikit.core.autolrs.momentum_lag`), as the torch hook's."""
    optimizer = innermost(optimizer)
    if isinstance(optimizer, (keras.optimizers.SGD, keras.optimizers.RMSprop)):
        return float(optimizer.momentum or 0.0)
    return 0.0


def sgd_velocities(optimizer) -> list:
    """The momentum slots of a Keras SGD with momentum (inside aikit's GA optimizer or a
    ``LossScaleOptimizer`` too), else ``[]``: the one Keras optimizer AutoLRS uses whose velocity
    holds the LR (Adam's and AdamW's moments do not)."""
    optimizer = innermost(optimizer)
    if isinstance(optimizer, keras.optimizers.SGD) and optimizer.momentum and optimizer.built:
        return list(optimizer.momentums)
    return []


def torch_convention(velocities: Sequence, before: float, lr: float) -> None:
    """Rescale Keras SGD's velocities by ``lr / before`` where the LR changes, so that the LR
    means what it means in torch. Keras' SGD keeps ``m = momentum * m - lr * g`` (each past
    gradient at the LR of its own step), torch's ``b = momentum * b + g`` and steps ``lr * b``
    (every past gradient at today's LR); with ``m = -before * b`` kept, the Keras update is torch's
    bit for bit in exact arithmetic. Without it the two frameworks' range tests differ: Keras'
    velocity lags the LR that climbs 1.74x a step, so its loss bottoms out one or two LRs later
    (the digits MLP: 3.3 instead of 1.9, docs/autolrs.md). From an LR of 0 there is nothing to
    rescale (the velocity holds no gradient's scale), so none is."""
    if before > 0 and lr != before and math.isfinite(lr):
        scale = lr / before
        for velocity in velocities:
            velocity.assign(keras.ops.multiply(velocity, keras.ops.cast(scale, velocity.dtype)))


class ReplaySchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Replays a schedule AutoLRS found (``export_schedule``'s CSV, or a list of LRs) as a plain
    Keras schedule, with no search: ``keras.optimizers.SGD(ReplaySchedule("schedule.csv"))``.
    Past the schedule's end the last LR stays."""

    def __init__(self, schedule: str | os.PathLike | Sequence[float]):
        self.lrs = schedule_lrs(schedule)

    def __call__(self, step):
        index = keras.ops.minimum(keras.ops.cast(step, "int32"), len(self.lrs) - 1)
        return keras.ops.take(keras.ops.convert_to_tensor(self.lrs, dtype="float32"), index)

    def get_config(self) -> dict:
        return {"schedule": list(self.lrs)}
