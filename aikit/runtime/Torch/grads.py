"""Lists of gradients, in place: what the GA engine does to every parameter's ``.grad`` at once."""

from __future__ import annotations

import torch

# the gradients AMP's unscale kernel multiplies exactly as ``_foreach_mul_`` does (its scale is a
# float32 tensor, as a float32 computation casts a Python scale): float64 ones keep ``mul_``
CHECKED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def mul_(grads: list[torch.Tensor], factor: float) -> None:
    """Multiply gradients in place: one grouped kernel for the dense ones."""
    dense = [g for g in grads if not g.is_sparse]
    if dense:
        torch._foreach_mul_(dense, factor)
    for g in grads:
        if g.is_sparse:
            g.mul_(factor)


def scale_and_check_(grads: list[torch.Tensor], scale: float | torch.Tensor) -> torch.Tensor | None:
    """Multiply ``grads`` by ``scale`` and flag an inf/NaN among them in one pass over them
    (AMP's unscale kernel, which GradScaler runs), instead of a multiply and a norm: the flag, a
    0-d float32 tensor on the first gradient's device (nonzero: not finite), not read. None
    where that kernel does not apply (sparse, float64, a DTensor's shards): then ``mul_`` and
    ``total_norm``."""
    if not all(type(g) is torch.Tensor and g.layout == torch.strided and g.dtype in CHECKED_DTYPES for g in grads):
        return None
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for g in grads:
        groups.setdefault((g.device, g.dtype), []).append(g)
    found = torch.zeros((), dtype=torch.float32, device=grads[0].device)
    for (device, _), group in groups.items():
        flag = found if device == found.device else torch.zeros((), dtype=torch.float32, device=device)
        inverse = (scale.to(device=device, dtype=torch.float32).reshape(()) if isinstance(scale, torch.Tensor)
                   else torch.full((), scale, dtype=torch.float32, device=device))
        torch._amp_foreach_non_finite_check_and_unscale_(group, flag, inverse)
        if flag is not found:
            found += flag.to(found.device)
    return found


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


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of all ``grads`` together, as ``clip_grad_norm_`` computes it (a sparse
    gradient's by its values): a tensor on the first gradient's device, not read."""
    dense = [g.coalesce().values() if g.is_sparse else g for g in grads]
    get_total_norm = getattr(torch.nn.utils, "get_total_norm", None)  # torch 2.6 and later
    if get_total_norm is not None:
        return get_total_norm(dense)
    device = dense[0].device
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g).to(device) for g in dense]))


def read_norm(norm: torch.Tensor) -> float:
    """``norm`` as a number: the one read from the device an update's finiteness check makes (a
    sharded model's norm, a DTensor, whole first: every rank computes it in the same step)."""
    full_tensor = getattr(norm, "full_tensor", None)
    return float(full_tensor() if full_tensor is not None else norm)
