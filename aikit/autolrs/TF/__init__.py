"""AutoLRS for Keras 3: ``model.fit(..., callbacks=[AutoLRS(val_fn, min_lr, max_lr)])``."""

from aikit.optional import tensorflow  # noqa: F401  isort: skip  (first: a missing tensorflow names its extra)
from aikit.autolrs.TF.autolrs import AutoLRS

__all__ = ["AutoLRS"]
