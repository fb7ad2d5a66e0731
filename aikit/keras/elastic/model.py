"""``Model(model)``: a Keras model that trains by the elastic plan of ``aikit.keras.elastic.init``.

``compile`` wraps the optimizer in aikit's GA (``plan.micro_steps`` micro-steps per update) and
runs Keras' ``compile`` where the plan trains (a ``tf.distribute`` strategy's scope on
TensorFlow, the ``keras.distribution``'s on JAX); ``fit`` feeds the planned micro-batch to
every device. An epoch is still one pass over the data (an update
continues into the next epoch when an epoch's micro-batches are not a multiple of
``plan.micro_steps``; no sample is dropped); batch-level callbacks fire per micro-step, as in
Keras, and ``model.optimizer.iterations`` counts real updates. Everything else -- ``evaluate``,
``predict``, ``save``, ``summary``, attributes -- is the wrapped Keras model's.
"""

from __future__ import annotations

from typing import Any

from aikit.core.errors import InvalidState, InvalidType, InvalidValue
from aikit.core.plan import Plan
from aikit.keras.optimizers import Optimizer
from aikit.runtime.Keras.backend import check_backend, keras, seam
from aikit.runtime.Keras.batches import check_lengths
from aikit.runtime.process import published


def current_plan() -> Plan:
    """The plan of the last :func:`aikit.keras.elastic.init`, or an error saying to call it."""
    plan = published(__package__)  # what aikit.keras.elastic.init published
    if plan is None:
        raise InvalidState(
            "aikit.elastic.TF.init(global_batch_size, max_device_batch) (aikit.keras.elastic.init) must be called "
            "before wrapping or compiling a model"
        )
    return plan


def _batched(x: Any) -> bool:
    """Data that arrives in batches already (a tf.data.Dataset, a PyDataset, an iterator)."""
    return (isinstance(x, keras.utils.PyDataset) or type(x).__module__.startswith("tensorflow")
            or callable(getattr(x, "__next__", None)))


class Model:
    """A Keras model trained with the elastic plan: GA and the strategy from ``init``.

    Args:
        model: a Keras 3 model. Its variables are moved where the plan trains by cloning when they
            were created outside it (outside the strategy; before the distribution was set).
        plan, strategy: default to those of the last ``aikit.keras.elastic.init`` (``strategy``:
            TensorFlow's; on JAX the published ``keras.distribution`` is used).
    """

    def __init__(self, model: keras.Model, plan: Plan | None = None, strategy: Any = None):
        check_backend("aikit.keras.elastic.Model")
        if isinstance(model, Model):
            model = model.model
        if not isinstance(model, keras.Model):
            raise InvalidType(f"Model wraps a keras.Model, got {type(model).__name__}")
        self.plan = plan or current_plan()
        extras = {name: published(__package__, name) for name in ("strategy", "distribution")}
        self.strategy = seam.placement(strategy, {k: v for k, v in extras.items() if v is not None})
        self.model = seam.placed(model, self.strategy)

    @property
    def step_batch_size(self) -> int:
        """Samples per micro-step over the devices this process feeds (all of them but on JAX over
        several processes): how to batch a tf.data.Dataset for ``fit``."""
        return self.plan.device_batch * seam.feeding_devices(self.plan)

    def compile(self, optimizer: Any = "rmsprop", *args: Any, **kwargs: Any) -> None:
        """Keras' ``compile`` under the plan's strategy, with the optimizer wrapped in GA."""
        with seam.scope(self.strategy):
            optimizer = keras.optimizers.get(optimizer)
            if isinstance(optimizer, Optimizer):
                optimizer.steps = self.plan.micro_steps
            else:
                # created outside the strategy or distribution: its (still empty) state re-created inside
                optimizer = seam.fresh_optimizer(optimizer, self.strategy)
                if self.plan.micro_steps > 1:
                    optimizer = Optimizer(optimizer, self.plan.micro_steps)
            self.model.compile(optimizer, *args, **kwargs)
            if isinstance(optimizer, Optimizer):
                optimizer.match_loss(self.model)  # the compiled loss's reduction (sum or mean), or a mismatch refused

    def _batch_size(self, batch_size: int | None, x: Any) -> int | None:
        if batch_size is not None and batch_size != self.plan.device_batch:
            raise InvalidValue(
                f"batch_size={batch_size} is not the plan's per-device micro-batch {self.plan.device_batch}: "
                "pass batch_size=aikit.keras.elastic.batch_size or leave it out (change the batch with "
                "aikit.keras.elastic.init)"
            )
        if _batched(x):
            return None  # already batched: at step_batch_size samples per batch
        return self.step_batch_size

    def fit(self, x: Any = None, y: Any = None, batch_size: int | None = None, **kwargs: Any):
        """Keras' ``fit`` with the planned micro-batch on every device."""
        arrays = (x, y) if kwargs.get("sample_weight") is None else (x, y, kwargs["sample_weight"])
        if all(hasattr(part, "shape") for part in arrays):  # arrays (not a dict of inputs, nor a dataset)
            check_lengths(arrays, "Model.fit(x, y)")
        batch_size = self._batch_size(batch_size, x)
        if batch_size is not None and hasattr(x, "__len__"):
            seam.check_batches(self.model, len(x), batch_size)
        with seam.scope(self.strategy):
            seam.check_placed(self.model, "Model.fit")
            return self.model.fit(x, y, batch_size=batch_size, **kwargs)

    def evaluate(self, x: Any = None, y: Any = None, batch_size: int | None = None, **kwargs: Any):
        """Keras' ``evaluate``, by default in batches of the planned micro-batch per device."""
        if batch_size is None and hasattr(x, "__len__") and not _batched(x):
            seam.check_batches(self.model, len(x), self.step_batch_size)
        with seam.scope(self.strategy):
            return self.model.evaluate(x, y, batch_size=batch_size or self._batch_size(None, x), **kwargs)

    def predict(self, x: Any, batch_size: int | None = None, **kwargs: Any):
        """Keras' ``predict``, by default in batches of the planned micro-batch per device."""
        with seam.scope(self.strategy):
            return self.model.predict(x, batch_size=batch_size or self._batch_size(None, x), **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "model":  # not set yet: __init__ failed
            raise AttributeError(name)
        return getattr(self.model, name)

    def __call__(self, *args: Any, **kwargs: Any):
        return self.model(*args, **kwargs)
