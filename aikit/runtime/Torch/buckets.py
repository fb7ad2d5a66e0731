"""The update's sum over replicas, started bucket by bucket while its last backward still runs.

Where the GA engine sums gradients over the replicas itself (``reduce=True``: Horovod, or
torchrun without DDP), :class:`Buckets` overlaps that all-reduce with the backward, as DDP's
reducer and Horovod's hooks do; :func:`assign_buckets` groups the parameters as DDP does.
"""

from __future__ import annotations

import functools
import itertools
import math
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from aikit.core.validate import checked_float
from aikit.runtime.Torch import collectives
from aikit.runtime.Torch.grads import mul_, or_zeros, stacked

FIRST_BUCKET_BYTES = 1 << 20  # DDP's first bucket (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES)
_serials = itertools.count()  # names each optimizer's buckets for Horovod: built in the same order on every rank


class Buckets:
    """The update's sum over replicas, started bucket by bucket while the last backward runs.

    As DDP's reducer and Horovod's hooks do: the parameters are grouped in reverse order (about
    the order backward finishes them), per device and dtype, into buckets of ``cap_mb`` MB (the
    first of each kind 1 MiB, so the communication starts early). During a backward for which
    ``armed()`` is true (the one that ends the update), a post-accumulate-grad hook marks each
    parameter's gradient final; a bucket whose gradients are all final is copied into one flat
    buffer, multiplied by this replica's folded factor ``factor()``, and its all-reduce started
    asynchronously, always in bucket order, so every replica starts the same all-reduces in
    the same order. :meth:`finish` (in ``step()``) starts the rest (an idle replica: all of them,
    with zeros where it has no gradient), the last bucket carrying the flags: which parameters
    have a gradient, the counts (samples), and whether some gradient grew late. Then it waits
    and writes the sums to ``.grad``. A parameter that gets no gradient in the last backward
    holds back its bucket and the later ones until :meth:`finish` (DDP would need
    ``find_unused_parameters``).

    A gradient that grows after its bucket started (a second backward in the last micro-step)
    makes every replica, told by the flags, sum the final gradients again in one all-reduce
    (exact either way; a warning says the overlap was lost).
    """

    def __init__(self, params: list[torch.Tensor], cap_mb: float, armed: Callable[[], bool],
                 factor: Callable[[], float]) -> None:
        self.cap_bytes = bucket_bytes(cap_mb)
        self.armed, self.factor = _weak(armed), _weak(factor)
        self.serial = next(_serials)
        self._warned = False
        self._hooks: list[Any] = []
        self.build(params)

    def build(self, params: list[torch.Tensor]) -> None:
        """Bucket ``params`` (again, after ``add_param_group``) and hook them."""
        for handle in self._hooks:
            handle.remove()
        self.buckets = assign_buckets(params, self.cap_bytes)
        me = weakref.ref(self)  # the hooks outlive a dropped optimizer: they must not keep it armed
        self._hooks = [p.register_post_accumulate_grad_hook(functools.partial(_final, me, index, slot))
                       for index, bucket in enumerate(self.buckets) for slot, p in enumerate(bucket)]
        self.reset()

    def reset(self) -> None:
        self.waiting = [set(range(len(bucket))) for bucket in self.buckets]  # gradients not final yet
        self.started: list[tuple[torch.Tensor, Callable[[], None]]] = []  # (flat sum, wait), in bucket order
        self.late = False  # a gradient grew after its bucket started
        self._can: bool | None = None  # whether this engine starts all-reduces asynchronously (asked once)

    def final(self, index: int, slot: int, param: torch.Tensor) -> None:
        """``param``'s gradient is final for this backward: start every bucket now complete but
        the last (it ends the backward anyway, and carries the flags from :meth:`finish`)."""
        if not self.armed():
            return
        if index < len(self.started) or param.grad.is_sparse:
            self.late = True
            return
        self.waiting[index].discard(slot)
        if self._can is None:
            self._can = collectives.can_start_all_reduce(param.device)
        while self._can and len(self.started) < len(self.buckets) - 1 and not self.waiting[len(self.started)]:
            self._start()

    def _start(self, flags: torch.Tensor | None = None) -> None:
        """Start the next bucket's all-reduce (with ``flags`` appended, if given)."""
        index = len(self.started)
        grads = or_zeros(self.buckets[index])
        flat = _flatten_dense_tensors(grads if flags is None else [*grads, flags])
        factor = self.factor()
        if factor != 1:  # each replica folded its own factor: unfold it before summing
            flat[: flat.numel() - (0 if flags is None else flags.numel())].mul_(factor)
        self.started.append((flat, collectives.start_all_reduce_sum_(flat, f"aikit.ga.{self.serial}.bucket{index}")))

    @torch.no_grad()
    def finish(self, counts: list, dtype: torch.dtype) -> list[float]:
        """Start the buckets not started yet, sum (has a gradient, ``counts``, late) over the
        replicas with the last one, wait, and put the sums in ``.grad`` (None where no replica
        had a gradient). ``counts`` may hold 0-d tensors (loss terms counted on the device).
        Returns the summed ``counts``, read."""
        try:
            last = self.buckets[-1]
            while len(self.started) < len(self.buckets) - 1:
                self._start()
            params = [p for bucket in self.buckets for p in bucket]
            flags = stacked([*(float(p.grad is not None) for p in params), *counts, float(self.late)], dtype,
                            params[0].device)
            if (last[0].dtype, last[0].device) == (flags.dtype, flags.device):  # one collective fewer
                self._start(flags)
                flags = self.started[-1][0][-flags.numel():]
            else:  # the last bucket holds half-precision gradients: flags (counts) apart, in float32
                self._start()
                self.started.append((flags, collectives.start_all_reduce_sum_(flags, f"aikit.ga.{self.serial}.flags")))
            for _, wait in self.started:
                wait()
            *used, late = flags.tolist()
            if late:  # some replica's sums started too early: one all-reduce of the final gradients
                if not self._warned:
                    self._warned = True
                    warnings.warn(
                        "a gradient grew after its bucket's all-reduce had started (a second backward in the last "
                        "micro-step of an update): the update summed every gradient again after the backward, "
                        "which is exact but gives up the overlap; run one backward per micro-step to keep it",
                        RuntimeWarning, stacklevel=4)
                grads = or_zeros(params)
                if self.factor() != 1:
                    mul_(grads, self.factor())
                collectives.all_reduce_sum_(grads)
            else:
                grads = [g for (flat, _), bucket in zip(self.started, self.buckets, strict=False)
                         for g in _unflatten_dense_tensors(flat[: sum(p.numel() for p in bucket)], bucket)]
            for p, grad, has in zip(params, grads, used, strict=False):
                p.grad = grad if has else None
            return used[len(params):]
        finally:
            self.reset()

    def __del__(self) -> None:
        for handle in self._hooks:
            handle.remove()


def bucket_bytes(cap_mb: float) -> int:
    """``bucket_cap_mb`` in bytes, or the error that names it."""
    cap_mb = checked_float(cap_mb, "bucket_cap_mb", "a positive number of megabytes (DDP's default is 25) or None",
                           lambda megabytes: 0 < megabytes < math.inf)
    return max(int(cap_mb * 1024 * 1024), 1)


def assign_buckets(params: list[torch.Tensor], cap_bytes: int) -> list[list[torch.Tensor]]:
    """``params`` in reverse order, in buckets of one device and dtype each, closed once they
    hold ``cap_bytes`` (the first of each kind :data:`FIRST_BUCKET_BYTES`), in closing order."""
    buckets: list[list[torch.Tensor]] = []
    filling: dict[tuple[torch.device, torch.dtype], tuple[list[torch.Tensor], int]] = {}
    closed: set[tuple[torch.device, torch.dtype]] = set()
    for p in reversed(params):
        kind = p.device, p.dtype
        bucket, size = filling.get(kind, ([], 0))
        bucket.append(p)
        size += p.numel() * p.element_size()
        if size >= (cap_bytes if kind in closed else min(FIRST_BUCKET_BYTES, cap_bytes)):
            buckets.append(bucket)
            closed.add(kind)
            filling.pop(kind, None)
        else:
            filling[kind] = bucket, size
    return buckets + [bucket for bucket, _ in filling.values()]


def _final(buckets: weakref.ref, index: int, slot: int, param: torch.Tensor) -> None:
    alive = buckets()
    if alive is not None:
        alive.final(index, slot, param)


def _weak(method: Callable[[], Any]) -> Callable[[], Any]:
    """``method`` without keeping its object alive (False / 1 once it is gone)."""
    ref = weakref.WeakMethod(method)
    return lambda: (ref() or (lambda: False))()
