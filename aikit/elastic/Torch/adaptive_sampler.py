"""The adaptive run's sampler: :class:`AdaptiveSampler`, a :class:`~aikit.elastic.Torch.sampler.TraceSampler`
whose trace a :class:`~aikit.core.goodput.GoodputController` writes while training (see
:mod:`aikit.elastic.Torch.adaptive`, where its optimizer lives)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sized
from typing import Any

from aikit.core.adaptive import AdaptiveSchedule
from aikit.core.errors import InvalidState, InvalidValue
from aikit.core.goodput import BatchSplit, GoodputController
from aikit.core.plan import largest_even_batch
from aikit.core.schedule import EpochSchedule, checked_settings
from aikit.core.validate import non_negative_int, positive_int
from aikit.elastic.Torch.sampler import TraceSampler, checked_rank, dataset_size_of
from aikit.runtime.originals import either
from aikit.runtime.Torch import distributed

NOISE_EVERY = 4  # every fourth update of one part measures the noise


class AdaptiveSampler(TraceSampler):
    """This replica's micro-batches, with the global batch chosen while training.

    Args:
        dataset: a Dataset (its ``len()`` is used) or its size as an int.
        ref_batch_size: the global batch the LR was tuned for; the run starts there
            (``base_batch=``, its name in aikit 0.1, says the same).
        max_batch: the largest global batch to take (at most the data set).
        micro_batch: samples per device per micro-batch, fixed (static shapes: XLA, or a model
            that wants one shape).
        max_device_batch: instead of ``micro_batch``, the most samples one device holds: every
            update is split evenly in the fewest micro-batches of at most that many, so the
            per-device batch grows with the global batch, as AdaptDL's does, and a larger batch
            also runs faster.
        noise_every: with ``max_device_batch``, every ``noise_every``-th update (0, k, 2k, ...)
            runs in two micro-batches or more even where one would hold it: one device measures
            the gradient noise from the two halves of one update there (other updates of one
            part measure none), at the cost of one more micro-step every ``noise_every`` updates.
            Default 4.
        min_batch: the smallest global batch (default ``ref_batch_size``).
        num_replicas, rank: default to the running engine (torch.distributed, Horovod, torch_xla).
        seed, shuffle: each epoch's permutation, as ``TraceSampler``'s.
        threshold: change the batch only for a predicted goodput gain above this (5 %: Pollux's).
        max_change: a change moves the batch by at most this factor, up or down (the
            throughput model is trusted only near what it measured: see ``GoodputController``).
        decay: smoothing of the noise estimates over updates.
        min_estimates: noise estimates to average before the first change (default: the
            smoothing's horizon, ``1 / (1 - decay)``; a single estimate is very noisy).
        interval: updates between decisions (each fits the throughput model and scores every
            candidate batch: milliseconds, not worth paying at every update).
        lookahead: updates between a decision and the update it changes; at least the
            micro-batches a DataLoader fetches ahead (``num_workers * prefetch_factor``; 0 without
            workers). :meth:`loader` sets it for you.
        hold_after: hold the batch from the first update that starts at or after this many
            samples of the run (``schedule.held_from``): no more decisions and no more noise
            measured (nor the extra micro-step that costs on one device), the LR rule's noise kept
            as it was (docs/adaptive.md has what it measured). None: decide throughout (Pollux's).

    Batches are whole micro-batches on every replica: with ``micro_batch``, ``ref_batch_size``,
    ``min_batch`` and ``max_batch`` must be multiples of ``micro_batch x num_replicas``; with
    ``max_device_batch`` they must split evenly over the replicas (the error names the nearest
    that do). Every name of ``TraceSampler`` works here too: :attr:`trace` holds the updates
    trained so far, ``epoch_schedule`` the current epoch's updates decided so far, ``state_dict``
    the position.
    """

    _decides_while_training = True

    def __init__(self, dataset: Sized | int | None = None, *, ref_batch_size: int | None = None, max_batch: int,
                 micro_batch: int | None = None, min_batch: int | None = None, num_replicas: int | None = None,
                 rank: int | None = None, seed: int = 42, shuffle: bool = True, threshold: float = 0.05,
                 decay: float = 0.95, lookahead: int = 0, min_estimates: int | None = None, interval: int = 10,
                 dataset_size: int | None = None, max_device_batch: int | None = None, noise_every: int = NOISE_EVERY,
                 max_change: float = 2.0, base_batch: int | None = None, hold_after: int | None = None) -> None:
        size = dataset_size_of(dataset, dataset_size, "AdaptiveSampler")
        num_replicas = distributed.world_size() if num_replicas is None else num_replicas
        rank = distributed.rank() if rank is None else rank
        if (micro_batch is None) == (max_device_batch is None):
            raise InvalidValue("give micro_batch (fixed, static shapes) or max_device_batch (the per-device batch "
                               "grows with the global batch), one of them")
        grows = max_device_batch is not None
        per_device = max_device_batch if grows else micro_batch  # with grows a bound, which may exceed the data set
        size, num_replicas, per_device = checked_settings(size, num_replicas, per_device, bound=grows)
        controller = _controller(size, num_replicas, per_device, grows, noise_every, (ref_batch_size, base_batch),
                                 max_batch, min_batch, threshold=threshold, decay=decay,
                                 max_change=max_change, min_estimates=min_estimates, interval=interval)
        self.schedule = AdaptiveSchedule(size, controller, seed, shuffle, lookahead, hold_after)
        self.devices = 1
        self.rank = checked_rank(rank, num_replicas)
        if self.schedule.samples_left_out:
            warnings.warn(
                f"the data set's {size} samples are not a whole number of micro-batches of {per_device}: each epoch "
                f"leaves {self.schedule.samples_left_out} of them out (a different few each epoch); use a "
                "micro_batch that divides the data set to train on all", stacklevel=2)
        self.set_epoch(0)

    @property
    def controller(self) -> GoodputController:
        """The goodput controller that chooses the batch (``batches``, ``changes``, ``noise``)."""
        return self.schedule.controller

    @property
    def interval(self) -> int:
        """Updates between the controller's decisions."""
        return self.controller.interval

    @property
    def epoch_schedule(self) -> EpochSchedule:
        """The current epoch's updates decided so far."""
        return self.schedule.epoch(self._epoch)

    @epoch_schedule.setter
    def epoch_schedule(self, plan: EpochSchedule) -> None:
        self._epoch = plan.epoch

    @property
    def lookahead(self) -> int:
        """Updates decided ahead of training (a DataLoader may prefetch that many micro-batches)."""
        return self.schedule.lookahead

    @lookahead.setter
    def lookahead(self, value: int) -> None:
        """Only grows (the batches already decided stay): decide further ahead from now on."""
        value = non_negative_int(value, "lookahead")
        if value < self.schedule.lookahead:
            raise InvalidValue(f"lookahead can only grow ({self.schedule.lookahead} now, {value} asked): "
                               "the updates already decided stay decided")
        self.schedule.lookahead = value
        self.schedule.extend(len(self.controller.batches))

    # --- the trace: the updates trained so far ------------------------------------------------------
    @property
    def trace(self) -> list[int]:
        """The global batch of every update trained so far: replays the run with ``TraceSampler``
        (same seed and shuffle, and ``micro_batch``, or ``max_device_batch`` and
        ``noise_every`` as here, and ``noise_until=schedule.held_from`` where the run held its
        batch; ``when_exhausted='stop'`` if the run ended mid-epoch)."""
        return list(self.controller.batches)

    # --- iteration ------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[list[int]]:
        """This replica's micro-batches of the epoch, each update's as soon as it is decided."""
        self._begin()
        while True:
            plan = self.epoch_schedule
            if self.step >= len(plan):
                if plan.complete:
                    return
                raise InvalidState(
                    f"the DataLoader asked for update {plan.first_step + self.step}'s samples before it was decided "
                    f"(lookahead={self.lookahead}): it prefetches further ahead than the sampler decides; build the "
                    "loader with sampler.loader(dataset, ...) or give AdaptiveSampler "
                    "lookahead=num_workers * prefetch_factor")
            yield from self._rest_of_step(plan)

    def __len__(self) -> int:
        """Micro-batches the next iteration yields if the batch stays as it is now (an estimate:
        the batch may change)."""
        plan, (step, micro_step) = self.epoch_schedule, self._start
        decided = int(plan.counts(self.rank)[step:].sum()) - micro_step
        if plan.complete:
            return decided
        per_update = self.controller.plan(self.controller.batch)  # the rest of the epoch at the current batch
        left = (self.dataset_size - plan.samples) // per_update.batch_size
        return decided + (left - self.rank + self.num_replicas - 1) // self.num_replicas

    def set_world(self, num_replicas: int, rank: int) -> None:
        """Deal the run to ``rank`` of a world of as many replicas as it was planned for (another
        count is refused: the throughput model and the batch bounds are per replica count).
        Position: the start of the current step, as ``TraceSampler.set_world``."""
        if num_replicas != self.num_replicas:
            raise InvalidValue(
                f"this adaptive run was planned for {self.num_replicas} replicas and resumes on {num_replicas}: its "
                "throughput model and batch bounds are per replica count; resume on as many replicas (a resize "
                "of an adaptive run is not supported yet)")
        self.rank = checked_rank(rank, num_replicas)
        self.resume(self.epoch, self.step, 0)

    def check_position(self, epoch: int, step: int, micro_step: int) -> EpochSchedule:
        s = self.schedule
        problem = s.position_problem(s.sizes, s.starts, epoch, step, micro_step, self.rank)
        if problem:
            raise InvalidValue(problem)
        return s.epoch(epoch)


def _controller(size: int, num_replicas: int, per_device: int, grows: bool, noise_every: int,
                refs: tuple[object, object], max_batch: object, min_batch: object,
                **settings: Any) -> GoodputController:
    """The controller an AdaptiveSampler's settings make, its bounds checked against how every
    update splits over the replicas."""
    split = BatchSplit(per_device, num_replicas, grows, positive_int(noise_every, "noise_every") if grows else None)
    ref, ref_name = either("base_batch", *refs)  # ref_batch_size, or aikit 0.1's base_batch
    if ref is None:
        raise InvalidValue("AdaptiveSampler needs ref_batch_size, the global batch the LR was tuned for (the run "
                           "starts there)")
    _check_bounds(split, size, ref_name, ref, max_batch, min_batch)  # ref named as the caller wrote it
    return GoodputController(per_device, num_replicas, ref_batch_size=ref, max_batch=max_batch, min_batch=min_batch,
                             policy="error", fixed_micro_batch=not grows, noise_every=split.noise_every, **settings)


def _check_bounds(split: BatchSplit, dataset_size: int, ref_name: str, ref: object, max_batch: object,
                  min_batch: object) -> None:
    """Refuse a bound no update can run, bounds out of order, or a ``max_batch`` larger than the data
    set, naming the fix and the reference batch as the caller wrote it (aikit 0.1's ``base_batch``)."""
    bounds = {ref_name: ref, "max_batch": max_batch, "min_batch": min_batch}
    for name, value in bounds.items():
        if value is not None:
            problem = split.problem(name, positive_int(value, name))
            if problem:
                raise InvalidValue(problem)
    low = ref if min_batch is None else min_batch
    if not low <= ref <= max_batch:
        raise InvalidValue(f"need min_batch <= {ref_name} <= max_batch, got {low}, {ref}, {max_batch}: the run "
                           f"starts at {ref_name} and moves within the bounds")
    if bounds["max_batch"] > dataset_size:
        largest = largest_even_batch(dataset_size, split.per_device, split.devices) if split.grows \
            else dataset_size // split.unit * split.unit
        raise InvalidValue(f"max_batch={bounds['max_batch']} is larger than the data set ({dataset_size} samples): an "
                           f"update cannot span epochs; use max_batch <= {largest}")
