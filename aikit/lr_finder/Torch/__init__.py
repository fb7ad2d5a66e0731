"""LR range test for PyTorch, a drop-in for torch-lr-finder 0.2.2.

``from aikit.lr_finder.Torch import LRFinder`` in place of ``from torch_lr_finder import LRFinder``.
"""

from aikit.optional import torch  # noqa: F401  isort: skip  (first: a missing torch names its extra)
from aikit.lr_finder.Torch.data import DataLoaderIter, TrainDataLoaderIter, ValDataLoaderIter
from aikit.lr_finder.Torch.lr_finder import LRFinder, StateCacher

__all__ = ["DataLoaderIter", "LRFinder", "StateCacher", "TrainDataLoaderIter", "ValDataLoaderIter"]
