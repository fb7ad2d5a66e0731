"""Where each micro-batch of one update lies among the update's ``G`` samples.

An update of a :class:`~aikit.core.plan.Plan` consumes ``G`` consecutive samples (a *window*
of a shuffled epoch). They are laid out step by step, and inside a step device by device, so a
GA step over all devices is one contiguous chunk: exactly what a single-process
``torch.nn.DataParallel`` loader yields and scatters. Every rank of a multi-process run slices
the same window (same seed) and takes its own pieces, so no sample is lost or repeated.
"""

from __future__ import annotations

from itertools import accumulate

from aikit.core.plan import Plan


def micro_batch_slices(plan: Plan, device: int | None = None) -> list[slice]:
    """One slice per GA step into a window of ``plan.global_batch_size`` samples: the samples
    ``device`` processes in that step, or with ``device=None`` the whole step over all devices
    (the batch a DataParallel loader yields). A device sitting a step out gets an empty slice."""
    if device is not None and not (
        isinstance(device, int) and not isinstance(device, bool) and 0 <= device < plan.gpus
    ):
        raise ValueError(f"device must be an integer in [0, {plan.gpus - 1}] for this plan, got {device!r}")
    starts = list(accumulate((size for step in plan.micro_batch_sizes for size in step), initial=0))
    n = plan.gpus
    if device is None:
        return [slice(starts[s * n], starts[(s + 1) * n]) for s in range(plan.steps)]
    return [slice(starts[s * n + device], starts[s * n + device + 1]) for s in range(plan.steps)]
