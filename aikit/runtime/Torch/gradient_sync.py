"""How to keep a wrapped model's backward from syncing gradients over replicas: one place, by
model type, for the micro-steps of an update before its last.

DistributedDataParallel (and FSDP1) all-reduce in every backward unless it runs inside their
``no_sync()``; a plain model syncs nothing. A wrapper that syncs another way (FSDP2's
``set_requires_gradient_sync``) gets its entry here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch


def sync_skipper(model: torch.nn.Module | None) -> Callable[[], contextlib.AbstractContextManager] | None:
    """The context in which a backward of ``model`` syncs no gradients (DDP's ``no_sync``), or
    None where the model's backward syncs none anyway (a plain model, or no model)."""
    return getattr(model, "no_sync", None)
