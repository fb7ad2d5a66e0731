"""Checks that a saved optimizer state fits the optimizer it is loaded into, made before anything
changes (torch checks the groups too, but only once it is loading), so a failed load changes
nothing."""

from __future__ import annotations

from typing import Any

import torch

from aikit.core.errors import InvalidValue


def check_groups(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """Refuse a torch optimizer state that does not fit ``optimizer``'s groups."""
    if not isinstance(saved, dict) or "param_groups" not in saved:
        raise InvalidValue("the checkpoint's optimizer entry is not a torch optimizer state_dict")
    have = [len(g["params"]) for g in optimizer.param_groups]
    got = [len(g["params"]) for g in saved["param_groups"]]
    if have != got:
        raise InvalidValue(
            f"the checkpoint's optimizer has parameter groups of sizes {got}, this one {have}: build the "
            "optimizer over the same parameters as the run that saved it"
        )


def check_pending(params: list[torch.Tensor], pending: list[Any]) -> None:
    """Refuse pending gradients (accumulated mid-update) that do not fit ``params``."""
    if len(pending) != len(params):
        raise InvalidValue(f"the checkpoint holds {len(pending)} pending gradients for {len(params)} parameters")
    for index, (p, grad) in enumerate(zip(params, pending, strict=True)):
        if grad is not None and tuple(grad.shape) != tuple(p.shape):
            raise InvalidValue(
                f"the checkpoint's pending gradient {index} has shape {tuple(grad.shape)}, its parameter "
                f"{tuple(p.shape)}: resume with the model that saved it"
            )
