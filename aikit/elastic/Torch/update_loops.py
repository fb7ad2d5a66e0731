"""The two trainings a :class:`~aikit.elastic.Torch.fault_tolerance.ReplicaGroup` deals update by
update: a trace optimizer's steps, or the GA wrapper's updates of an :class:`UpdateSampler`.

Each says where the run stands (the updates committed since it began, which TorchFT's step count
follows, and the epoch), deals the next update to the replicas of its quorum and yields this
replica's micro-batches of it, as lists of sample indices. The user's loop trains each and calls
``optimizer.step()``; the last one's makes the update, which commits or not. A replica with no
micro-batch in an update still joins it (zero gradients), here, without the user's loop.
"""

from __future__ import annotations

from collections.abc import Iterator

from aikit.core.errors import InvalidValue
from aikit.elastic.Torch.trace_optim import TraceOptimizer
from aikit.elastic.Torch.update_sampler import UpdateSampler
from aikit.ga.Torch.optim import Optimizer as GAOptimizer


class TraceLoop:
    """A trace optimizer's steps (its sampler dealt to each update's replicas, ``set_world``)."""

    def __init__(self, optimizer: TraceOptimizer) -> None:
        self.optimizer = optimizer

    def updates_done(self) -> int:
        """Steps of the trace trained (committed) since the run began."""
        return self.optimizer.epoch_schedule.first_step + self.optimizer.step_index

    def epoch(self) -> int:
        """The epoch in progress (the next one once this one's steps are done)."""
        return self.optimizer.epoch + self.epoch_done()

    def epoch_done(self) -> bool:
        return self.optimizer.step_index >= len(self.optimizer.epoch_schedule)

    def start_epoch(self, epoch: int) -> None:
        self.optimizer.sampler.set_epoch(epoch)
        self.optimizer.set_epoch(epoch)

    def deal(self, num_replicas: int, rank: int, new_quorum: bool) -> None:
        """Deal the step to ``replicas`` (the same samples, another share for each), as a resize
        does; in a quorum of other groups every group compares its settings in the update's sum
        (all of them: the sum's size must be the same on every group)."""
        opt, sampler = self.optimizer, self.optimizer.sampler
        if (sampler.num_replicas, sampler.rank) != (num_replicas, rank):
            sampler.set_world(num_replicas, rank)
            opt.redeal()
        if new_quorum:
            opt.compare_again()

    def update(self) -> Iterator[list[int]]:
        opt = self.optimizer
        batches = opt.epoch_schedule.micro_batches(opt.step_index, opt.sampler.rank)
        if not batches:
            opt.sit_out()
        for batch in batches[opt.micro_step:]:
            yield batch.tolist()


class PlanLoop:
    """The GA wrapper's updates, each dealt by the plan for its replicas (:class:`UpdateSampler`)."""

    def __init__(self, optimizer: GAOptimizer, sampler: UpdateSampler) -> None:
        if not optimizer.reduce:
            raise InvalidValue(
                "under TorchFT the GA Optimizer must sum the gradients over the replica groups itself, through "
                "TorchFT's manager: build it with reduce=True and train the plain model (no DistributedDataParallel)")
        if optimizer.global_batch_size != sampler.global_batch_size:
            raise InvalidValue(
                f"the GA Optimizer's global_batch_size is {optimizer.global_batch_size}, the UpdateSampler's "
                f"{sampler.global_batch_size}: give Optimizer(..., global_batch_size={sampler.global_batch_size})")
        self.optimizer, self.sampler = optimizer, sampler
        self.members = (1, 0)

    def updates_done(self) -> int:
        return self.sampler.epoch * self.sampler.updates_per_epoch + self.sampler.update

    def epoch(self) -> int:
        return self.sampler.epoch + self.sampler.done

    def epoch_done(self) -> bool:
        return self.sampler.done

    def start_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def deal(self, num_replicas: int, rank: int, new_quorum: bool) -> None:
        self.members = num_replicas, rank

    def update(self) -> Iterator[list[int]]:
        opt = self.optimizer
        parts = self.sampler.micro_batches(*self.members)
        opt.steps = len(parts)  # the plan's GA steps for these replicas, the same on every one
        for part in parts:
            if len(part):
                yield part.tolist()
        for _ in range(sum(not len(part) for part in parts)):  # no sample here in this GA step: zeros
            with opt.accumulate(samples=0):
                pass
            opt.step()
        if opt.committed:
            self.sampler.advance()


def loop_of(objects: dict) -> TraceLoop | PlanLoop:
    """The training an ElasticState's ``objects`` keep: a trace optimizer, or a GA Optimizer with an
    UpdateSampler; refused otherwise, naming what to keep."""
    traced = [obj for obj in objects.values() if isinstance(obj, TraceOptimizer)]
    ga = [obj for obj in objects.values() if isinstance(obj, GAOptimizer)]
    samplers = [obj for obj in objects.values() if isinstance(obj, UpdateSampler)]
    if len(traced) == 1 and not ga and not samplers:
        return TraceLoop(traced[0])
    if len(ga) == 1 and len(samplers) == 1 and not traced:
        return PlanLoop(ga[0], samplers[0])
    raise InvalidValue(
        "ReplicaGroup deals the updates of a trace optimizer (TraceSampler + TraceOptimizer, or eth-easl's names) or "
        "of the GA Optimizer fed by an UpdateSampler: keep one trace optimizer, or one GA Optimizer and one "
        f"UpdateSampler, in the ElasticState (it keeps {sorted(objects)})")
