"""The seed's path of the Keras LR range test, :mod:`aikit.keras.lr_finder` (on every Keras backend):
``from aikit.lr_finder.TF import LRFinder``."""

from aikit.keras.lr_finder import LRFinder

__all__ = ["LRFinder"]
