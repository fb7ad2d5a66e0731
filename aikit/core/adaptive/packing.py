"""Packing an adaptive run's updates into epochs: :class:`AdaptiveSchedule`, the global batch of
every update, decided while training (see :mod:`aikit.core.adaptive`)."""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from aikit.core.errors import InvalidValue
from aikit.core.schedule import EpochSchedule, checked_settings, numpy_permutation, seed_value
from aikit.core.validate import checked_bool, non_negative_int, positive_int

if TYPE_CHECKING:
    from aikit.core.goodput import BatchSplit, GoodputController

_STATE_KEYS = {"settings", "sizes", "starts", "controller"}


class AdaptiveSchedule:
    """The global batch of every update, decided while training, cut into epochs.

    ``controller`` plans with policy ``"error"``; its ``split`` (:class:`~aikit.core.goodput.BatchSplit`)
    says how every update runs (a fixed micro-batch, or an even split that grows with the batch).
    :meth:`extend` decides the updates up to ``lookahead`` ahead of training; :meth:`epoch` is the
    view of an epoch's updates decided so far. Views grow by appending: an epoch of tens of
    thousands of updates costs the new updates each time, not the epoch.

    ``hold_after``: the first update that starts at or after this many samples of the run
    (:attr:`held_from`) and every later one keep the controller's batch of that moment: no more
    decisions, and no update split to measure the noise, so the rest of the run costs what a fixed
    batch costs (None: the controller decides throughout, as Pollux's). Where it holds follows
    from the batches alone, so a restored schedule holds where the saved one did.
    """

    micro_name = "micro_batch"  # what messages call the micro-batch, as a Schedule's

    def __init__(self, dataset_size: int, controller: GoodputController, seed: int = 42, shuffle: bool = True,
                 lookahead: int = 0, hold_after: int | None = None) -> None:
        split = controller.split
        if split is None:
            raise InvalidValue(f"an adaptive run deals equal micro-batches: its controller must plan with "
                               f"policy='error', got policy={controller.policy!r}")
        self.split = split
        self.dataset_size, self.num_replicas, per_device = checked_settings(
            dataset_size, split.devices, split.per_device, bound=split.grows)  # with grows: the most per device
        self.micro_batch, self.max_device_batch = (None, per_device) if split.grows else (per_device, None)
        self.seed, self.shuffle = seed_value(seed), checked_bool(shuffle, "shuffle")
        self.permutation = numpy_permutation  # the sample order of TraceSampler's default, so a replay matches
        self.controller = controller
        self.lookahead = non_negative_int(lookahead, "lookahead")
        self.hold_after = None if hold_after is None else positive_int(hold_after, "hold_after")
        self.held_from: int | None = None  # the first update that holds the batch (None: not yet)
        self._decided_samples = 0  # samples the updates decided so far take
        self.sizes: list[int] = []  # the global batch of every update decided so far
        self.starts = [0]  # the first update of every epoch begun so far
        self._views: dict[int, tuple[int, EpochSchedule, _Columns]] = {}  # epoch: (end, view, its arrays)
        self._latest: tuple = (None, -1, -1, None)  # (epoch, updates, epochs) decided when it was asked, its view
        self._open_samples = 0  # samples the updates of the last epoch begun take so far
        self._checked_batch = 0  # the controller's batch last found to run
        self.extend(0)

    @property
    def samples_left_out(self) -> int:
        """Samples each epoch leaves out with a fixed micro-batch: fewer than one micro-batch."""
        return 0 if self.split.grows else self.dataset_size % self.micro_batch

    def micro_sizes(self, sizes: list[int] | np.ndarray, first: int) -> np.ndarray | None:
        """The micro-batch of updates ``first, first + 1, ...`` of ``sizes`` where it grows with the
        batch (None: ``micro_batch`` always)."""
        return self.split.micro_sizes(sizes, first)

    # --- deciding ---------------------------------------------------------------------------------
    def extend(self, done: int) -> None:
        """Decide the batches up to update ``done + lookahead`` (updates ``0..done-1`` are trained)."""
        self._hold_if_due()
        while len(self.sizes) <= done + self.lookahead:
            left, update = self.dataset_size - self._open_samples, len(self.sizes)
            self.sizes.append(min(self._chosen(), self.split.largest(left, update)))
            self._open_samples += self.sizes[-1]
            self._decided_samples += self.sizes[-1]
            self._hold_if_due()  # before the next update's split decides whether the epoch goes on
            if not self.split.largest(left - self.sizes[-1], update + 1):
                self.starts.append(len(self.sizes))  # the epoch is full: the next update opens the next one
                self._open_samples = 0

    @property
    def held(self) -> bool:
        """Whether the run holds its batch from :attr:`held_from` on: the controller decides no more."""
        return self.held_from is not None

    def holds(self, update: int) -> bool:
        """Whether ``update`` is one of the held updates (it measures nothing)."""
        return self.held_from is not None and update >= self.held_from

    def _hold_if_due(self) -> None:
        """Hold the batch from the next update on where the updates decided reach ``hold_after``
        samples: it and every later update run whole where they can (no split to measure the noise)."""
        if self.held_from is None and self.hold_after is not None and self._decided_samples >= self.hold_after:
            self.held_from = len(self.sizes)
            self.split = dataclasses.replace(self.split, noise_until=self.held_from)
            c = self.controller
            if not c.changes and c.noise.updates < max(1, c.min_estimates):
                warnings.warn(
                    f"the adaptive run holds its batch {c.batch} from update {self.held_from} (hold_after="
                    f"{self.hold_after} samples), before the controller's first decision: it decides once "
                    f"min_estimates={c.min_estimates} noise estimates are in and has {c.noise.updates}, so the run "
                    "keeps its starting batch; give a larger hold_after, or a smaller min_estimates", stacklevel=2)

    def held_split(self, sizes: list[int]) -> tuple[int | None, BatchSplit]:
        """Where a schedule of ``sizes`` holds its batch (None: not within them) and the split its
        updates ran with: from the batches alone, as :meth:`extend` decided it."""
        split = dataclasses.replace(self.split, noise_until=None)
        if self.hold_after is None:
            return None, split
        reached = np.flatnonzero(np.cumsum([0, *sizes]) >= self.hold_after)  # samples before each update
        if not len(reached):
            return None, split
        update = int(reached[0])
        return update, dataclasses.replace(split, noise_until=update)

    def _chosen(self) -> int:
        """The controller's batch, refused (naming it) if this run cannot deal it."""
        batch = self.controller.batch
        if batch != self._checked_batch:
            if not self.split.runs(np.array([batch]))[0]:
                raise InvalidValue(f"the controller chose batch {batch}, which this run cannot deal: "
                                   f"{self.split.problem('batch', batch)}")
            self._checked_batch = batch
        return batch

    # --- views ------------------------------------------------------------------------------------
    def epoch_bounds(self, epoch: int) -> tuple[int, int, bool]:
        """``(first, end, complete)``: updates ``first..end-1`` of ``epoch`` decided so far."""
        epoch = non_negative_int(epoch, "epoch")
        if epoch >= len(self.starts):
            raise InvalidValue(
                f"epoch {epoch} of the adaptive run has not begun: it starts once the last update of epoch "
                f"{len(self.starts) - 1} is decided; train that epoch to its end first")
        complete = epoch + 1 < len(self.starts)
        return self.starts[epoch], self.starts[epoch + 1] if complete else len(self.sizes), complete

    def epoch(self, epoch: int) -> EpochSchedule:
        """The updates of ``epoch`` decided so far (``complete`` once its last one is)."""
        latest = self._latest  # the view asked for last, while nothing was decided since: the hot path
        if type(epoch) is int and latest[0] == epoch and latest[1] == len(self.sizes) and latest[2] == len(self.starts):
            return latest[3]
        first, end, complete = self.epoch_bounds(epoch)
        cached = self._views.get(epoch)
        if cached is None or cached[0] != end:
            order = cached[1].order if cached else (
                self.permutation(self.seed, epoch, self.dataset_size) if self.shuffle else np.arange(self.dataset_size))
            columns = cached[2] if cached else _Columns(self.micro_sizes if self.split.grows else None)
            sizes, micro = columns.extended(self.sizes, first, end)
            view = EpochSchedule(epoch, first, sizes, order, self.micro_batch, self.num_replicas, complete, micro)
            self._views = {e: v for e, v in self._views.items() if e >= epoch - 1}
            self._views[epoch] = cached = (end, view, columns)
        self._latest = (epoch, len(self.sizes), len(self.starts), cached[1])
        return cached[1]

    # --- checkpoints ------------------------------------------------------------------------------
    def settings(self) -> dict:
        c, split = self.controller, self.split
        per_device = {"max_device_batch": self.max_device_batch, "noise_every": split.noise_every} if split.grows \
            else {"micro_batch": self.micro_batch}
        held = {} if self.hold_after is None else {"hold_after": self.hold_after}  # states saved before it lack it
        return {"dataset_size": self.dataset_size, **per_device,
                "num_replicas": self.num_replicas, "seed": self.seed, "shuffle": self.shuffle,
                # "base_batch": the key states saved before ref_batch_size was its name keep
                "base_batch": c.ref_batch_size, "min_batch": c.min_batch, "max_batch": c.max_batch, **held}

    def identity(self) -> dict:
        """What fixes every update's samples, for ``ElasticState``'s resume check."""
        return {"adaptive": self.settings()}

    def state_dict(self) -> dict:
        return {"settings": self.settings(), "sizes": list(self.sizes), "starts": list(self.starts),
                "controller": self.controller.state_dict()}

    def checked(self, state: dict) -> tuple[list[int], list[int], GoodputController]:
        """``state`` converted for loading, or an error naming what does not fit; changes nothing."""
        if not isinstance(state, dict) or set(state) != _STATE_KEYS:
            keys = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise InvalidValue(f"not an adaptive schedule state: keys {keys}, expected {sorted(_STATE_KEYS)}")
        settings = self.settings()
        if state["settings"] != settings:
            differ = [f"{k} {state['settings'].get(k)!r} then, {settings.get(k)!r} now"
                      for k in [*settings, *(k for k in state["settings"] if k not in settings)]
                      if state["settings"].get(k) != settings.get(k)]
            raise InvalidValue(f"the adaptive state was saved by a run with other settings ({'; '.join(differ)}): "
                               "build the AdaptiveSampler as that run did")
        sizes, starts = [positive_int(s, "sizes[i]") for s in state["sizes"]], [int(s) for s in state["starts"]]
        split = self.held_split(sizes)[1]
        uneven = [size for update, size in enumerate(sizes) if split.largest(size, update) != size]
        if uneven:
            raise InvalidValue(f"the adaptive state holds batch {uneven[0]}, which this run cannot deal in whole "
                               "micro-batches: it was not saved by a run with these settings")
        controller = _blank_copy(self.controller)
        controller.load_state_dict(state["controller"])
        return sizes, starts, controller

    def load(self, sizes: list[int], starts: list[int], controller: GoodputController) -> None:
        self.sizes, self.starts, self.controller, self._views = sizes, starts, controller, {}
        self._latest = (None, -1, -1, None)
        self._open_samples = sum(sizes[starts[-1]:])
        self._decided_samples = sum(sizes)
        self.held_from, self.split = self.held_split(sizes)

    def resume_recorded(self) -> int:
        """Take the updates the controller recorded (a controller restored from a run's end of
        epoch) as this run's, packed by the rule they were decided by, and decide the next;
        returns the epoch to go on with. Refused, changing nothing, where they end inside an
        epoch or could not have been decided over this data set."""
        batches, starts, used = list(self.controller.batches), [0], 0
        split = self.held_split(batches)[1]
        for update, size in enumerate(batches):
            left = self.dataset_size - used
            if size > left or split.largest(size, update) != size:
                raise InvalidValue(
                    f"the controller's update {update} took {size} samples, which an adaptive run over "
                    f"{self.dataset_size} samples cannot deal there ({left} left in its epoch): resume with the data "
                    "set and settings of the run that recorded it")
            used += size
            if not split.largest(left - size, update + 1):
                starts.append(update + 1)
                used = 0
        if used:
            raise InvalidValue(
                f"the controller's {len(batches)} recorded updates end inside epoch {len(starts) - 1} ({used} of "
                f"{self.dataset_size} samples): resume from a controller state saved at the end of an epoch")
        epoch = len(starts) - 1  # every recorded epoch is complete: the next one opens
        self.load(batches, starts, self.controller)
        self.extend(len(batches))
        return epoch

    def position_problem(self, sizes: list[int], starts: list[int], epoch: int, step: int, micro_step: int,
                         rank: int) -> str | None:
        """Why micro-batch ``micro_step`` of ``step`` of ``epoch`` does not exist for ``rank`` in a
        schedule of ``sizes``/``starts`` (None when it does)."""
        if not 0 <= epoch < len(starts):
            return f"epoch {epoch} was not begun"
        end = starts[epoch + 1] if epoch + 1 < len(starts) else len(sizes)
        if not 0 <= step <= end - starts[epoch]:
            return f"no step {step} in epoch {epoch}"
        if step < end - starts[epoch]:
            update = starts[epoch] + step
            grown = self.micro_sizes([sizes[update]], update)
            total = sizes[update] // (self.micro_batch if grown is None else int(grown[0]))
            mine = (total - rank + self.num_replicas - 1) // self.num_replicas
            return None if 0 <= micro_step <= mine else f"no micro-batch {micro_step} of step {step} for rank {rank}"
        return None if micro_step == 0 else f"no micro-batch {micro_step} past the end of epoch {epoch}"


def _blank_copy(controller: GoodputController) -> GoodputController:
    """A controller with ``controller``'s settings, for a state to be loaded into (its
    ``load_state_dict`` replaces every measurement, so nothing is shared once it has)."""
    return copy.copy(controller)


class _Columns:
    """One epoch's batch and micro-batch of every update decided so far, as read-only arrays that
    grow by appending: an epoch view rebuilt after each update costs the new updates, not the
    epoch (its updates can number tens of thousands)."""

    def __init__(self, micro_sizes: Callable[[np.ndarray, int], np.ndarray] | None) -> None:
        self.micro_sizes = micro_sizes  # (sizes, first update) -> their micro-batches; None: fixed
        self.sizes = np.zeros(16, dtype=np.int64)
        self.grown = np.zeros(16, dtype=np.int64) if micro_sizes else None  # each update's grown micro-batch
        self.filled = 0

    def extended(self, sizes: list[int], first: int, end: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Updates ``first..end-1`` of ``sizes`` (an append-only list), appending the new ones."""
        count = end - first
        if count > self.filled:
            new = np.asarray(sizes[first + self.filled:end], dtype=np.int64)
            self.sizes = _appended(self.sizes, self.filled, new)
            if self.grown is not None:
                self.grown = _appended(self.grown, self.filled, self.micro_sizes(new, first + self.filled))
            self.filled = count
        return _read_only(self.sizes[:count]), None if self.grown is None else _read_only(self.grown[:count])


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
