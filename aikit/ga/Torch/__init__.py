"""Gradient accumulation for PyTorch: ``aikit.ga.Torch.optim.Optimizer(optimizer, steps)``, or
Run:AI's prebuilt form of any torch optimizer, ``aikit.ga.Torch.optim.Adam(steps, params, ...)``."""

from aikit.optional import torch  # noqa: F401  isort: skip  (first: a missing torch names its extra)
from aikit.ga.Torch import optim
from aikit.ga.Torch.optim import Optimizer

__all__ = ["Optimizer", "optim"]
