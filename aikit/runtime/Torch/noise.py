"""The squared norm of every micro-batch's gradient, per param group: what gradient noise is
measured from (:mod:`aikit.core.gradient_noise`), the torch counterpart of :mod:`aikit.ga.TF.noise`.

A gradient hook on every parameter takes its gradient as autograd produces it, before it is added
into ``.grad`` (so micro-batches accumulated into one ``.grad`` stay apart), and adds its squared
norm to the param group's total for the micro-batch in progress. Users close a micro-batch after
its ``backward()`` (:meth:`MicroBatchNorms.close`) and take the update's norms before its
all-reduce (:meth:`MicroBatchNorms.take`): :class:`~aikit.elastic.Torch.adascale.AdaScaleOptimizer`
sums them per group, :class:`~aikit.elastic.Torch.adaptive.AdaptiveOptimizer` keeps every
micro-batch apart.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch


class MicroBatchNorms:
    """Squared gradient norms of this replica's micro-batches, one row per micro-batch and one
    column per param group, summed in float64 for float64 parameters (float32 otherwise, which
    every accelerator has). The hooks hold the recorder weakly, so a discarded optimizer goes."""

    def __init__(self, param_groups: list[dict[str, Any]], dtype: torch.dtype) -> None:
        self.groups, self.dtype = len(param_groups), dtype
        self._current: list[tuple[int, torch.Tensor]] = []  # (group, gradient norm) of the micro-batch in progress
        self._parts: list[torch.Tensor] = []  # the closed micro-batches of this update
        self.active = True  # False: record nothing (an update that cannot measure the noise)
        owner = weakref.ref(self)
        self._hooks = [p.register_hook(functools.partial(_record, owner, index))
                       for index, group in enumerate(param_groups) for p in group["params"] if p.requires_grad]

    def _add(self, index: int, grad: torch.Tensor) -> None:
        values = grad.coalesce().values() if grad.is_sparse else grad.detach()
        self._current.append((index, torch.linalg.vector_norm(values, dtype=self.dtype)))  # one kernel a hook

    def close(self) -> None:
        """End the micro-batch in progress (call after its backward; nothing if it had none)."""
        if self._current:
            groups = torch.tensor([index for index, _ in self._current], device=self._current[0][1].device)
            norms = torch.stack([norm for _, norm in self._current]).square()
            part = torch.zeros(self.groups, dtype=self.dtype, device=norms.device)
            self._parts.append(part.index_add_(0, groups, norms))
            self._current = []

    def take(self, scaler: Any = None) -> torch.Tensor:
        """This update's norms, ``(micro-batches, groups)`` (the one in progress closed), divided
        by the square of AMP's loss scale when ``scaler`` is given; the recorder starts afresh."""
        self.close()
        parts, self._parts = self._parts, []
        norms = torch.stack(parts) if parts else torch.zeros(0, self.groups, dtype=self.dtype)
        return norms if scaler is None else norms / float(scaler.get_scale()) ** 2

    def clear(self) -> None:
        """Forget the norms recorded since the last :meth:`take` (a step cut short is retrained)."""
        self._current, self._parts = [], []

    def state(self) -> list[list[float]] | None:
        """The recorded norms, for a checkpoint taken mid-update (None when there are none)."""
        self.close()
        return [part.tolist() for part in self._parts] or None

    def load(self, saved: list[list[float]] | None, device: torch.device) -> None:
        """Put back what :meth:`state` returned."""
        if saved and not isinstance(saved[0], list):  # a checkpoint that kept one row per group
            saved = [saved]
        self._current = []
        self._parts = [torch.tensor(part, dtype=self.dtype, device=device) for part in saved or []]

    def remove(self) -> None:
        """Remove the gradient hooks."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []


def _record(owner: weakref.ref, index: int, grad: torch.Tensor) -> None:
    recorder = owner()
    if recorder is not None and recorder.active:
        recorder._add(index, grad)
