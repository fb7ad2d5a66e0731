"""The seed's path of aikit's Keras GA, :mod:`aikit.keras` (on every Keras backend):
``aikit.ga.TF.optimizers.Optimizer(optimizer, steps)``, Run:AI's ``aikit.ga.TF.optimizers.Adam(steps, ...)``."""

from aikit.keras import optimizers
from aikit.keras.optimizers import Optimizer

__all__ = ["Optimizer", "optimizers"]
