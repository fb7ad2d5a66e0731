"""Gradient accumulation for Keras 3 (TensorFlow backend): ``optimizers.Optimizer(optimizer, steps)``,
or Run:AI's prebuilt form of any Keras optimizer, ``optimizers.Adam(steps, learning_rate=...)``."""

from aikit.optional import tensorflow  # noqa: F401  isort: skip  (first: a missing tensorflow names its extra)
from aikit.ga.TF import optimizers
from aikit.ga.TF.optimizers import Optimizer

__all__ = ["Optimizer", "optimizers"]
