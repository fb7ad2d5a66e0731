"""An update's gradient noise, measured from the micro-batches GA already computes (torch).

:class:`MicroBatchNorms` takes the squared norm of every micro-batch's gradient, per param group:
a gradient hook on every parameter takes its gradient as autograd produces it, before it is added
into ``.grad`` (so micro-batches accumulated into one ``.grad`` stay apart), and adds its squared
norm to the param group's total for the micro-batch in progress. :class:`NoiseMeter` turns an
update's norms, summed over the replicas in the update's one all-reduce, and the norm of the
update's gradient into :mod:`aikit.core.gradient_noise`'s estimates, and smooths them per param
group: the one meter behind a trace optimizer's measured LR rule (AdaScale) and the adaptive
batch. The Keras counterpart is :mod:`aikit.keras.noise`.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch

from aikit.core.errors import InvalidValue
from aikit.core.gradient_noise import NoiseEstimate, NoiseTracker, update_estimates


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


def mean_sq_norms(param_groups: list[dict[str, Any]], dtype: torch.dtype, scale: float = 1.0) -> list[float]:
    """Each param group's squared norm of the update's gradient, ``scale`` times the gradients
    accumulated in ``.grad``: each parameter's squared norm in ``dtype``, added up in float64 in
    parameter order, in one read from the device (not one per parameter). What gradient noise is
    measured against."""
    squares = [(index, p.grad.to(dtype).pow(2).sum()) for index, group in enumerate(param_groups)
               for p in group["params"] if p.grad is not None]
    totals = [0.0] * len(param_groups)
    if squares:
        device = squares[0][1].device
        values = torch.stack([square.to(device) for _, square in squares]).tolist()  # the one host sync
        for (index, _), value in zip(squares, values, strict=True):
            totals[index] += value
    return [total * scale**2 for total in totals]


class NoiseMeter:
    """The gradient noise of every update of ``optimizer``, per param group, smoothed over updates
    (``decay``): the micro-batches' norms (:class:`MicroBatchNorms`, in float64 for float64
    parameters), their sum over the replicas (which rides in the update's all-reduce:
    :meth:`statistics`), and the update's gradient give one estimate per group (:meth:`measure`); a
    replica with no micro-batch in an update adds zeros. ``smoothed()`` is the whole model's,
    ``smoothed(group)`` one group's. Saved with the optimizer: :meth:`save`, :meth:`check`, :meth:`load`."""

    def __init__(self, optimizer: torch.optim.Optimizer, decay: float = 0.99) -> None:
        self.optimizer = optimizer
        first = optimizer.param_groups[0]["params"][0]
        self.device = first.device
        self.norms = MicroBatchNorms(optimizer.param_groups, torch.float64 if first.dtype == torch.float64
                                     else torch.float32)
        self.trackers = [NoiseTracker(decay) for _ in optimizer.param_groups]
        self.owner = f"{type(optimizer).__name__} state['noise']"  # what a refused state is called

    def statistics(self, scaler: Any = None) -> list[float]:
        """This replica's micro-batch norms of the update, summed per group (AMP's scale divided out)."""
        return self.norms.take(scaler).sum(0).tolist()

    def measure(self, totals: list[float], parts: int, batch: int, micro: int, scale: float | torch.Tensor,
                scaler: Any = None, whole: bool = False) -> list[NoiseEstimate] | None:
        """The update's estimate per group (``whole``: one, the whole model's) from the replicas'
        summed norms ``totals`` of ``parts`` micro-batches of ``micro`` samples, ``batch`` in all,
        and the accumulated gradient times ``scale`` (the update's mean); None where it cannot
        measure (one part, or inf/NaN)."""
        amp = scaler.get_scale() if scaler is not None else 1.0
        means = mean_sq_norms(self.optimizer.param_groups, self.norms.dtype, scale / amp)
        if whole:
            totals, means = [sum(totals)], [sum(means)]
        return update_estimates([total * micro for total in totals], parts, batch, means)

    def fold(self, estimates: list[NoiseEstimate] | None) -> None:
        """Smooth in an update's estimates (nothing for an update that measured none)."""
        for tracker, noise in zip(self.trackers, estimates or (), strict=False):
            tracker.update(noise)

    def observe(self, totals: list[float], parts: int, batch: int, micro: int, scale: float | torch.Tensor,
                scaler: Any = None) -> None:
        """:meth:`measure` an update and :meth:`fold` it in (nothing from one part alone)."""
        if parts >= 2:
            self.fold(self.measure(totals, parts, batch, micro, scale, scaler))

    def smoothed(self, group: int | None = None) -> NoiseEstimate | None:
        """The smoothed noise of one group, or of the whole model (the groups' sums); None before a first estimate."""
        if group is not None:
            return self.trackers[group].measured
        if not self.trackers[0].updates:
            return None
        groups = [tracker.smoothed for tracker in self.trackers]
        return NoiseEstimate(grad_sq=sum(n.grad_sq for n in groups), trace=sum(n.trace for n in groups))

    def save(self) -> dict:
        """The smoothed noise and the norms of an update in progress (a checkpoint mid-update)."""
        return {"trackers": [tracker.state_dict() for tracker in self.trackers], "pending": self.norms.state()}

    def check(self, state: object) -> list[NoiseTracker]:
        """The trackers ``state`` holds, checked whole against this meter's groups (nothing changed)."""
        if not isinstance(state, dict) or not {"trackers", "pending"} <= set(state) \
                or len(state["trackers"]) != len(self.trackers):
            raise InvalidValue(f"{self.owner} needs keys ['pending', 'trackers'] with one tracker per param group "
                               f"({len(self.trackers)})")
        trackers = [NoiseTracker() for _ in self.trackers]
        for tracker, saved in zip(trackers, state["trackers"], strict=True):
            tracker.load_state_dict(saved)
        return trackers

    def load(self, state: dict) -> None:
        self.trackers = self.check(state)
        self.norms.load(state["pending"], self.device)
