"""Hugging Face Accelerate with aikit's plan: the global batch kept when the per-device batch changes.

Accelerate leaves the global batch to arithmetic the user writes: ``Accelerator(gradient_accumulation_steps=k)``
beside a loader's ``batch_size``. Its ``find_executable_batch_size`` retries after an out-of-memory
error at 0.9 times the batch (PR #3684), and its example recomputes GA as ``observed // batch``:
128 -> 115 gives one GA step, a global batch of 115. :class:`GlobalBatch` keeps ``G``: every
per-device batch it hands out is the device batch of an even plan of ``G`` over Accelerate's
processes (:func:`aikit.core.device_batch.device_batches`), it sets the accelerator's GA steps to
the plan's, and its :meth:`~GlobalBatch.reduce_batch_size` (``find_executable_batch_size``'s
``reduce_batch_size_fn``) steps to the next such plan: 128, 64, 32, ... on one process.

A mean over loss terms (a language model's tokens) is exact only when every micro-batch's sum is
divided by the update's count over all processes, not by its own (transformers #34191):
:meth:`GlobalBatch.updates` groups the micro-batches of each update and sums their counts over the
processes in one all-reduce of one number, a tensor never read on the host (Accelerate's own recipe
calls ``.item()``, a host sync per update).
"""

from __future__ import annotations

from aikit.optional import accelerate  # noqa: F401  isort: skip  (first: a missing accelerate names its extra)
import contextlib
import functools
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

import torch
from accelerate import Accelerator

from aikit.core.device_batch import device_batches, smaller_plan, steps_note
from aikit.core.errors import InvalidType, InvalidValue, SmallSplitWarning, TrainingFailed
from aikit.core.ga import mean_scale
from aikit.core.plan import Plan, make_plan, nearest_even_batches
from aikit.core.validate import callable_with, positive_int
from aikit.runtime.Torch import memory
from aikit.runtime.Torch.accumulator import checked_count

__all__ = ["GlobalBatch", "Update", "even_device_batches"]


def even_device_batches(global_batch_size: int, devices: int, max_device_batch: int | None = None) -> list[int]:
    """The per-device batches of the even plans of ``global_batch_size`` on ``devices`` (every
    device the same batch in every GA step: what a plain ``DataLoader(batch_size=b)`` feeds), at
    most ``max_device_batch``, largest first."""
    sizes = device_batches(global_batch_size, devices, "error")
    if max_device_batch is None:
        return sizes
    limit = positive_int(max_device_batch, "max_device_batch")
    return [size for size in sizes if size <= limit]  # never empty: 1 is every even plan's last


class GlobalBatch:
    """``global_batch_size`` samples per update on the processes of ``accelerator``, at most
    ``max_device_batch`` per process and GA step (None: the whole share of one process).

    The constructor plans (the largest even plan) and changes nothing; :meth:`use` sets the
    accelerator's ``gradient_accumulation_steps``; :meth:`find_executable_batch_size` is
    Accelerate's, stepping down the plans of ``G`` on out-of-memory errors.
    """

    def __init__(self, accelerator: Accelerator, global_batch_size: int, max_device_batch: int | None = None):
        if not isinstance(accelerator, Accelerator):
            raise InvalidType(f"GlobalBatch needs the run's accelerate.Accelerator, got {type(accelerator).__name__}: "
                              "GlobalBatch(accelerator, global_batch_size)")
        self.accelerator = accelerator
        self.global_batch_size = positive_int(global_batch_size, "global_batch_size")
        self.devices = accelerator.num_processes
        self.plan = self._plan(even_device_batches(self.global_batch_size, self.devices, max_device_batch)[0])
        wanted = min(self.global_batch_size // self.devices or 1,
                     self.global_batch_size if max_device_batch is None else max_device_batch)
        if 2 * self.plan.device_batch <= wanted:
            below, above = nearest_even_batches(self.global_batch_size, wanted, self.devices)
            warnings.warn(SmallSplitWarning(
                f"global batch {self.global_batch_size} splits evenly over {self.devices} process(es) only as "
                f"{steps_note(self.plan)} ({wanted} per device asked for): kept, but slow; a global batch of {below} "
                f"or {above} splits at up to {wanted} per device"), stacklevel=2)
        self.tried: list[int] = []  # the per-device batches that ran out of memory, in order

    def _plan(self, device_batch: int) -> Plan:
        return make_plan(self.global_batch_size, device_batch, self.devices, policy="error",
                         rank=self.accelerator.process_index)

    @property
    def device_batch(self) -> int:
        """The per-device batch of the current plan: the ``DataLoader``'s ``batch_size``."""
        return self.plan.device_batch

    @property
    def steps(self) -> int:
        """The current plan's GA steps per update."""
        return self.plan.micro_steps

    def use(self, device_batch: int) -> Plan:
        """The plan at ``device_batch``, made current: the accelerator's GA steps set to its steps."""
        sizes = even_device_batches(self.global_batch_size, self.devices)
        if positive_int(device_batch, "device_batch") not in sizes:
            raise InvalidValue(
                f"device_batch {device_batch} is no even plan's per-device batch of global batch "
                f"{self.global_batch_size} on {self.devices} process(es): use one of {sizes[:12]} (GlobalBatch's "
                "find_executable_batch_size hands out only these)")
        plan = self._plan(device_batch)
        self.plan = plan
        self.accelerator.gradient_accumulation_steps = plan.micro_steps
        return plan

    def reduce_batch_size(self) -> int:
        """``find_executable_batch_size``'s ``reduce_batch_size_fn``: the next smaller per-device
        batch whose plan holds the global batch (more GA steps), not 0.9 times the last."""
        self.tried.append(self.plan.device_batch)
        smaller = smaller_plan(self.plan)
        if smaller is None:
            error = sys.exc_info()[1]  # Accelerate calls this while handling the out-of-memory error
            raise TrainingFailed(
                f"out of memory even at 1 sample per process (global batch {self.global_batch_size} on "
                f"{self.devices} process(es); tried per-device batches {self.tried}"
                f"{f'; the last failed with {str(error).splitlines()[0][:200]!r}' if error else ''}): the model's "
                "step does not fit at all: free memory (gradient checkpointing, mixed precision, a smaller model) or "
                "shard the model (FSDP, DeepSpeed)")
        self.plan = smaller
        return smaller.device_batch

    def find_executable_batch_size(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Accelerate's ``find_executable_batch_size`` loop over the plans of the global batch:
        ``function(device_batch, ...)`` runs with the accelerator's GA steps set to the plan's and,
        when it runs out of memory, again at the next plan's per-device batch
        (:meth:`reduce_batch_size`). Out of memory is what aikit's ``init(G, "auto")`` and
        ``AutoBatch`` retry (:func:`aikit.runtime.Torch.memory.out_of_memory`): Accelerate's own
        loop takes only a ``RuntimeError`` with its phrases, so Python's ``MemoryError`` ended the run."""
        callable_with(function, "find_executable_batch_size's function", "function(device_batch, ...), the "
                      "per-device batch first", "def train(device_batch): ... (a DataLoader of "
                      "batch_size=device_batch in it)", more=True)

        @functools.wraps(function)
        def planned(*args, **kwargs):
            device_batch = self.device_batch
            while True:
                self.use(device_batch)
                try:
                    return function(device_batch, *args, **kwargs)
                except Exception as error:  # the user's training: out of memory re-plans, any other is raised
                    if not memory.out_of_memory(error):
                        raise
                    device_batch = self.reduce_batch_size()  # in here: it names the error
                memory.free()  # out here: the failed try's frames and tensors are gone

        return planned

    def updates(self, batches: Iterable, count: Callable[[Any], Any]) -> Iterator[Update]:
        """The updates of ``batches`` (this process's loader): each the plan's GA steps of
        micro-batches, with ``count(batch)`` (its loss terms: tokens whose label is not ignored,
        or its samples; an int or an integer tensor of one element) summed over the micro-batches
        and over every process, left on the device. A last update short of micro-batches is left
        out: it would not hold the global batch; a loader without one whole update is refused."""
        batches, updates = iter(batches), 0
        while len(micro_batches := list(islice(batches, self.steps))) == self.steps:
            counts = [self._count(count, batch) for batch in micro_batches]
            total = self.accelerator.reduce(torch.stack(counts).sum(), "sum")
            updates += 1
            yield Update(self.accelerator, micro_batches, total, self.steps)
        if not updates:
            raise InvalidValue(
                f"the loader gave {len(micro_batches)} micro-batch(es), fewer than one update's {self.steps} "
                f"(global batch {self.global_batch_size} as {steps_note(self.plan)} on {self.devices} process(es)): "
                "nothing was trained; give each process at least one update's micro-batches (a data set of at "
                f"least {self.global_batch_size} samples, DataLoader(batch_size=global_batch.device_batch))")

    def _count(self, count: Callable[[Any], Any], batch: Any) -> torch.Tensor:
        """``count(batch)`` checked (:func:`aikit.runtime.Torch.accumulator.checked_count`), a
        0-d tensor on the accelerator's device."""
        value = count(batch)
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.reshape(())
        value = checked_count(value, "count(batch)")
        return torch.as_tensor(value, device=self.accelerator.device)


class Update:
    """One update's micro-batches and ``total``, their loss terms over every process (a tensor).

    :meth:`loss` turns a micro-batch's *summed* loss into what ``accelerator.backward`` needs for
    the update to be the mean over all ``total`` terms: Accelerate divides every backward by its GA
    steps and DDP averages over the processes, so both are multiplied back (core.ga's ``mean_scale``).
    """

    def __init__(self, accelerator: Accelerator, micro_batches: list, total: torch.Tensor, steps: int):
        self.accelerator, self.micro_batches, self.total, self.steps = accelerator, micro_batches, total, steps

    def accumulate(self, model: torch.nn.Module) -> Iterator[Any]:
        """The micro-batches, every one but the last under ``accelerator.no_sync(model)``: one
        gradient all-reduce per update."""
        for index, batch in enumerate(self.micro_batches):
            last = index == len(self.micro_batches) - 1
            with contextlib.nullcontext() if last else self.accelerator.no_sync(model):
                yield batch

    def loss(self, loss_sum: torch.Tensor) -> torch.Tensor:
        """``loss_sum`` (the micro-batch's loss summed over its terms) scaled for ``accelerator.backward``."""
        total = self.total.clamp(min=1).to(loss_sum.dtype)  # an integer count: divided in the loss's precision
        scale = mean_scale(total, averaging_replicas=self.accelerator.num_processes)
        return loss_sum * (scale * self.steps)
