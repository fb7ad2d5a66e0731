"""The seed's path of AutoLRS for Keras, :mod:`aikit.keras.autolrs` (on every Keras backend):
``model.fit(..., callbacks=[AutoLRS(val_fn, total_steps=...)])`` and ``ReplaySchedule``."""

from aikit.keras.autolrs import AutoLRS, ReplaySchedule

__all__ = ["AutoLRS", "ReplaySchedule"]
