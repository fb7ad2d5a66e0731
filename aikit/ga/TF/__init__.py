"""Gradient accumulation for Keras 3 (TensorFlow backend): ``optimizers.Optimizer(optimizer, steps)``."""

from aikit.ga.TF import optimizers
from aikit.ga.TF.optimizers import Optimizer

__all__ = ["Optimizer", "optimizers"]
