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


def stacked(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Numbers and 0-d tensors (counts summed on a device) as one 1-d tensor, in order, the
    tensors' values not read: one collective carries them all without a host sync."""
    if not any(isinstance(value, torch.Tensor) for value in values):
        return torch.tensor(values, dtype=dtype, device=device)
    parts, numbers = [], []
    for value in values:
        if isinstance(value, torch.Tensor):
            if numbers:
                parts.append(torch.tensor(numbers, dtype=dtype, device=device))
                numbers = []
            parts.append(value.to(device=device, dtype=dtype).reshape(1))
        else:
            numbers.append(value)
    if numbers:
        parts.append(torch.tensor(numbers, dtype=dtype, device=device))
    return torch.cat(parts)
