"""``Model(model)``: a Keras model that trains by the elastic plan of ``aikit.elastic.TF.init``.

``compile`` wraps the optimizer in aikit's GA (``plan.steps`` micro-steps per update) and
runs Keras' ``compile`` inside the plan's ``tf.distribute`` strategy; ``fit`` feeds the
planned micro-batch to every device. An epoch is still one pass over the data (an update
continues into the next epoch when an epoch's micro-batches are not a multiple of
``plan.steps``; no sample is dropped); batch-level callbacks fire per micro-step, as in
Keras, and ``model.optimizer.iterations`` counts real updates. Everything else -- ``evaluate``,
``predict``, ``save``, ``summary``, attributes -- is the wrapped Keras model's.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from aikit.core.errors import InvalidState, InvalidType, InvalidValue
from aikit.core.plan import Plan
from aikit.ga.TF.optimizers import Optimizer
from aikit.runtime.published import published
from aikit.runtime.TF.keras_backend import keras_on_tensorflow

keras = keras_on_tensorflow()


def current_plan() -> Plan:
    """The plan of the last :func:`aikit.elastic.TF.init`, or an error saying to call it."""
    plan = published(__package__)  # what aikit.elastic.TF.init published
    if plan is None:
        raise InvalidState(
            "aikit.elastic.TF.init(global_batch_size, max_device_batch) must be called before "
            "wrapping or compiling a model"
        )
    return plan


def created_in(model: keras.Model, strategy: tf.distribute.Strategy) -> bool:
    """True when every variable of ``model`` lives under ``strategy`` (or none exists yet)."""
    return all(strategy.extended.variable_created_in_scope(w.value) for w in model.weights)


def on_strategy(model: keras.Model, strategy: tf.distribute.Strategy) -> keras.Model:
    """``model``, or a copy with the same weights whose variables live under ``strategy``."""
    if created_in(model, strategy):
        return model
    try:
        with strategy.scope():
            copy = keras.models.clone_model(model)
            copy.set_weights(model.get_weights())
    except Exception as error:
        raise InvalidValue(
            f"the model's variables were created outside the plan's {type(strategy).__name__} and "
            f"it cannot be cloned into it ({error}): build the model inside "
            "`with aikit.elastic.TF.strategy.scope():`"
        ) from error
    return copy


class Model:
    """A Keras model trained with the elastic plan: GA and the strategy from ``init``.

    Args:
        model: a Keras 3 model (TensorFlow backend). Its variables are moved under the
            plan's strategy by cloning when they were created outside it.
        plan, strategy: default to those of the last ``aikit.elastic.TF.init``.
    """

    def __init__(self, model: keras.Model, plan: Plan | None = None,
                 strategy: tf.distribute.Strategy | None = None):
        if isinstance(model, Model):
            model = model.model
        if not isinstance(model, keras.Model):
            raise InvalidType(f"Model wraps a keras.Model, got {type(model).__name__}")
        self.plan = plan or current_plan()
        self.strategy = strategy or published(__package__, "strategy") or tf.distribute.get_strategy()
        self.model = on_strategy(model, self.strategy)

    @property
    def step_batch_size(self) -> int:
        """Samples per micro-step over all devices: how to batch a tf.data.Dataset for ``fit``."""
        return self.plan.batch_size * self.plan.gpus

    def compile(self, optimizer: Any = "rmsprop", *args: Any, **kwargs: Any) -> None:
        """Keras' ``compile`` under the plan's strategy, with the optimizer wrapped in GA."""
        with self.strategy.scope():
            optimizer = keras.optimizers.get(optimizer)
            if isinstance(optimizer, Optimizer):
                optimizer.steps = self.plan.steps
            else:
                if not optimizer.built and not self.strategy.extended.variable_created_in_scope(
                        optimizer.iterations.value):
                    # created outside the strategy: re-create its (still empty) state inside it
                    optimizer = optimizer.from_config(optimizer.get_config())
                if self.plan.steps > 1:
                    optimizer = Optimizer(optimizer, self.plan.steps)
            self.model.compile(optimizer, *args, **kwargs)

    def _batch_size(self, batch_size: int | None, x: Any) -> int | None:
        if batch_size is not None and batch_size != self.plan.batch_size:
            raise InvalidValue(
                f"batch_size={batch_size} is not the plan's per-device micro-batch {self.plan.batch_size}: "
                "pass batch_size=aikit.elastic.TF.batch_size or leave it out (change the batch with "
                "aikit.elastic.TF.init)"
            )
        if isinstance(x, (tf.data.Dataset, keras.utils.PyDataset)) or callable(getattr(x, "__next__", None)):
            return None  # already batched: at step_batch_size samples per batch
        return self.step_batch_size

    def fit(self, x: Any = None, y: Any = None, batch_size: int | None = None, **kwargs: Any):
        """Keras' ``fit`` with the planned micro-batch on every device."""
        with self.strategy.scope():
            return self.model.fit(x, y, batch_size=self._batch_size(batch_size, x), **kwargs)

    def evaluate(self, x: Any = None, y: Any = None, batch_size: int | None = None, **kwargs: Any):
        """Keras' ``evaluate``, by default in batches of the planned micro-batch per device."""
        with self.strategy.scope():
            return self.model.evaluate(x, y, batch_size=batch_size or self._batch_size(None, x), **kwargs)

    def predict(self, x: Any, batch_size: int | None = None, **kwargs: Any):
        """Keras' ``predict``, by default in batches of the planned micro-batch per device."""
        with self.strategy.scope():
            return self.model.predict(x, batch_size=batch_size or self._batch_size(None, x), **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "model":  # not set yet: __init__ failed
            raise AttributeError(name)
        return getattr(self.model, name)

    def __call__(self, *args: Any, **kwargs: Any):
        return self.model(*args, **kwargs)
