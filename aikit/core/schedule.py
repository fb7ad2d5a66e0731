"""Which samples every replica processes in every step of a batch-size trace.

An epoch is one pass over a fresh permutation of the data set (seeded by ``seed`` and the
epoch, identical on every replica): ``numpy.random.default_rng([seed, epoch])`` unless a
``permutation`` function says otherwise (the torch sampler passes eth-easl's
``torch.randperm`` order that way; the core imports no framework). Trace steps are packed into the epoch in order while
their samples fit; a step never straddles two epochs, so the step that would overflow opens
the next epoch and the epoch's last few samples (fewer than that step needs) are left out of
that epoch only. Each step of global batch ``B`` is cut into ``B / micro_batch`` full
micro-batches (static shapes), dealt round-robin to the replicas: micro-batch ``j`` goes to
replica ``j % num_replicas``. With ``max_device_batch`` instead, each step is split evenly over
the replicas in the fewest micro-batches of at most that many samples
(:func:`aikit.core.plan.even_micro_batches`): the micro-batch grows with the step.
A replica dealt fewer micro-batches than another has nothing to
fill in: it contributes zero weight for the missing ones and still joins the step's single
all-reduce. Every micro-batch's gradient enters its update with the share ``micro-batch / B``.

Where the trace ends is the trace's policy (see :mod:`aikit.core.trace`): with ``"error"`` an
epoch the trace does not cover to its end raises :class:`TraceExhaustedError`; with
``"stop"`` that last epoch is cut short where the trace ends.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from aikit.core.batch_schedule import world_fit_problem
from aikit.core.errors import InvalidType, InvalidValue
from aikit.core.ga import sample_share
from aikit.core.plan import even_micro_batches, even_split_problems
from aikit.core.trace import Trace, TraceExhaustedError, TraceTooShortError, load_trace, multiple_problems
from aikit.core.validate import checked_bool, non_negative_int, positive_int

MAX_DATASET_SIZE = 2**40  # every epoch holds a permutation of the data set in memory (8 bytes a sample)
MAX_REPLICAS = 2**31 - 1

Permutation = Callable[[int, int, int], np.ndarray]
"""``permutation(seed, epoch, dataset_size)``: the epoch's sample order, a permutation of ``range(dataset_size)``."""


def numpy_permutation(seed: int, epoch: int, dataset_size: int) -> np.ndarray:
    """aikit's sample order: a permutation from NumPy's PCG64 seeded with ``[seed, epoch]``
    (independent streams per epoch, where ``seed + epoch`` would make run 1's epoch 1 run 2's epoch 0)."""
    return np.random.default_rng([seed, epoch]).permutation(dataset_size)


@dataclass(frozen=True)
class EpochSchedule:
    """The steps of one epoch: their global batch sizes and the sample order they draw from."""

    epoch: int
    first_step: int  # index of the epoch's first step in the trace
    batch_sizes: np.ndarray  # global batch of each step of the epoch
    order: np.ndarray  # permutation of the data set; steps consume it front to back
    micro_batch: int | None  # samples per micro-batch; None where each step has its own (step_micro_batch)
    num_replicas: int
    complete: bool  # False for the last epoch of a 'stop' trace, cut short by the trace's end
    step_micro_batch: np.ndarray | None = None  # each step's micro-batch where it varies (max_device_batch)

    def __len__(self) -> int:
        return len(self.batch_sizes)

    @cached_property
    def offsets(self) -> np.ndarray:
        """Where each step's samples start in ``order``."""
        return np.concatenate(([0], np.cumsum(self.batch_sizes)[:-1]))

    @cached_property
    def micro_sizes(self) -> np.ndarray:
        """Samples in each step's micro-batches: ``micro_batch``, or the step's own where it varies."""
        if self.step_micro_batch is None:
            return np.full(len(self.batch_sizes), self.micro_batch, dtype=np.int64)
        return self.step_micro_batch

    def micro_size(self, step: int) -> int:
        """Samples in each micro-batch of ``step``."""
        return int(self.micro_sizes[step])

    @cached_property
    def micro_batches_per_step(self) -> np.ndarray:
        """Micro-batches of each step over all replicas."""
        return self.batch_sizes // self.micro_sizes

    def counts(self, replica: int) -> np.ndarray:
        """Micro-batches each step deals to ``replica`` (0 where it only joins the all-reduce);
        read-only, computed once per replica (an adaptive optimizer reads them at every micro-step)."""
        counts = self._counts.get(replica)
        if counts is None:
            counts = (self.micro_batches_per_step - replica + self.num_replicas - 1) // self.num_replicas
            counts.flags.writeable = False
            self._counts[replica] = counts
        return counts

    @cached_property
    def _counts(self) -> dict[int, np.ndarray]:
        return {}

    @cached_property
    def micro_steps(self) -> np.ndarray:
        """Micro-batches of the busiest replica in each step."""
        return self.counts(0)

    @property
    def samples(self) -> int:
        """Samples the epoch uses, over all replicas."""
        return int(self.batch_sizes.sum())

    def micro_batch_ids(self, step: int, replica: int) -> range:
        """Which of the epoch's micro-batches ``replica`` processes in ``step``: micro-batch ``b``
        holds ``order[b * micro_batch : (b + 1) * micro_batch]``, and a step's ``j``-th goes
        to replica ``j % num_replicas`` (eth-easl's ``get_batch_assignments``). Needs one
        micro-batch size for the epoch."""
        if self.step_micro_batch is not None:
            raise InvalidValue("micro-batch ids number micro-batches of one size; this schedule's vary by step "
                               "(max_device_batch): use micro_batches(step, replica)")
        first = int(self.offsets[step]) // self.micro_batch
        return range(first + replica, first + int(self.micro_batches_per_step[step]), self.num_replicas)

    def micro_batches(self, step: int, replica: int) -> list[np.ndarray]:
        """Sample indices of each micro-batch ``replica`` processes in ``step`` of this epoch: the
        step's ``j``-th micro-batch goes to replica ``j % num_replicas``."""
        start, mb = int(self.offsets[step]), self.micro_size(step)
        return [self.order[start + j * mb : start + (j + 1) * mb]
                for j in range(replica, int(self.micro_batches_per_step[step]), self.num_replicas)]

    def step_indices(self, step: int) -> np.ndarray:
        """All sample indices of one step over all replicas (the big batch it equals)."""
        start = int(self.offsets[step])
        return self.order[start : start + int(self.batch_sizes[step])]

    def share(self, step: int) -> float:
        """The share of one micro-batch's mean-loss gradient in the update of ``step``."""
        return sample_share(self.micro_size(step), int(self.batch_sizes[step]))


def split_minimums(first: int, end: int, min_micro_batches: int, noise_every: int | None,
                   noise_until: int | None = None) -> np.ndarray:
    """The fewest micro-batches of steps ``first..end-1`` split by ``max_device_batch``:
    ``min_micro_batches``, and two on every ``noise_every``-th step (0, k, 2k, ...) before step
    ``noise_until`` (None: all), where an adaptive run on one device measures the gradient noise
    from the two halves of one update (until it holds its batch)."""
    steps = np.arange(first, end)
    if not noise_every:
        return np.full(len(steps), min_micro_batches, dtype=np.int64)
    return np.where(splits_for_noise(steps, noise_every, noise_until), max(min_micro_batches, 2), min_micro_batches)


def splits_for_noise(step: int | np.ndarray, noise_every: int | None,
                     noise_until: int | None = None) -> bool | np.ndarray:
    """Whether ``step`` (an int, or each of an array) is one :func:`split_minimums` splits in two
    to measure the noise: a multiple of ``noise_every`` before ``noise_until`` (None: all)."""
    if not noise_every:
        return False if np.ndim(step) == 0 else np.zeros(len(step), dtype=bool)
    measured = step % noise_every == 0
    return measured if noise_until is None else measured & (step < noise_until)


def schedule_problems(trace: Trace, dataset_size: int, num_replicas: int, micro_batch: int, balanced: bool = False, *,
                      max_device_batch: int | None = None, min_micro_batches: int = 1, noise_every: int | None = None,
                      noise_until: int | None = None, name: str = "micro_batch") -> list[str]:
    """Every reason ``trace`` cannot be scheduled with these settings (empty when it can);
    ``name``: what the messages call the micro-batch (the name its caller wrote)."""
    if max_device_batch is not None:
        if noise_every and not trace.is_finite:  # a repeated row may fall on any step: it must split both ways
            minimums = [min_micro_batches, max(min_micro_batches, 2)]
        else:
            minimums = [split_minimums(0, len(trace), min_micro_batches, noise_every, noise_until)]
        problems = []
        for least in minimums:
            problems = problems or even_split_problems(trace.sizes, max_device_batch, num_replicas, least)
    else:
        unit = micro_batch * (num_replicas if balanced else 1)
        what = f"{name} x num_replicas" if balanced else name
        problems = multiple_problems(trace, unit, what)
    for row in np.flatnonzero(trace.sizes > dataset_size).tolist():
        problems.append(
            f"row {row} (step {row}): batch size {int(trace.sizes[row])} is larger than the "
            f"data set ({dataset_size} samples); a step cannot span epochs"
        )
    return problems


def world_problem(trace: Trace, from_step: int, micro_batch: int, num_replicas: int) -> str | None:
    """Why the steps of ``trace`` from ``from_step`` on cannot each be dealt to ``num_replicas``
    replicas as the same number of whole micro-batches (Megatron's condition), with the world
    sizes that can; None when they can. The steps before were trained already, maybe on another
    number of replicas: only the rest must fit (Megatron #3913's check after a checkpoint load)."""
    sizes = trace.sizes
    if trace.when_exhausted != "cycle":
        sizes = sizes[min(from_step, len(sizes) - 1):]  # past the end the last size repeats (or the trace ends)
    return world_fit_problem(sizes, micro_batch, num_replicas, f"the trace from step {from_step} on")


def checked_settings(dataset_size: object, num_replicas: object, micro_batch: object,
                     bound: bool = False, name: str = "micro_batch") -> tuple[int, int, int]:
    """The data set size, replica count and micro-batch as ints a schedule can use, or an aikit
    error naming the one that is not (the micro-batch as ``name``). ``bound``: ``micro_batch`` is
    ``max_device_batch``, the most one device holds, which may exceed the data set (it is not a
    size the schedule cuts)."""
    size = at_most(positive_int(dataset_size, "dataset_size"), MAX_DATASET_SIZE, "dataset_size",
                   "each epoch shuffles a permutation of the whole data set in memory")
    replicas = at_most(positive_int(num_replicas, "num_replicas"), MAX_REPLICAS, "num_replicas")
    if bound:
        return size, replicas, positive_int(micro_batch, "max_device_batch")
    micro = at_most(positive_int(micro_batch, name), size, name,
                    f"a micro-batch cannot hold more than the data set's {size} samples")
    return size, replicas, micro


def at_most(value: int, limit: int, name: str, why: str = "") -> int:
    if value > limit:
        raise InvalidValue(f"{name} must be at most {limit}, got {value}{f': {why}' if why else ''}")
    return value


def seed_value(seed: object) -> int:
    """A seed as the exact non-negative int it is (``1.7`` refused, not truncated to 1)."""
    return non_negative_int(seed, "seed")


class Schedule:
    """Cuts a trace into epochs over a data set and deals each step to replicas.

    ``micro_batch`` (default 32) fixes every micro-batch; ``max_device_batch`` instead splits each
    step evenly (see the module docstring), and then ``micro_batch`` is None. ``micro_name`` is what
    the messages call the micro-batch: the name the caller's user wrote (eth-easl's ``CustomSampler``
    given ``minibatch_size=`` passes that).
    """

    def __init__(self, trace: Trace | str | list[int] | int, dataset_size: int, num_replicas: int = 1,
                 micro_batch: int | None = None, seed: int = 42, shuffle: bool = True, balanced: bool = False,
                 permutation: Permutation = numpy_permutation, *, micro_name: str = "micro_batch",
                 max_device_batch: int | None = None, min_micro_batches: int = 1, noise_every: int | None = None,
                 noise_until: int | None = None):
        self.trace = load_trace(trace)
        self.micro_name = micro_name
        grows = max_device_batch is not None  # each step split evenly: its micro-batch is a function of its batch
        if grows and micro_batch is not None:
            raise InvalidValue(f"give {micro_name} (one micro-batch size) or max_device_batch (each step split "
                               "evenly, its micro-batch growing with it), not both")
        self.dataset_size, self.num_replicas, per_device = checked_settings(
            dataset_size, num_replicas, max_device_batch if grows else 32 if micro_batch is None else micro_batch,
            bound=grows, name=micro_name)
        self.micro_batch, self.max_device_batch = (None, per_device) if grows else (per_device, None)
        self.min_micro_batches, self.noise_every, self.noise_until = 1, None, None
        if grows:
            self.min_micro_batches = positive_int(min_micro_batches, "min_micro_batches")
            self.noise_every = None if noise_every is None else positive_int(noise_every, "noise_every")
            self.noise_until = None if noise_until is None else non_negative_int(noise_until, "noise_until")
        elif noise_every is not None or noise_until is not None:
            name = "noise_every" if noise_every is not None else "noise_until"
            raise InvalidValue(f"{name} splits steps that max_device_batch would run whole: give max_device_batch")
        self.seed = seed_value(seed)
        self.shuffle = checked_bool(shuffle, "shuffle")
        self.balanced = checked_bool(balanced, "balanced")
        if not callable(permutation):
            raise InvalidType(
                f"permutation must be a function (seed, epoch, dataset_size) -> order, got {permutation!r:.60}")
        self.permutation = permutation
        problems = self.problems()
        if problems:
            shown = "\n  ".join(problems[:10])
            more = f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else ""
            raise InvalidValue(f"trace {self.trace.source} cannot be scheduled:\n  {shown}{more}")
        self._starts = [0]  # first trace step of each epoch found so far
        self._tail: tuple[int, int] | None = None  # (start, end) of the trace's last, partial epoch

    def problems(self) -> list[str]:
        """Every reason the trace cannot run with these settings (empty when it can)."""
        return schedule_problems(self.trace, self.dataset_size, self.num_replicas, self.micro_batch, self.balanced,
                                 max_device_batch=self.max_device_batch, min_micro_batches=self.min_micro_batches,
                                 noise_every=self.noise_every, noise_until=self.noise_until, name=self.micro_name)

    def _find_epochs(self, count: int | float) -> None:
        """Extend the known epoch starts to ``count`` complete epochs, or to the trace's end."""
        while len(self._starts) <= count and self._tail is None:
            start = self._starts[-1]
            # every step holds at least one micro-batch, so an epoch has at most this many steps
            smallest = int(self.trace.sizes.min())
            span = self.dataset_size // (smallest if self.max_device_batch else max(self.micro_batch, smallest)) + 1
            if self.trace.is_finite:
                span = min(span, len(self.trace) - start)
            used = np.cumsum(self.trace.window(start, start + span))
            steps = int(np.searchsorted(used, self.dataset_size, side="right"))
            # complete: the next step would overflow, or the data set is used exactly
            if steps < span or (steps and used[-1] == self.dataset_size):
                self._starts.append(start + steps)
            else:
                self._tail = (start, start + steps)

    def full_epochs(self) -> int | float:
        """Complete epochs the trace covers (``math.inf`` for a repeating trace)."""
        if not self.trace.is_finite:
            return math.inf
        self._find_epochs(math.inf)
        return len(self._starts) - 1

    def epoch_bounds(self, epoch: int) -> tuple[int, int, bool]:
        """``(first, end, complete)``: the trace steps ``first..end-1`` that make up ``epoch``."""
        epoch = non_negative_int(epoch, "epoch")
        self._find_epochs(epoch + 1)
        if epoch + 1 < len(self._starts):
            return self._starts[epoch], self._starts[epoch + 1], True
        if (
            self.trace.when_exhausted == "stop"
            and self._tail
            and epoch == len(self._starts) - 1
            and self._tail[1] > self._tail[0]
        ):
            return self._tail[0], self._tail[1], False
        covered = self.full_epochs()
        exhausted = TraceTooShortError if epoch == 0 else TraceExhaustedError  # no first epoch: bad input
        if self.trace.when_exhausted == "stop":
            last = len(self._starts) - 2 + bool(self._tail and self._tail[1] > self._tail[0])
            raise exhausted(
                f"epoch {epoch} is past the end of the trace ({self.trace.source}, {len(self.trace)} steps): with "
                f"when_exhausted='stop' training ends in epoch {last}, so train epochs 0..{last} only, extend "
                "the trace, or load it with when_exhausted='repeat_last' or 'cycle'"
            )
        raise exhausted(
            f"epoch {epoch} needs steps past the end of the trace ({self.trace.source}, "
            f"{len(self.trace)} steps), which covers {covered} full epoch"
            f"{'' if covered == 1 else 's'} of {self.dataset_size} samples: extend the trace, "
            "or load it with when_exhausted='stop' (train the last, partial epoch), "
            "'repeat_last' or 'cycle'"
        )

    def epoch(self, epoch: int) -> EpochSchedule:
        """The steps of ``epoch`` (0-based) and its sample order."""
        first, end, complete = self.epoch_bounds(epoch)
        order = self._order(epoch) if self.shuffle else np.arange(self.dataset_size)
        sizes = self.trace.window(first, end)
        micro = None if self.max_device_batch is None else even_micro_batches(
            sizes, self.max_device_batch, self.num_replicas,
            split_minimums(first, end, self.min_micro_batches, self.noise_every, self.noise_until))
        return EpochSchedule(epoch, first, sizes, order, self.micro_batch, self.num_replicas, complete, micro)

    def _order(self, epoch: int) -> np.ndarray:
        """The epoch's permutation; one from a ``permutation`` of the user's is checked to be one."""
        order = self.permutation(self.seed, epoch, self.dataset_size)
        if self.permutation is numpy_permutation:
            return order
        order, size = np.asarray(order), self.dataset_size
        problem = None
        if order.shape != (size,):
            problem = f"an array of shape {order.shape}"
        elif order.dtype.kind not in "iu":
            problem = f"an array of {order.dtype}"
        elif size and (order.min() < 0 or order.max() >= size):
            problem = f"index {int(order.min() if order.min() < 0 else order.max())}, outside 0..{size - 1}"
        elif size and np.bincount(order, minlength=size).max() > 1:
            problem = f"index {int(np.bincount(order, minlength=size).argmax())} more than once"
        if problem:
            name = getattr(self.permutation, "__name__", repr(self.permutation))
            raise InvalidValue(f"permutation {name!r} returned {problem} for epoch {epoch}: it must return a "
                               f"permutation of range({size}), every index once")
        return order.astype(np.int64, copy=False)
