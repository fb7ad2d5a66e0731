"""No restart when a replica group is lost or comes back: aikit on TorchFT, the global batch kept exactly.

TorchFT (Meta's per-step fault tolerance; ``pip install 'aikit-elastic[torchft]'``, pinned to
``torchft==0.2.0``) runs replica groups that a lighthouse gathers into a quorum before every
update: a group that dies or hangs is left out once its heartbeat stops, one that comes back heals
from a live group and takes part in the next update, and nobody restarts. TorchFT alone averages
over the groups that take part, so an update without one trains a smaller batch at the same LR.

A :class:`ReplicaGroup` keeps every update's global batch the one the trace or the plan says.
Before each update it takes the update's quorum (a group that is behind heals there), deals the
update's samples over the groups that take part (a trace step's micro-batches,
``TraceSampler.set_world``; a GA update by the plan for them, :class:`UpdateSampler`) and yields
this group's share; the optimizer sums the gradients through TorchFT's manager with aikit's own
weights (a sum, never TorchFT's average) and applies them only where TorchFT commits; an update
not committed (a group lost in the middle of it) is trained again on the same samples under the
next quorum. A group that heals fetches the whole ``ElasticState`` (models, optimizers with
their trace position or GA window, the UpdateSampler's position, schedulers, plain values, the
random streams) as commit bytes (:mod:`aikit.elastic.Torch.heal_transport`, never pickled).
TorchFT's step count is tied to the updates the run committed, so a group that heals is at the
same sample of the same epoch. A restart of the whole job goes on from the ``ElasticState``'s
commits: ``state.restore()`` before :meth:`ReplicaGroup.start`.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from aikit.core.errors import CollectiveError, InvalidState, InvalidValue, TrainingFailed
from aikit.core.validate import checked_float, positive_int
from aikit.elastic.Torch.heal_transport import CommitTransport
from aikit.elastic.Torch.resize import ElasticState
from aikit.elastic.Torch.update_loops import loop_of
from aikit.optional import require
from aikit.runtime.Torch.engines import replica_groups

SLOW_UPDATES = 2  # updates in a row that time out with every group alive: timeout_s is shorter than an update


class ReplicaGroup:
    """This process as one TorchFT replica group of a run that keeps ``state``.

    ``lighthouse`` is the lighthouse's address (``http://host:29510``; default ``$TORCHFT_LIGHTHOUSE``),
    ``replica_id`` this group's name (default ``$REPLICA_GROUP_ID``, else host and process id),
    ``min_replicas`` the fewest groups an update may be committed with. ``timeout_s`` bounds how
    long a hung or silent group holds the others in a sum (and a heal's fetch): it must exceed
    the longest an update takes. ``quorum_timeout_s`` bounds the wait for a quorum and for
    ``min_replicas`` groups. ``heartbeat_s`` is how often this group tells the lighthouse it lives
    (the lighthouse's ``--heartbeat_timeout_ms`` drops a group silent that long). ``host`` is the
    address other groups reach this one at (its store and its state). ``commit_every`` commits
    ``state`` every that many committed updates (rank 0 of the quorum writes). ``on_update(group,
    committed)`` is called after every update this group took part in, committed or not.
    """

    def __init__(self, state: ElasticState, lighthouse: str | None = None, *, replica_id: str | None = None,
                 min_replicas: int = 1, timeout_s: float = 30.0, quorum_timeout_s: float = 60.0,
                 heartbeat_s: float = 0.1, host: str | None = None, commit_every: int | None = None,
                 on_update: Callable[[ReplicaGroup, bool], None] | None = None, verbose: bool = True) -> None:
        if not isinstance(state, ElasticState):
            raise InvalidValue(f"ReplicaGroup keeps an ElasticState (what a group that heals fetches), got "
                               f"{type(state).__name__}: ReplicaGroup(ElasticState(directory, model=..., "
                               "optimizer=...))")
        self.state, self.loop = state, loop_of(state._objects)
        self.lighthouse = lighthouse or os.environ.get("TORCHFT_LIGHTHOUSE")
        if not self.lighthouse:
            raise InvalidValue("ReplicaGroup needs the lighthouse's address: ReplicaGroup(state, 'http://host:29510') "
                               "or TORCHFT_LIGHTHOUSE; start it with torchft_lighthouse --min_replicas N")
        self.replica_id = replica_id or os.environ.get("REPLICA_GROUP_ID") or f"{socket.gethostname()}-{os.getpid()}"
        self.min_replicas = positive_int(min_replicas, "min_replicas")
        positive = "a positive number of seconds"
        self.timeout_s, self.quorum_timeout_s, self.heartbeat_s = (
            checked_float(value, name, positive, lambda s: 0 < s < 1e6)
            for value, name in ((timeout_s, "timeout_s"), (quorum_timeout_s, "quorum_timeout_s"),
                                (heartbeat_s, "heartbeat_s")))
        self.host = host or socket.gethostname()
        self.commit_every = None if commit_every is None else positive_int(commit_every, "commit_every")
        self.on_update, self.verbose = on_update, bool(verbose)
        self.committed = self.aborted = self.heals = 0  # updates committed, not committed, heals: this process's
        self._store: Any = None
        self._taken = False  # the quorum of the update about to be trained is taken
        self._slow = 0  # updates in a row that timed out although every group came back
        self._timed_out: tuple[int, int] | None = None  # the members of the last update, if it timed out
        self._members, self._quorum = (0, 0), -1  # of the last update this group was dealt

    # ---- joining and leaving -----------------------------------------------------------------

    def start(self) -> ReplicaGroup:
        """Join the lighthouse as a replica group (after ``state.restore()``, for a restart of the
        whole job): a named error within ``quorum_timeout_s`` where it cannot be reached."""
        if self._store is not None or replica_groups.manager is not None:
            raise InvalidState("this process trains in a TorchFT replica group already: stop() it first")
        self._refuse_several_processes()
        manager_module = require("torchft.manager", "ReplicaGroup (TorchFT replica groups)")
        groups = require("torchft.process_group", "ReplicaGroup (TorchFT replica groups)")
        timeout, quorum = timedelta(seconds=self.timeout_s), timedelta(seconds=self.quorum_timeout_s)
        self._store = dist.TCPStore(self.host, 0, is_master=True, wait_for_workers=False)
        transport = CommitTransport(self.host, timeout)
        try:
            manager = manager_module.Manager(
                pg=groups.ProcessGroupGloo(timeout=timeout), load_state_dict=None, state_dict=None,
                min_replica_size=self.min_replicas, use_async_quorum=False, timeout=timeout, quorum_timeout=quorum,
                connect_timeout=quorum, rank=0, world_size=1, store_addr=self.host, store_port=self._store.port,
                lighthouse_addr=self.lighthouse, replica_id=self.replica_id, hostname=self.host,
                heartbeat_interval=timedelta(seconds=self.heartbeat_s), checkpoint_transport=transport)
        except RuntimeError as error:  # the lighthouse refused the connection (within connect_timeout)
            transport.shutdown()
            self._store = None
            raise CollectiveError(
                f"the TorchFT lighthouse at {self.lighthouse} cannot be reached within quorum_timeout_s="
                f"{self.quorum_timeout_s:g}: {str(error).strip()[:300]}. Start it (torchft_lighthouse --min_replicas N "
                "--bind HOST:PORT), or fix the address") from error
        manager.register_state_dict_fn("aikit", self._heal, self.state.snapshot)
        manager.load_state_dict({"step": self.loop.updates_done(), "batches_committed": 0})  # updates committed so far
        replica_groups.start(manager,
                             f"the lighthouse at {self.lighthouse} (quorum_timeout_s={self.quorum_timeout_s:g})")
        return self

    def stop(self) -> None:
        """Leave the replica groups: the others go on without this one."""
        manager = replica_groups.stop() if replica_groups.manager is not None else None
        if manager is not None:
            manager.shutdown(wait=False)
        self._store, self._taken = None, False

    def __enter__(self) -> ReplicaGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _refuse_several_processes(self) -> None:
        processes = dist.get_world_size() if dist.is_available() and dist.is_initialized() else int(
            os.environ.get("WORLD_SIZE", "1") or 1)
        if processes > 1:
            raise InvalidValue(
                f"this replica group has {processes} processes (torch.distributed's world, or torchrun's WORLD_SIZE): "
                "aikit trains TorchFT replica groups of one process each so far; start one process per group "
                "(several groups on a machine are fine), each with its own ReplicaGroup")

    # ---- the training loop ---------------------------------------------------------------------

    def epochs(self, count: int) -> Iterator[int]:
        """Epochs ``0..count-1`` from where the run stands (a group that heals, from where the
        live groups stand), each set on the sampler and the optimizer."""
        count = positive_int(count, "count")
        self._require_started()
        while self.loop.epoch() < count:
            self._membership()  # a group that is behind heals here, before the epoch is chosen
            epoch = self.loop.epoch()
            if epoch >= count:
                return
            self.loop.start_epoch(epoch)
            before = self.loop.updates_done()
            yield epoch
            if self.loop.updates_done() == before and self.loop.epoch() == epoch:
                raise InvalidState("an epoch of ReplicaGroup.epochs() trained nothing: iterate "
                                   "group.micro_batches() inside it and call optimizer.step() for each micro-batch")

    def micro_batches(self) -> Iterator[list[int]]:
        """This group's micro-batches (sample indices) of every update left in the epoch, each update
        dealt after its quorum; train each and call ``optimizer.step()``. An update not committed is
        dealt and trained again."""
        self._require_started()
        epoch = self.loop.epoch()
        while not self.loop.epoch_done() and self.loop.epoch() == epoch:
            self._membership()
            if self.loop.epoch_done() or self.loop.epoch() != epoch:  # healed into another epoch: epochs() goes on
                return
            before = self.loop.updates_done()
            yield from self.loop.update()
            self._decided(before)

    @property
    def updates(self) -> int:
        """Updates the run has committed since it began (TorchFT's step): the next update's number."""
        return self.loop.updates_done()

    @property
    def replicas(self) -> int:
        """Replica groups in the last quorum."""
        return replica_groups.members[0]

    @property
    def rank(self) -> int:
        """This group's rank in the last quorum."""
        return replica_groups.members[1]

    def _require_started(self) -> None:
        if self._store is None:
            raise InvalidState("call group.start() (or use `with group:`) before training: it joins the lighthouse")

    def _membership(self) -> tuple[int, int]:
        """The next update's quorum, taken once: enough groups, the state healed, the update dealt."""
        if self._taken:
            return replica_groups.members
        waited_since = None
        while True:
            replicas, rank = replica_groups.membership()
            failed = replica_groups.manager.errored()  # the quorum's process group or heal failed
            if failed is None and replicas >= self.min_replicas:
                break
            replica_groups.commit()  # decided at once, not committed, nothing trained
            waited_since = waited_since or time.monotonic()
            if time.monotonic() - waited_since > self.quorum_timeout_s:
                if failed is not None:
                    raise CollectiveError(f"TorchFT's quorums failed for {self.quorum_timeout_s:g} s "
                                          f"(quorum_timeout_s): {str(failed).strip()[:300]}") from failed
                raise TrainingFailed(
                    f"only {replicas} TorchFT replica group(s) in the quorum, fewer than min_replicas="
                    f"{self.min_replicas}, for {self.quorum_timeout_s:g} s (quorum_timeout_s): start more "
                    f"groups, or lower min_replicas (start the lighthouse with --min_replicas {self.min_replicas} "
                    "so that it forms no quorum without them)")
            time.sleep(min(0.5, self.quorum_timeout_s / 10))
        self._check_slow((replicas, rank))
        step = replica_groups.manager.current_step()
        if step != self.loop.updates_done():
            raise InvalidState(f"TorchFT's step {step} is not the {self.loop.updates_done()} updates this group's "
                               "state "
                               "has committed: the replica groups do not train one run (the same state, settings "
                               "and data?)")
        self.loop.deal(replicas, rank, replica_groups.quorum != self._quorum)
        self._quorum = replica_groups.quorum
        if rank == 0 and self._members[1] != 0:
            self.state.take_over_commits()  # this group writes the commits now
        if self.verbose and (replicas, rank) != self._members:
            print(f"aikit torchft: update {step}: {replicas} replica group(s), {self.replica_id} is rank {rank}",
                  flush=True)
        self._members, self._taken = (replicas, rank), True
        return replicas, rank

    def _decided(self, before: int) -> None:
        """The update this group was dealt is done: committed, or to train again."""
        self._taken = False
        if replica_groups.open:
            raise InvalidState("an update of ReplicaGroup.micro_batches() was not made: call optimizer.step() after "
                               "every micro-batch it yields (the last one's makes the update)")
        if replica_groups.decision:
            self.committed += 1
            self._timed_out = None
            if self.loop.updates_done() != before + 1:
                raise InvalidState(f"the update at {before} was committed but the run stands at "
                                   f"{self.loop.updates_done()}")
            if self.commit_every and replica_groups.manager.current_step() % self.commit_every == 0:
                self.state.commit()
        else:
            self.aborted += 1
            timed_out = "timed out" in replica_groups.failure.lower() or "timeout" in replica_groups.failure.lower()
            self._timed_out = replica_groups.members if timed_out else None
        if self.on_update is not None:
            self.on_update(self, bool(replica_groups.decision))

    def _check_slow(self, members: tuple[int, int]) -> None:
        """Refuse a ``timeout_s`` shorter than an update: its sum timed out, and every group came back."""
        if self._timed_out is None or self._timed_out != members:
            self._slow = 0
            return
        self._slow += 1
        if self._slow >= SLOW_UPDATES:
            raise TrainingFailed(
                f"{self._slow} updates in a row timed out in their sum over {members[0]} replica groups although every "
                f"group came back for the next quorum: timeout_s={self.timeout_s:g} is shorter than an update takes "
                "on the slowest group, so every update times out while its peers still compute. Give ReplicaGroup a "
                "timeout_s above the longest update (it bounds how long a hung group holds the others)")

    def _heal(self, payload: dict) -> None:
        """Load a live group's state (TorchFT calls it in the quorum of a group that is behind)."""
        self.state.load_snapshot(payload, replica_groups.manager.participating_rank() or 0)
        self.heals += 1
        if self.verbose:
            print(f"aikit torchft: {self.replica_id} healed from a live group at update {self.loop.updates_done()}",
                  flush=True)

    def __repr__(self) -> str:
        return (f"ReplicaGroup({self.replica_id!r}, lighthouse={self.lighthouse!r}, min_replicas={self.min_replicas}; "
                f"{self.committed} updates committed, {self.aborted} not, {self.heals} heals)")
