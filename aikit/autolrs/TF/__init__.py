"""AutoLRS for Keras 3: ``model.fit(..., callbacks=[AutoLRS(val_fn, total_steps=...)])``, and
``ReplaySchedule`` to train again on the schedule it found, without search."""

from aikit.optional import tensorflow  # noqa: F401  isort: skip  (first: a missing tensorflow names its extra)
from aikit.autolrs.TF.autolrs import AutoLRS, ReplaySchedule

__all__ = ["AutoLRS", "ReplaySchedule"]
