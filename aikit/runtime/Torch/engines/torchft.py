"""TorchFT (Meta's per-step fault tolerance, PyPI ``torchft``, pinned to 0.2.0): replica groups
that go on without a restart when one is lost or comes back.

Every update has its own world. :meth:`TorchFTEngine.membership` asks the lighthouse for the
update's quorum and returns how many replica groups take part and this group's rank among them;
it waits for the quorum (TorchFT's synchronous quorum), so a group that is behind has healed,
fetched the live state and loaded it, before the update's first micro-batch is dealt. Every sum
over the replicas goes through ``Manager.allreduce`` with ``ReduceOp.SUM``: aikit weighs the
gradients itself, so TorchFT's average over the participants (which would train a smaller batch
when one is missing) is never used, nor its ``DistributedDataParallel`` (whose 0.2.0 comm hook
kills the survivor when a peer dies mid-all-reduce). :meth:`TorchFTEngine.commit` asks
``should_commit()``: an update is applied only where it says so. A sum that failed (a group lost
mid-update) raises :class:`~aikit.core.errors.UpdateAborted` after the update was decided (not
committed), and the loop trains it again under the next quorum.

The manager is made by :class:`aikit.elastic.Torch.fault_tolerance.ReplicaGroup`, which hands it
here (:meth:`TorchFTEngine.start`): this module imports no part of TorchFT. Detection finds the
engine in use from then until :meth:`TorchFTEngine.stop`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from aikit.core.errors import CollectiveError, InvalidState, UpdateAborted
from aikit.runtime.Torch.engines.defaults import EngineDefaults
from aikit.runtime.Torch.engines.torch_distributed import buckets


class TorchFTEngine(EngineDefaults):
    """The replica groups of the running quorum, one process each, through a TorchFT ``Manager``."""

    name = "torchft"
    label = "TorchFT replica groups"
    per_update = True

    def __init__(self) -> None:
        self.manager: Any = None
        self.where = ""  # the lighthouse and the timeout bounding a quorum, for messages
        self._reset()

    def _reset(self) -> None:
        self.members = (1, 0)  # (replica groups, this group's rank) of the last quorum; one before the first
        self.quorum = -1  # the lighthouse's id of the last quorum: the same groups, the same id
        self.open = False  # a quorum was taken and its update not decided yet
        self.decision: bool | None = None  # whether the last update was committed (None: not decided yet)
        self.failure = ""  # why the last aborted update's sum failed (the engine's words)

    def start(self, manager: Any, where: str) -> None:
        """Train through ``manager`` (a ``torchft.Manager`` of a one-process group); ``where``
        names the lighthouse and the quorum timeout in messages."""
        if self.manager is not None:
            raise InvalidState("this process already trains in a TorchFT replica group: stop() that one first")
        self.manager, self.where = manager, where
        self._reset()

    def stop(self) -> Any:
        """Leave the replica groups (detection finds another engine again); returns the manager."""
        manager, self.manager = self.manager, None
        self._reset()
        return manager

    def in_use(self) -> bool:
        return self.manager is not None

    def world_size(self) -> int:
        return self.members[0]

    def rank(self) -> int:
        return self.members[1]

    def local_rank(self) -> int:
        return 0  # one process per replica group

    def device_count(self) -> int:
        return self.world_size()

    # --- an update: its quorum, then its decision -----------------------------------------------
    def membership(self) -> tuple[int, int]:
        """(replica groups, this group's rank) of the update about to be dealt: its quorum, taken
        once per update (a group behind heals before this returns)."""
        if not self.open:
            try:
                self.manager.start_quorum()
            except (RuntimeError, OSError) as error:  # the lighthouse unreachable, or no quorum in time
                raise CollectiveError(
                    f"no TorchFT quorum from {self.where}: {str(error).strip()[:300]}. Start the lighthouse "
                    "(torchft_lighthouse --min_replicas N --bind HOST:PORT) and give ReplicaGroup its address; "
                    "a quorum also waits for min_replicas groups (docs/resize.md, No restart: TorchFT)"
                ) from error
            rank = self.manager.participating_rank()
            if rank is None:
                raise InvalidState("this replica group is not among the quorum's participants (TorchFT's spares): "
                                   "aikit trains every group of the quorum, WorldSizeMode.DYNAMIC")
            self.members, self.open, self.decision = (self.manager.num_participants(), rank), True, None
            self.quorum = self.manager._quorum_id  # torchft 0.2.0's: a new id whenever the groups differ
        return self.members

    def commit(self) -> bool:
        """Whether the update the groups just summed may be applied (``should_commit()``); it
        closes the update, which the next :meth:`membership` follows."""
        self._require_open("the update's commit")
        self.decision, self.open = bool(self.manager.should_commit()), False
        return self.decision

    def _require_open(self, what: str) -> None:
        if not self.open:
            raise InvalidState(
                f"{what} under TorchFT needs the update's quorum first: every update is dealt after its own "
                "quorum, so train through ReplicaGroup.micro_batches(), which takes it, and call optimizer.step() "
                "once per micro-batch it yields"
            )

    def _check(self, what: str) -> None:
        """Decide the update (not committed) and raise :class:`UpdateAborted` where its sum failed."""
        error = self.manager.errored()
        if error is None:
            return
        self.failure = str(getattr(error, "original_exception", error)).strip()
        self.commit()
        raise UpdateAborted(
            f"{what} over {self.members[0]} TorchFT replica groups failed: {self.failure[:300]}; the update was not "
            "committed, and is trained again on the same samples under the next quorum"
        )

    # --- collectives, through the manager -------------------------------------------------------
    def all_reduce_sum_(self, tensors: list[torch.Tensor]) -> None:
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

        self._require_open("a sum over the replica groups")
        if self.members[0] == 1:
            return
        for bucket in buckets(tensors):
            flat = _flatten_dense_tensors(bucket)
            self.manager.allreduce(flat, reduce_op=dist.ReduceOp.SUM).wait()
            self._check(f"an all-reduce of {len(bucket)} tensor(s)")
            for tensor, reduced in zip(bucket, _unflatten_dense_tensors(flat, bucket), strict=True):
                tensor.copy_(reduced)

    def broadcast_(self, tensors: list[torch.Tensor], src: int) -> None:
        """Replica ``src``'s tensors, as a sum to which the others add zeros (exact)."""
        self._require_open("a broadcast over the replica groups")
        if self.members[0] == 1:
            return
        if self.rank() != src:
            for tensor in tensors:
                tensor.zero_()
        self.all_reduce_sum_(tensors)

    def broadcast_object(self, obj: Any, what: str, src: int) -> Any:
        raise InvalidState(
            f"{what} under TorchFT: aikit sends no Python object between replica groups (it would be unpickled); "
            "a group that joins heals instead, fetching the live state as tensors and JSON"
        )

    def can_start_all_reduce(self) -> bool:
        return self.open and self.members[0] > 1

    def start_all_reduce_sum_(self, tensor: torch.Tensor, name: str) -> Callable[[], None]:
        self._require_open(f"the all-reduce of {name}")
        work = self.manager.allreduce(tensor, reduce_op=dist.ReduceOp.SUM)

        def wait() -> None:
            work.wait()
            self._check(f"the all-reduce of {name}")

        return wait


TORCHFT = TorchFTEngine()
