"""AutoLRS for PyTorch: ``AutoLRS(model, optimizer, val_fn, min_lr, max_lr)`` and its
``on_train_batch_end(loss)`` hook, in-process (no socket server) and data-parallel aware."""

from aikit.optional import torch  # noqa: F401  isort: skip  (first: a missing torch names its extra)
from aikit.autolrs.Torch.autolrs import AutoLRS, ReplaySchedule

__all__ = ["AutoLRS", "ReplaySchedule"]
