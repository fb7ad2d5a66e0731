"""An update under AMP's ``torch.amp.GradScaler``: stepped or skipped, and what knowing it costs.

The scaler's ``unscale_`` leaves, per device, a ``found_inf`` flag on the device: whether the
update's gradient holds an inf or NaN. :func:`amp_step` makes the update from it with at most one
read from the device, and none where the optimizer takes the flag itself:

* a fused optimizer (``AdamW(fused=True)``, ``SGD(fused=True)``: ``_step_supports_amp_scaling``)
  gets the flag as a tensor and skips inside its kernel (its step count put back), so nothing is
  read at the update; whether it skipped stays on the device until someone asks (an
  ``UpdateScheduler``, ``optimizer.updated``: the GA engine's ``outcomes.settle()``), then one read for
  all the updates since. Accelerate tells a skip by whether ``optimizer.step`` ran, which a fused
  optimizer's always does (accelerate#4242: its scheduler advances on a skipped update). Only
  once the optimizer holds state (its first update applied): before, it is read as below, since
  torch 2.13's fused SGD makes its momentum buffers (``empty_like``, uninitialised) before its
  kernel skips, and a skipped first step would leave them for the next to use;
* any other optimizer's ``step()`` runs on the host, so whether to call it is read: one number,
  the read GradScaler's own ``step`` makes (``found_inf.item()``), made here in its place rather
  than besides two reads of ``get_scale()`` (before and after) that told a skip from the scale.

Without AMP aikit's own finiteness check (``skip_nonfinite``) makes the same flag, in the one pass
that also applies the update's GA scale (:func:`aikit.runtime.Torch.grads.scale_and_check_`), and
hands it to a fused optimizer the same way (:func:`step_unless`).
"""

from __future__ import annotations

from typing import Any

import torch

SCALER_METHODS = ("scale", "unscale_", "step", "update", "is_enabled", "get_scale")  # what aikit calls on one


def enabled(scaler: Any) -> bool:
    """Whether ``scaler`` is a GradScaler that scales (``GradScaler(enabled=False)`` does nothing)."""
    return scaler is not None and scaler.is_enabled()


def takes_found_inf(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` skips an inf/NaN update itself, given the flag as a tensor (fused)."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def decides_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` can be handed an inf/NaN flag now: fused, and holding state (see above)."""
    return takes_found_inf(optimizer) and bool(optimizer.state)


def step_unless(optimizer: torch.optim.Optimizer, found: torch.Tensor) -> None:
    """A fused optimizer's update, skipped inside its kernel where ``found`` (a 0-d float32 tensor
    on its device) is nonzero, nothing read: what ``GradScaler.step`` does, without a scaler (the
    flag of aikit's own finiteness check)."""
    optimizer.grad_scale, optimizer.found_inf = None, found
    try:
        optimizer.step()
    finally:
        del optimizer.grad_scale, optimizer.found_inf


def found_inf(scaler: Any, optimizer: torch.optim.Optimizer) -> torch.Tensor:
    """After ``scaler.unscale_(optimizer)``: the update's inf/NaN flag summed over its devices,
    on the scale's device (nothing read)."""
    flags = scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"].values()
    device = scaler._scale.device
    return sum(flag.to(device, non_blocking=True) for flag in flags)


def amp_step(scaler: Any, optimizer: torch.optim.Optimizer, unscaled: torch.Tensor | None = None) -> bool | None:
    """Unscale (unless ``unscaled``, the flag of an ``unscale_`` already made), step or skip, and
    update ``scaler`` once. Returns whether the update was applied, read from the device (one
    number), or None for a fused optimizer, which decided on the device (``unscaled`` holds it)."""
    if unscaled is None:
        scaler.unscale_(optimizer)
        unscaled = found_inf(scaler, optimizer)
    if decides_on_device(optimizer):
        scaler.step(optimizer)  # the flag handed to the kernel, which skips on the device
        scaler.update()
        return None
    stepped = not bool(unscaled)  # the one read
    if stepped:
        optimizer.step()
    scaler.update()
    return stepped


def amp_step_read(scaler: Any, optimizer: torch.optim.Optimizer) -> bool:
    """:func:`amp_step`, and whether the update was applied, read now (one number on every path):
    for a caller that must know before it goes on (the LR finder's next point)."""
    scaler.unscale_(optimizer)
    flag = found_inf(scaler, optimizer)
    stepped = amp_step(scaler, optimizer, flag)
    return not bool(flag) if stepped is None else stepped


def update_skipped(optimizer: Any) -> bool:
    """Whether ``optimizer``'s last ``step()`` made no update: aikit's optimizers say it with
    ``updated`` (False after an update skipped for inf/NaN, and after a micro-step that did not
    update), Accelerate's ``AcceleratedOptimizer`` with ``step_was_skipped``; a plain torch
    optimizer always updates."""
    updated = getattr(optimizer, "updated", None)
    if isinstance(updated, bool):
        return not updated
    return bool(getattr(optimizer, "step_was_skipped", False))
