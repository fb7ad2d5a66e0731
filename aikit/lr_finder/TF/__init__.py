"""LR range test for Keras 3 models on TensorFlow: ``from aikit.lr_finder.TF import LRFinder``."""

from aikit.optional import tensorflow  # noqa: F401  isort: skip  (first: a missing tensorflow names its extra)
from aikit.lr_finder.TF.lr_finder import LRFinder

__all__ = ["LRFinder"]
