"""Adaptive batch for PyTorch: aikit picks the global batch while training.

:class:`AdaptiveSampler` and :class:`AdaptiveOptimizer` are the adaptive pair of
:class:`~aikit.elastic.Torch.sampler.CustomSampler` and
:class:`~aikit.elastic.Torch.trace_optim.TraceOptimizer`: the same micro-batches, the same deal
to replicas, the same single all-reduce and update, but the trace is written while training by a
:class:`~aikit.core.goodput.GoodputController` (Pollux/AdaptDL's goodput = throughput x
statistical efficiency), so a finished run's batches (:meth:`AdaptiveSampler.trace`) replay it
exactly with ``CustomSampler`` and a trace optimizer.

How it stays exact:

* **Gradient noise, cheaply.** A gradient hook on every parameter takes each micro-batch's
  squared gradient norm as autograd produces it, before it is added into ``.grad``
  (:class:`~aikit.runtime.Torch.noise.MicroBatchNorms`, as for ``AdaScaleOptimizer``); the
  replicas' norms and their step times travel in the update's one all-reduce, appended to the
  gradients (:meth:`aikit.runtime.Torch.accumulator.Accumulator.reduce`), and
  :func:`aikit.core.gradient_noise.estimate` turns them into ``|G|²`` and ``tr(Σ)``.
* **Every replica decides the same.** The controller sees only all-reduced numbers, so every
  replica proposes the same batch at the same update.
* **Changes at well-defined updates.** A DataLoader draws indices ahead of training (its
  workers prefetch), so the batch of update ``u`` is fixed ``lookahead`` updates before ``u``
  is trained: a decision after update ``k`` takes effect at update ``k + 1 + lookahead``. The
  sampler refuses to run further ahead than that, naming the fix.
* **Every sample of an epoch once.** The batch changes only between updates, in whole
  micro-batches dealt round-robin (``core.schedule``'s deal); an epoch's last update takes what
  is left in whole micro-batches, so only ``dataset_size mod micro_batch`` samples (fewer than
  one micro-batch, a different few each epoch) sit an epoch out, as with ``CustomSampler``.
* **GA equality.** Every update is the one big-batch step over its samples: the accumulated
  gradient is weighed by ``micro_batch / B`` (``EpochSchedule.weight``) whatever ``B`` is.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Callable, Iterator, Sized
from typing import Any

import numpy as np
import torch

from aikit.core.autolrs import write_schedule
from aikit.core.errors import InvalidValue
from aikit.core.goodput import GoodputController
from aikit.core.gradient_noise import NoiseEstimate, estimate
from aikit.core.plan import Plan, even_micro_batches, even_split_problems, largest_even_batch
from aikit.core.scaling import adaptive_lr, adaptive_rule_name
from aikit.core.schedule import EpochSchedule, checked_settings, flag, seed_value, split_minimums
from aikit.core.trace import Trace
from aikit.core.validate import non_negative_int, positive_int
from aikit.elastic.Torch.sampler import CustomSampler, _checked_rank, _dataset_size
from aikit.elastic.Torch.trace_optim import TraceOptimizer
from aikit.runtime.Torch import distributed
from aikit.runtime.Torch.collectives import engine, mark_step
from aikit.runtime.Torch.noise import MicroBatchNorms

__all__ = ["AdaptiveOptimizer", "AdaptiveSampler"]

log = logging.getLogger("aikit.adaptive")
_ADAPTIVE_KEYS = {"settings", "sizes", "starts", "controller"}


class _Controller(GoodputController):
    """The goodput controller over the batches an adaptive run can take, so that the plan it
    scores (GA steps x micro-batch) is exactly the schedule's round-robin deal: whole
    micro-batches of ``micro_batch`` on every replica, or (``grows``) every batch that splits
    evenly in the fewest micro-batches of at most ``max_device_batch``
    (:func:`aikit.core.plan.even_micro_batches`), and in two on every ``noise_every``-th update.
    It scores each batch by the plan of the updates between those."""

    grows = False  # the micro-batch grows with the batch, up to max_device_batch
    noise_every: int | None = None  # with grows: every noise_every-th update in two micro-batches or more

    def plan(self, batch: int) -> Plan:
        if not self.grows:
            return super().plan(batch)
        _, steps = self.plans(np.array([batch], dtype=np.int64))
        return Plan(batch, self.max_device_batch, self.devices, self.devices, int(steps[0]), "error")

    def plans(self, batches: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not self.grows:
            return super().plans(batches)
        micro = even_micro_batches(batches, self.max_device_batch, self.devices)
        if not micro.all():
            raise InvalidValue(even_split_problems(batches, self.max_device_batch, self.devices)[0])
        return micro, batches // (micro * self.devices)

    def candidates(self) -> np.ndarray:
        unit = self.devices if self.grows else self.max_device_batch * self.devices
        found = np.arange(-(-self.min_batch // unit), self.max_batch // unit + 1, dtype=np.int64) * unit
        if self.grows:  # the batch must split for the updates between and on those that measure the noise
            splits = [even_micro_batches(found, self.max_device_batch, self.devices, least) > 0
                      for least in {1, 2 if self.noise_every else 1}]
            found = found[np.logical_and.reduce(splits)]
        if len(found) > 1000:  # about a thousand, spread geometrically
            found = found[np.unique(np.geomspace(1, len(found), 1000).round().astype(np.int64) - 1)]
        return np.unique(np.concatenate([found, [self.batch]]))

    def record(self, batch: int, seconds: tuple[float, float] | None, noise: NoiseEstimate | None,
               micro: int, steps: int) -> None:
        """One update of ``batch`` samples (the batch decided for it, or an epoch's shorter
        last update) in ``steps`` micro-steps of ``micro`` samples per device. ``seconds``, where
        timed: the update's whole cycle, and the cycle less its micro-steps but one, the time an
        update of a single micro-step would take (AdaptDL times accumulation and update steps
        apart for the same reason): so the per-update cost is known from the first batch on, and
        a larger batch's saving can be predicted."""
        if seconds is not None:
            self.throughput.observe(micro, steps, seconds[0])
            self.throughput.observe(micro, 1, seconds[1])
        if noise is not None:
            self.noise.update(noise)
        self.batches.append(batch)

    min_estimates = 0  # noise estimates needed before the first change

    def propose(self) -> int | None:
        if not self.throughput.configurations or self.noise.updates < self.min_estimates:
            return None  # the first updates are not timed; the first noise estimates are too noisy
        return super().propose()


class _Columns:
    """One epoch's batch and micro-batch of every update decided so far, as read-only arrays that
    grow by appending: an epoch view rebuilt after each update costs the new updates, not the
    epoch (its updates can number tens of thousands)."""

    def __init__(self, micro_sizes: Callable[[np.ndarray, int], np.ndarray] | None) -> None:
        self.micro_sizes = micro_sizes  # (sizes, first update) -> their micro-batches; None: fixed
        self.sizes = np.zeros(16, dtype=np.int64)
        self.micro = np.zeros(16, dtype=np.int64) if micro_sizes else None
        self.filled = 0

    def extended(self, sizes: list[int], first: int, end: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Updates ``first..end-1`` of ``sizes`` (an append-only list), appending the new ones."""
        count = end - first
        if count > self.filled:
            new = np.asarray(sizes[first + self.filled:end], dtype=np.int64)
            self.sizes = _appended(self.sizes, self.filled, new)
            if self.micro is not None:
                self.micro = _appended(self.micro, self.filled, self.micro_sizes(new, first + self.filled))
            self.filled = count
        return _read_only(self.sizes[:count]), None if self.micro is None else _read_only(self.micro[:count])


def _appended(buffer: np.ndarray, filled: int, new: np.ndarray) -> np.ndarray:
    """``new`` written after the first ``filled`` entries of ``buffer``, which doubles when full
    (views handed out keep the old array, whose entries they cover never change)."""
    if filled + len(new) > len(buffer):
        buffer = np.concatenate([buffer, np.zeros(max(filled + len(new), 2 * len(buffer)) - len(buffer),
                                                  dtype=buffer.dtype)])
    buffer[filled:filled + len(new)] = new
    return buffer


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view


class AdaptiveSchedule:
    """The global batch of every update, decided while training, cut into epochs.

    Update ``u`` takes the controller's batch at the time it is decided (``lookahead`` updates
    ahead), or what is left of its epoch in whole micro-batches if that is less. Each epoch draws
    its samples from the permutation :class:`aikit.core.schedule.Schedule` uses, so the views
    (:meth:`epoch`) are ordinary :class:`~aikit.core.schedule.EpochSchedule` objects and a replay
    of the batches with ``CustomSampler`` gets the same samples.
    """

    def __init__(self, dataset_size: int, controller: _Controller, micro_batch: int, num_replicas: int,
                 seed: int, shuffle: bool, lookahead: int) -> None:
        self.dataset_size, self.num_replicas, self.minibatch_size = checked_settings(
            dataset_size, num_replicas, micro_batch, bound=controller.grows)  # with grows: the most per device
        self.seed, self.shuffle = seed_value(seed), flag(shuffle, "shuffle")
        self.controller = controller
        self.lookahead = non_negative_int(lookahead, "lookahead")
        self.sizes: list[int] = []  # the global batch of every update decided so far
        self.starts = [0]  # the first update of every epoch begun so far
        self._views: dict[int, tuple[int, EpochSchedule, _Columns]] = {}  # epoch: (end, view, its arrays)
        self._open_samples = 0  # samples the updates of the last epoch begun take so far
        self.extend(0)

    @property
    def samples_left_out(self) -> int:
        """Samples each epoch leaves out with a fixed micro-batch: fewer than one micro-batch."""
        return 0 if self.controller.grows else self.dataset_size % self.minibatch_size

    def _least(self, first: int, end: int) -> np.ndarray:
        """The fewest micro-batches of updates ``first..end-1`` (with ``grows``)."""
        return split_minimums(first, end, 1, self.controller.noise_every)

    def _fitting(self, left: int, update: int) -> int:
        """The largest batch of at most ``left`` samples update ``update`` can take (0: none)."""
        if self.controller.grows:
            least = int(self._least(update, update + 1)[0])
            return largest_even_batch(left, self.minibatch_size, self.num_replicas, least)
        return left // self.minibatch_size * self.minibatch_size

    def micro_sizes(self, sizes: list[int] | np.ndarray, first: int) -> np.ndarray | None:
        """The micro-batch of updates ``first, first + 1, ...`` of ``sizes`` where it grows with the
        batch (None: ``minibatch_size`` always)."""
        if not self.controller.grows:
            return None
        return even_micro_batches(sizes, self.minibatch_size, self.num_replicas,
                                  self._least(first, first + len(sizes)))

    def extend(self, done: int) -> None:
        """Decide the batches up to update ``done + lookahead`` (updates ``0..done-1`` are trained)."""
        while len(self.sizes) <= done + self.lookahead:
            left, update = self.dataset_size - self._open_samples, len(self.sizes)
            self.sizes.append(min(self.controller.batch, self._fitting(left, update)))
            self._open_samples += self.sizes[-1]
            if not self._fitting(left - self.sizes[-1], update + 1):
                self.starts.append(len(self.sizes))  # the epoch is full: the next update opens the next one
                self._open_samples = 0

    def epoch(self, epoch: int) -> EpochSchedule:
        """The updates of ``epoch`` decided so far (``complete`` once its last one is)."""
        epoch = non_negative_int(epoch, "epoch")
        if epoch >= len(self.starts):
            raise InvalidValue(
                f"epoch {epoch} of the adaptive run has not begun: it starts once the last update of epoch "
                f"{len(self.starts) - 1} is decided; train that epoch to its end first")
        first = self.starts[epoch]
        end = self.starts[epoch + 1] if epoch + 1 < len(self.starts) else len(self.sizes)
        cached = self._views.get(epoch)
        if cached is None or cached[0] != end:
            order = cached[1].order if cached else (
                np.random.default_rng([self.seed, epoch]).permutation(self.dataset_size) if self.shuffle
                else np.arange(self.dataset_size))
            columns = cached[2] if cached else _Columns(self.micro_sizes if self.controller.grows else None)
            sizes, micro = columns.extended(self.sizes, first, end)
            view = EpochSchedule(epoch, first, sizes, order, self.minibatch_size, self.num_replicas,
                                 epoch + 1 < len(self.starts), micro)
            self._views = {e: v for e, v in self._views.items() if e >= epoch - 1}
            self._views[epoch] = cached = (end, view, columns)
        return cached[1]

    def settings(self) -> dict:
        c = self.controller
        per_device = {"max_device_batch": self.minibatch_size, "noise_every": c.noise_every} if c.grows else {
            "micro_batch": self.minibatch_size}
        return {"dataset_size": self.dataset_size, **per_device,
                "num_replicas": self.num_replicas, "seed": self.seed, "shuffle": self.shuffle,
                "base_batch": c.base_batch, "min_batch": c.min_batch, "max_batch": c.max_batch}

    def identity(self) -> dict:
        """What fixes every update's samples, for ``ElasticState``'s resume check."""
        return {"adaptive": self.settings()}

    def state_dict(self) -> dict:
        return {"settings": self.settings(), "sizes": list(self.sizes), "starts": list(self.starts),
                "controller": self.controller.state_dict()}

    def checked(self, state: dict) -> tuple[list[int], list[int], _Controller]:
        """``state`` converted for loading, or a ValueError naming what does not fit."""
        if not isinstance(state, dict) or set(state) != _ADAPTIVE_KEYS:
            keys = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"not an adaptive schedule state: keys {keys}, expected {sorted(_ADAPTIVE_KEYS)}")
        if state["settings"] != self.settings():
            differ = [f"{k} {state['settings'].get(k)!r} then, {v!r} now" for k, v in self.settings().items()
                      if state["settings"].get(k) != v]
            raise ValueError(f"the adaptive state was saved by a run with other settings ({'; '.join(differ)}): "
                             "build the AdaptiveSampler as that run did")
        sizes, starts = [positive_int(s, "sizes[i]") for s in state["sizes"]], [int(s) for s in state["starts"]]
        uneven = [size for update, size in enumerate(sizes) if self._fitting(size, update) != size]
        if uneven:
            raise ValueError(f"the adaptive state holds batch {uneven[0]}, which this run cannot deal in whole "
                             "micro-batches: it was not saved by a run with these settings")
        c = self.controller
        controller = _Controller(c.max_device_batch, c.devices, base_batch=c.base_batch, max_batch=c.max_batch,
                                 min_batch=c.min_batch, threshold=c.threshold, decay=c.noise.decay, policy=c.policy,
                                 max_change=c.max_change)
        controller.load_state_dict(state["controller"])
        controller.min_estimates, controller.grows, controller.noise_every = c.min_estimates, c.grows, c.noise_every
        return sizes, starts, controller

    def load(self, sizes: list[int], starts: list[int], controller: _Controller) -> None:
        self.sizes, self.starts, self.controller, self._views = sizes, starts, controller, {}
        self._open_samples = sum(sizes[starts[-1]:])

    def position_problem(self, sizes: list[int], starts: list[int], epoch: int, step: int, micro: int,
                         rank: int) -> str | None:
        """Why micro-batch ``micro`` of ``step`` of ``epoch`` does not exist for ``rank`` in a
        schedule of ``sizes``/``starts`` (None when it does)."""
        if not 0 <= epoch < len(starts):
            return f"epoch {epoch} was not begun"
        end = starts[epoch + 1] if epoch + 1 < len(starts) else len(sizes)
        if not 0 <= step <= end - starts[epoch]:
            return f"no step {step} in epoch {epoch}"
        if step < end - starts[epoch]:
            update = starts[epoch] + step
            grown = self.micro_sizes([sizes[update]], update)
            total = sizes[update] // (self.minibatch_size if grown is None else int(grown[0]))
            mine = (total - rank + self.num_replicas - 1) // self.num_replicas
            return None if 0 <= micro <= mine else f"no micro-batch {micro} of step {step} for rank {rank}"
        return None if micro == 0 else f"no micro-batch {micro} past the end of epoch {epoch}"


class AdaptiveSampler(CustomSampler):
    """This replica's micro-batches, with the global batch chosen while training.

    Args:
        dataset: a Dataset (its ``len()`` is used) or its size as an int.
        base_batch: the global batch the LR was tuned for; the run starts there.
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
        min_batch: the smallest global batch (default ``base_batch``).
        num_replicas, rank: default to the running engine (torch.distributed, Horovod, torch_xla).
        seed, shuffle: each epoch's permutation, as ``CustomSampler``'s.
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

    Batches are whole micro-batches on every replica: with ``micro_batch``, ``base_batch``,
    ``min_batch`` and ``max_batch`` must be multiples of ``micro_batch x num_replicas``; with
    ``max_device_batch`` they must split evenly over the replicas (the error names the nearest
    that do).
    """

    def __init__(
        self,
        dataset: Sized | int | None = None,
        *,
        base_batch: int,
        max_batch: int,
        micro_batch: int | None = None,
        min_batch: int | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        seed: int = 42,
        shuffle: bool = True,
        threshold: float = 0.05,
        decay: float = 0.95,
        lookahead: int = 0,
        min_estimates: int | None = None,
        interval: int = 10,
        dataset_size: int | None = None,
        max_device_batch: int | None = None,
        noise_every: int = 4,
        max_change: float = 2.0,
    ) -> None:
        size = _dataset_size(dataset, dataset_size)
        num_replicas = distributed.world_size() if num_replicas is None else num_replicas
        rank = distributed.rank() if rank is None else rank
        if (micro_batch is None) == (max_device_batch is None):
            raise InvalidValue("give micro_batch (fixed, static shapes) or max_device_batch (the per-device batch "
                               "grows with the global batch), one of them")
        grows = max_device_batch is not None
        noise_every = positive_int(noise_every, "noise_every") if grows else None
        per_device = max_device_batch if grows else micro_batch  # with grows a bound, which may exceed the data set
        size, num_replicas, micro_batch = checked_settings(size, num_replicas, per_device, bound=grows)
        unit = micro_batch * num_replicas
        bounds = (("base_batch", base_batch), ("max_batch", max_batch), ("min_batch", min_batch))
        for what, value in bounds:
            if value is None:
                continue
            if not grows and positive_int(value, what) % unit:
                raise InvalidValue(
                    f"{what}={value} is not a multiple of micro_batch x replicas = {micro_batch} x {num_replicas} = "
                    f"{unit}: every update is whole micro-batches on every replica; use {what}="
                    f"{max(unit, value // unit * unit)} or {-(-value // unit) * unit}")
            for least in (1, 2) if grows else ():  # the updates between and those that measure the noise
                problems = even_split_problems([positive_int(value, what)], micro_batch, num_replicas, least)
                if problems:
                    raise InvalidValue(f"{what}={value}: every update is split evenly over the replicas"
                                       f"{f', every {noise_every}th in two or more' if least == 2 else ''}; "
                                       + problems[0].split(": ", 1)[1])
        if max_batch > size:
            largest = largest_even_batch(size, micro_batch, num_replicas) if grows else size // unit * unit
            raise InvalidValue(f"max_batch={max_batch} is larger than the data set ({size} samples): an update "
                               f"cannot span epochs; use max_batch <= {largest}")
        controller = _Controller(micro_batch, num_replicas, base_batch=base_batch, max_batch=max_batch,
                                 min_batch=min_batch, threshold=threshold, decay=decay, max_change=max_change,
                                 policy="ragged" if grows else "error")
        controller.grows = grows
        controller.noise_every = noise_every
        controller.min_estimates = round(1 / (1 - controller.noise.decay)) if min_estimates is None else \
            non_negative_int(min_estimates, "min_estimates")
        self.schedule = AdaptiveSchedule(size, controller, micro_batch, num_replicas, seed, shuffle, lookahead)
        self.interval = positive_int(interval, "interval")
        self.devices = 1
        self.rank = _checked_rank(rank, num_replicas)
        if self.schedule.samples_left_out:
            warnings.warn(
                f"the data set's {size} samples are not a whole number of micro-batches of {micro_batch}: each epoch "
                f"leaves {self.schedule.samples_left_out} of them out (a different few each epoch); use a "
                "micro_batch that divides the data set to train on all", stacklevel=2)
        self.set_epoch(0)

    @property
    def controller(self) -> GoodputController:
        return self.schedule.controller

    @property
    def epoch_schedule(self) -> EpochSchedule:
        """The current epoch's updates decided so far."""
        return self.schedule.epoch(self._epoch)

    @epoch_schedule.setter
    def epoch_schedule(self, plan: EpochSchedule) -> None:
        self._epoch = plan.epoch

    @property
    def lookahead(self) -> int:
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

    def loader(self, dataset: Any, **kwargs: Any) -> torch.utils.data.DataLoader:
        """A DataLoader over ``dataset`` fed by this sampler, with the lookahead its prefetching needs."""
        if "batch_size" in kwargs or "sampler" in kwargs or "batch_sampler" in kwargs:
            raise InvalidValue("this sampler sets the batches: leave batch_size, sampler and batch_sampler out")
        workers = kwargs.get("num_workers", 0)
        prefetch = kwargs.get("prefetch_factor") or (2 if workers else 0)
        if workers * prefetch > self.lookahead:
            self.lookahead = workers * prefetch
        return torch.utils.data.DataLoader(dataset, batch_sampler=self, **kwargs)

    def __iter__(self) -> Iterator[list[int]]:
        """This replica's micro-batches of the epoch, each update's as soon as it is decided."""
        self._begin()
        while True:
            plan = self.epoch_schedule
            if self.step >= len(plan):
                if plan.complete:
                    return
                raise RuntimeError(
                    f"the DataLoader asked for update {plan.first_step + self.step}'s samples before it was decided "
                    f"(lookahead={self.lookahead}): it prefetches further ahead than the sampler decides; build the "
                    "loader with sampler.loader(dataset, ...) or give AdaptiveSampler "
                    "lookahead=num_workers * prefetch_factor")
            yield from self._rest_of_step(plan)

    def __len__(self) -> int:
        """Micro-batches the next iteration yields if the batch stays as it is now (an estimate:
        the batch may change)."""
        plan, (step, micro) = self.epoch_schedule, self._start
        decided = int(plan.counts(self.rank)[step:].sum()) - micro
        if plan.complete:
            return decided
        per_update = self.controller.plan(self.controller.batch)  # the rest of the epoch at the current batch
        left = (self.dataset_size - plan.samples) // per_update.batch_size
        return decided + (left - self.rank + self.num_replicas - 1) // self.num_replicas

    def set_world(self, num_replicas: int, rank: int) -> None:
        raise ValueError(
            f"this adaptive run was planned for {self.num_replicas} replicas and resumes on {num_replicas}: its "
            "throughput model and batch bounds are per replica count; resume on as many replicas (a resize "
            "of an adaptive run is not supported yet)")

    def check_position(self, epoch: int, step: int, micro: int) -> EpochSchedule:
        s = self.schedule
        problem = s.position_problem(s.sizes, s.starts, epoch, step, micro, self.rank)
        if problem:
            raise InvalidValue(problem)
        return s.epoch(epoch)

    def trace(self) -> Trace:
        """The global batch of every update trained so far: replays the run with ``CustomSampler``
        (same seed and shuffle, and ``minibatch_size=micro_batch``, or ``max_device_batch`` and
        ``noise_every`` as here; ``when_exhausted='stop'`` if the run ended mid-epoch)."""
        return Trace(list(self.controller.batches), "stop", source="adaptive run")

    def write_trace(self, path: str) -> None:
        """Write :meth:`trace` as a ``step,batchsize`` CSV."""
        self.trace().to_csv(path)


class AdaptiveOptimizer(TraceOptimizer):
    """Wraps a torch optimizer to train through an :class:`AdaptiveSampler`, measuring the
    gradient noise and letting the sampler's controller pick the next batches.

    ``rule`` scales the LR from ``sampler``'s ``base_batch`` to each update's batch:
    ``"adascale"`` (default: AdaScale's gain from the measured noise, Johnson et al. 2020),
    ``"sqrt"``, ``"linear"`` or ``"constant"`` (:mod:`aikit.core.scaling`). ``clock`` times the
    updates (seconds). Other arguments as :class:`~aikit.elastic.Torch.trace_optim.TraceOptimizer`.
    Under torchrun give it the plain model (no DDP): its one all-reduce per update replaces DDP's.

    ``history`` holds ``(update, batch, lr, noise_scale)`` for every update (the noise scale
    smoothed, ``nan`` before the first estimate).
    """

    kind = "adaptive optimizer"

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        sampler: AdaptiveSampler,
        rule: str = "adascale",
        log_steps: int | None = None,
        *,
        warmup_steps: int = 0,
        broadcast: bool = True,
        max_grad_norm: float | None = None,
        scaler: Any = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not isinstance(sampler, AdaptiveSampler):
            raise ValueError(f"AdaptiveOptimizer needs the AdaptiveSampler that feeds it, got {sampler!r}")
        self.rule = adaptive_rule_name(rule)
        super().__init__(optimizer, sampler, sampler.controller.base_batch, log_steps, warmup_steps=warmup_steps,
                         broadcast=broadcast, max_grad_norm=max_grad_norm, scaler=scaler)
        self.clock = clock
        self._xla = engine(self.device) == "xla"  # one process of torch_xla still reduces through XLA
        self.history: list[tuple[int, int, float, float]] = []
        dtype = torch.float64 if self.params[0].dtype == torch.float64 else torch.float32
        self.norms = MicroBatchNorms(self.param_groups, dtype)  # this update's micro-batch gradients' norms
        self._last: float | None = None  # the previous update's last micro-step, this iteration
        self._micro_stamp: float | None = None  # this update's latest micro-step
        self._accumulating = 0.0  # seconds of this update's micro-steps after its first

    # --- the adaptive schedule's epoch, read fresh (it grows while training) -----------------------
    @property
    def plan(self) -> EpochSchedule:
        return self.sampler.schedule.epoch(self._epoch)

    @plan.setter
    def plan(self, plan: EpochSchedule) -> None:
        self._epoch = plan.epoch

    @property
    def counts(self) -> np.ndarray:
        return self.plan.counts(self.sampler.rank)

    @counts.setter
    def counts(self, _counts: np.ndarray) -> None:
        pass  # read from the plan

    @property
    def controller(self) -> GoodputController:
        return self.sampler.controller

    def set_epoch(self, epoch: int) -> None:
        self._last = self._micro_stamp = None  # an epoch's first update waits for the DataLoader: untimed
        self._accumulating = 0.0
        super().set_epoch(epoch)

    def _start(self, epoch: int, step: int, micro: int) -> None:
        super()._start(epoch, step, micro)
        self._arm()

    def _arm(self) -> None:
        """Record micro-batch norms only for an update of two parts or more: a one-part update
        (one device, one micro-batch) cannot measure the noise, so its hooks cost nothing."""
        if hasattr(self, "norms"):
            plan, step = self.plan, self.step_index
            self.norms.active = self.sampler.num_replicas > 1 or step >= len(plan) or plan.counts(0)[step] >= 2

    # --- measuring -----------------------------------------------------------------------------
    def unhook(self) -> None:
        """Remove the gradient hooks (to train the model on with another optimizer)."""
        self.norms.remove()

    def step(self, closure: Callable[[], Any] | None = None) -> bool:
        """Account for one micro-batch; returns True when it completed a global step's update."""

        def measured() -> Any:
            loss = closure() if closure is not None else None
            self.norms.close()
            stamp = self.clock()
            if self._micro_stamp is not None:  # the micro-steps of this update after its first
                self._accumulating += stamp - self._micro_stamp
            self._micro_stamp = stamp
            return loss

        return super().step(measured)

    def _update(self) -> None:
        """All-reduce the gradients with the noise measurements, update at the rule's LR, and let
        the controller decide the batch ``lookahead`` updates ahead."""
        step = self.step_index
        plan, schedule = self.plan, self.sampler.schedule
        batch, weight = int(plan.batch_sizes[step]), plan.weight(step)
        replicas, rank, micro = self.sampler.num_replicas, self.sampler.rank, plan.micro_size(step)
        slots = int(plan.counts(0)[step])  # the busiest replica's micro-batches
        parts = [0.0] * (replicas * slots)
        mine = self.norms.take(self.engine.scaler).sum(1).tolist()  # AMP's loss scale divided out
        parts[rank * slots: rank * slots + len(mine)] = mine
        # timed from the previous update's last micro-step to this one's: this update's micro-steps
        # and the previous update's work (all-reduce, optimizer step, decision)
        now = self.clock() if self._micro_stamp is None else self._micro_stamp
        timed = self._last is not None and batch % (micro * replicas) == 0
        cycle = now - self._last if timed else 0.0
        seconds = [cycle, cycle - self._accumulating if timed else 0.0, float(timed)]
        self._last, self._micro_stamp, self._accumulating = now, None, 0.0
        if replicas > 1 or self._xla:
            summed = self.engine.reduce([*parts, *seconds])
            parts, seconds = summed[:-3], [summed[-3] / replicas, summed[-2] / replicas, summed[-1] / replicas]
        timed = seconds[2] == 1 and seconds[1] > 0
        dealt = [int(plan.counts(r)[step]) for r in range(replicas)]
        samples = [micro if j < dealt[r] else 0 for r in range(replicas) for j in range(slots)]
        noise = None
        if sum(1 for s in samples if s) >= 2:  # one part alone cannot tell noise from signal
            grads = [p.grad for p in self.params if p.grad is not None]
            mean_sq = float(torch.stack(torch._foreach_norm(grads)).double().square().sum()) * weight**2 if grads \
                else 0.0
            if self.engine.scaler is not None:  # AMP: the accumulated gradient carries the loss scale
                mean_sq /= float(self.engine.scaler.get_scale()) ** 2
            if all(map(math.isfinite, [*parts, mean_sq])):  # not an inf/NaN step AMP skips
                noise = estimate(parts, samples, mean_sq)
        controller = self.controller
        controller.record(batch, (seconds[0], seconds[1]) if timed else None, noise, micro, slots)

        base = [group["lr"] for group in self.param_groups]
        for group in self.param_groups:
            group["lr"] = self._scaled_lr(group["lr"], batch)
        lr = self.param_groups[0]["lr"]
        try:
            self.updated = self.engine.step(weight)
            self.applied += self.updated
        finally:
            for group, lr_base in zip(self.param_groups, base, strict=True):
                group["lr"] = lr_base
        self.updates += 1
        self.step_index, self.micro = step + 1, 0
        mark_step(self.device)
        done = len(controller.batches)
        smoothed = controller.noise.smoothed.noise_scale if controller.noise.updates else math.nan
        self.history.append((done - 1, batch, lr, smoothed))
        old = controller.batch
        new = controller.propose() if done % self.sampler.interval == 0 else None
        if new is not None and rank == 0:
            plan_new = controller.plan(new)
            log.info("aikit adaptive: update %d: global batch %d -> %d from update %d (%d GA steps x %d per device "
                     "on %d), predicted goodput gain %.1f%%, noise scale %.4g, lr %.4g",
                     done - 1, old, new, done + schedule.lookahead, plan_new.steps, plan_new.batch_size,
                     replicas, (controller.changes[-1][3] - 1) * 100, smoothed, lr)
        schedule.extend(done)
        self._arm()
        if self.log_steps and rank == 0 and self.updates % self.log_steps == 0:
            print(f"aikit adaptive: epoch {self.epoch} update {done - 1} batch {batch} lr {lr:.6g} "
                  f"noise scale {smoothed:.4g}", flush=True)

    def _scaled_lr(self, lr: float, batch: int) -> float:
        noise = self.controller.noise
        return adaptive_lr(lr, batch, self.ref_batchsize, self.rule, noise.smoothed if noise.updates else None,
                           self.updates, self.warmup_steps)

    def write_lr_schedule(self, path: str) -> None:
        """Write the LR of every update as a ``step,lr`` CSV (exact floats): with the sampler's
        trace, ``ConstantOptimizer`` and ``UpdateScheduler(ReplaySchedule(optimizer, path))``
        replay even an AdaScale run bit for bit (for optimizers whose groups share one LR)."""
        if len(self.history) != len(self.controller.batches):
            raise ValueError(
                f"this optimizer saw {len(self.history)} of the run's {len(self.controller.batches)} updates (it was "
                "resumed; the LRs before are not kept): write the schedule from the run that trained them all")
        write_schedule(path, [(update, lr) for update, _, lr, _ in self.history])

    # --- checkpoints: the trace optimizer's state and the adaptive schedule's ------------------------
    _extra_keys = ("adaptive",)

    def _extra_state(self) -> dict:
        return {"adaptive": self.sampler.schedule.state_dict()}

    def _check_position(self, state: dict) -> None:
        trace, schedule = state["trace"], self.sampler.schedule
        sizes, starts, _ = schedule.checked(state["adaptive"])
        problem = schedule.position_problem(sizes, starts, trace["epoch"], trace["step"], trace["micro"],
                                            self.sampler.rank)
        if problem:
            raise ValueError(f"the adaptive state's position does not exist: {problem}")

    def _load_extra(self, state: dict) -> None:
        self.sampler.schedule.load(*self.sampler.schedule.checked(state["adaptive"]))
        self.norms.clear()
        self._last, self._micro_stamp, self._accumulating = None, None, 0.0

    def __repr__(self) -> str:
        return f"AdaptiveOptimizer({self.optimizer!r}, rule={self.rule!r}, base_batch={self.ref_batchsize})"
