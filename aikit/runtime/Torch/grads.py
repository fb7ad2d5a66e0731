"""Lists of gradients, in place: what the GA engine does to every parameter's ``.grad`` at once."""

from __future__ import annotations

import torch


def mul_(grads: list[torch.Tensor], factor: float) -> None:
    """Multiply gradients in place: one grouped kernel for the dense ones."""
    dense = [g for g in grads if not g.is_sparse]
    if dense:
        torch._foreach_mul_(dense, factor)
    for g in grads:
        if g.is_sparse:
            g.mul_(factor)


def or_zeros(params: list[torch.Tensor]) -> list[torch.Tensor]:
    """Every parameter's gradient, zeros where it has none: what a replica adds to a sum over
    replicas for a parameter it did not touch."""
    return [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
