"""The samples of every update of a GA run, dealt anew to whichever replicas train it.

Where every update has its own world (TorchFT's replica groups), the GA wrapper
(:class:`aikit.ga.Torch.optim.Optimizer`) cannot be fed by a loader fixed in advance: the samples
of an update are the same whoever trains it, but each replica's share, and its GA steps, follow
from the replicas there are. :class:`UpdateSampler` keeps the first and makes the second. Every
epoch is a permutation of the data set (:class:`aikit.core.schedule.Schedule`: seeded by the seed
and the epoch, the same on every replica) cut into updates of ``global_batch_size`` samples; an
update is dealt by the plan ``init(G, M)`` makes for the replicas of that update
(:func:`aikit.core.plan.make_plan`, :func:`~aikit.core.plan.micro_batch_slices`): the same GA steps
on every replica, micro-batches that differ by at most one sample (exact weights through
``accumulate(samples=n)``), and empty ones where a replica has no sample in a step. Its position
(epoch, update) is its ``state_dict``: keep the sampler in the ``ElasticState``.
"""

from __future__ import annotations

from collections.abc import Sized

import numpy as np

from aikit.core.errors import InvalidValue
from aikit.core.plan import make_plan, micro_batch_slices
from aikit.core.schedule import EpochSchedule, Schedule
from aikit.core.validate import checked_bool, checked_int, positive_int


class UpdateSampler:
    """Every update's ``global_batch_size`` samples, and this replica's micro-batches of them for
    the replicas of the update (at most ``max_device_batch`` samples each)."""

    def __init__(self, dataset: Sized | int, global_batch_size: int, max_device_batch: int, *, seed: int = 42,
                 shuffle: bool = True) -> None:
        size = dataset if isinstance(dataset, int) else len(dataset)
        self.global_batch_size = positive_int(global_batch_size, "global_batch_size")
        self.max_device_batch = positive_int(max_device_batch, "max_device_batch")
        self.schedule = Schedule(self.global_batch_size, size, 1, micro_batch=self.global_batch_size, seed=seed,
                                 shuffle=checked_bool(shuffle, "shuffle"))
        self.epoch, self.update = 0, 0  # the update to train next
        self._plan: EpochSchedule = self.schedule.epoch(0)

    @property
    def updates_per_epoch(self) -> int:
        return len(self._plan)

    @property
    def done(self) -> bool:
        """Whether every update of the epoch was trained."""
        return self.update >= self.updates_per_epoch

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch``; the epoch in progress keeps its position (after a load or a heal)."""
        epoch = checked_int(epoch, "epoch", 0, None, "a non-negative integer")
        if epoch != self.epoch:
            self.epoch, self.update, self._plan = epoch, 0, self.schedule.epoch(epoch)

    def window(self) -> np.ndarray:
        """The samples of the update to train next, over every replica: its global batch."""
        return self._plan.step_indices(self.update)

    def micro_batches(self, num_replicas: int, rank: int) -> list[np.ndarray]:
        """Replica ``rank``'s micro-batch of each GA step of the next update, dealt to ``replicas``
        by their plan (an empty one where it has no sample in a step)."""
        plan = make_plan(self.global_batch_size, self.max_device_batch, num_replicas, rank=rank)
        window = self.window()
        if rank >= plan.num_replicas:  # more replicas than samples: this one sits the update out
            return [window[:0]] * plan.micro_steps
        return [window[part] for part in micro_batch_slices(plan, rank)]

    def advance(self) -> None:
        """The update was trained (committed): go on to the next."""
        self.update += 1

    def state_dict(self) -> dict:
        schedule = self.schedule
        return {"epoch": self.epoch, "update": self.update, "dataset_size": schedule.dataset_size,
                "global_batch_size": self.global_batch_size, "max_device_batch": self.max_device_batch,
                "seed": schedule.seed, "shuffle": schedule.shuffle}

    def load_state_dict(self, state: dict) -> None:
        """Go on from ``state`` (checked whole first): the same samples, from its position."""
        mine = self.state_dict()
        if not isinstance(state, dict) or set(state) != set(mine):
            raise InvalidValue(f"not an UpdateSampler state: expected keys {sorted(mine)}, got "
                               f"{sorted(state) if isinstance(state, dict) else type(state).__name__}")
        differ = [f"{key} {state[key]!r} (this sampler: {mine[key]!r})" for key in mine
                  if key not in ("epoch", "update") and state[key] != mine[key]]
        if differ:
            raise InvalidValue(f"this UpdateSampler state deals other samples: {', '.join(differ)}; build the "
                               "sampler with the settings of the run that saved it")
        epoch = checked_int(state["epoch"], "the state's epoch", 0, None, "a non-negative integer")
        plan = self.schedule.epoch(epoch)
        update = checked_int(state["update"], "the state's update", 0, len(plan), f"an integer in 0..{len(plan)}")
        self.epoch, self.update, self._plan = epoch, update, plan
