"""PyTorch's data-parallel engines as objects: what an engine provides, which ones exist, and
which one this process runs.

An engine says where a process trains (the replicas, this one's rank, the devices) and moves
tensors between the replicas. :mod:`aikit.runtime.Torch.distributed` and
:mod:`aikit.runtime.Torch.collectives` ask :func:`current` and delegate to it, so no other
module of aikit names an engine.

:func:`current` walks :data:`ENGINES` in order, twice: first for an engine *in use* (an
initialised torch.distributed group, then an initialised Horovod, then an imported torch_xla;
aikit imports neither Horovod nor torch_xla itself), then for one only *launched* (torchrun's
``WORLD_SIZE`` before ``init_process_group``: a script may call ``aikit.elastic.Torch.init()``
first), where one process, last, always answers. TorchFT's replica groups come first: a group in
use trains across the groups whatever else the process runs. Tensors on a device an engine owns (XLA's)
go through that engine whatever else runs.

Adding an engine (issue 37's Ray Train, say) takes two files: a module here whose class
provides everything :class:`Engine` lists (``tests/torch/test_engines.py`` checks that it does;
it subclasses :class:`~aikit.runtime.Torch.engines.defaults.EngineDefaults` for what it leaves
as most engines have it), and one line in :data:`ENGINES` at its place in the order. An engine that runs on top of
another (Ray's workers run torch.distributed) may subclass it and change only its detection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from aikit.runtime.Torch.engines.horovod import HOROVOD, horovod_torch
from aikit.runtime.Torch.engines.single import SINGLE
from aikit.runtime.Torch.engines.torch_distributed import TORCH_DISTRIBUTED
from aikit.runtime.Torch.engines.torchft import TORCHFT
from aikit.runtime.Torch.engines.xla import XLA, hosts, spmd_devices

__all__ = ["ENGINES", "Engine", "ReplicaGroups", "Resizing", "current", "horovod_torch", "hosts", "owner",
           "replica_groups", "spmd_devices"]


class Resizing(Protocol):
    """An engine's side of one elastic state, where the engine re-forms the world itself as
    workers come and go (Horovod elastic: ``hvd.elastic.run`` drives the state)."""

    def hosts_updated(self, timestamp: Any, update: Any) -> None:
        """The engine's driver saw hosts come or go (acted on at the next commit)."""

    def reset(self) -> None:
        """The world was formed again: forget what the old one's driver said."""

    def check_hosts(self) -> None:
        """After a commit, with every worker (a collective): stop for a resize where hosts changed."""


class ReplicaGroups(Protocol):
    """The engine of replica groups that go on when one is lost or comes back (TorchFT), as the
    front end that starts it drives it (``aikit.elastic.Torch.fault_tolerance.ReplicaGroup``): a
    manager handed in and taken back, and what the last quorum and its update said."""

    manager: Any
    members: tuple[int, int]  # (groups, this group's rank) of the last quorum
    quorum: int  # the last quorum's id: the same groups, the same id
    open: bool  # a quorum was taken and its update not decided yet
    decision: bool | None  # whether the last update was committed (None: not decided yet)
    failure: str  # why the last aborted update's sum failed

    def start(self, manager: Any, where: str) -> None:
        """Train through ``manager`` from now on (``where`` names its lighthouse in messages)."""

    def stop(self) -> Any:
        """Train through it no more; returns the manager."""

    def membership(self) -> tuple[int, int]:
        """(groups, rank) of the quorum of the update about to be dealt."""

    def commit(self) -> bool:
        """Whether the update just summed may be applied (closes the update)."""


class Engine(Protocol):
    """What a data-parallel engine provides. A collective waits for every replica, which must
    all call it with tensors of the same shapes, in the same order."""

    name: str
    """What ``aikit.elastic.Torch.distributed.engine()`` returns for it (``"torch.distributed"``)."""
    label: str
    """How a message names where the process runs (``"one process"``)."""
    lazy: bool
    """Tensors are traced into a graph that every replica compiles and runs alike (XLA): the
    update cuts the graph before it reduces, reduces even on one replica (the same program for
    every world), and reads nothing from the device to branch on (a parameter no replica
    touched gets a zero gradient)."""
    per_update: bool
    """Every update has its own world, known from its quorum (TorchFT): no update may be dealt
    or joined before its :meth:`membership` (a replica with nothing to do in a step waits for it
    instead of joining ahead)."""

    def in_use(self) -> bool:
        """Whether this process has initialised the engine (detection's first pass)."""

    def launched(self) -> bool:
        """Whether the launcher's environment names the engine although nothing is initialised
        yet (detection's second pass, when no engine is in use)."""

    def owns(self, device: torch.device) -> bool:
        """Whether tensors on ``device`` go through this engine whatever else runs."""

    def world_size(self) -> int:
        """The number of replicas."""

    def rank(self) -> int:
        """This replica's rank, 0 to ``world_size() - 1``."""

    def local_rank(self) -> int:
        """This process's rank on its machine: the device it should use."""

    def device_count(self) -> int:
        """The devices the run trains on (every replica's)."""

    def all_reduce_sum_(self, tensors: list[torch.Tensor]) -> None:
        """Replace every tensor by its sum over the replicas, in place."""

    def broadcast_(self, tensors: list[torch.Tensor], src: int) -> None:
        """Overwrite every tensor with replica ``src``'s, in place."""

    def broadcast_object(self, obj: Any, what: str, src: int) -> Any:
        """Replica ``src``'s picklable ``obj`` (``what`` names the broadcast in a failure)."""

    def can_start_all_reduce(self) -> bool:
        """Whether :meth:`start_all_reduce_sum_` can overlap a sum with the work that follows."""

    def start_all_reduce_sum_(self, tensor: torch.Tensor, name: str) -> Callable[[], None]:
        """Start summing ``tensor`` in place; returns the function that waits for the sum.
        ``name`` identifies it where the engine matches sums by name (Horovod)."""

    def mark_step(self, device: torch.device) -> None:
        """Cut the lazy graph of ``device`` here (a no-op where nothing is lazy)."""

    def resizing(self) -> Resizing | None:
        """A new :class:`Resizing` for an elastic state where the engine itself re-forms the world
        when workers come and go (Horovod elastic), so that the state follows its protocol; None
        where aikit's ``restore()`` re-forms it (torchrun restarts every worker). Local."""

    def membership(self) -> tuple[int, int]:
        """(replicas, this replica's rank) for the update about to be dealt: the world, or where
        every update has its own (TorchFT), the update's quorum, taken once per update."""

    def commit(self) -> bool:
        """Whether the update just summed over the replicas may be applied: always, except where
        a quorum decides it (TorchFT's ``should_commit()``), which also closes the update."""

    def keep_whole(self, kind: type) -> None:
        """Have the engine's own elastic state (Horovod's ``hvd.elastic.TorchState``) save,
        restore and sync objects of ``kind`` whole, through their ``state_dict``. Local (no
        collective); a no-op for an engine without such a state."""


ENGINES: tuple[Engine, ...] = (  # in the order detection asks them
    TORCHFT,
    TORCH_DISTRIBUTED,
    HOROVOD,
    XLA,
    SINGLE,
)
replica_groups: ReplicaGroups = TORCHFT  # the engine a ReplicaGroup starts and drives


def owner(device: torch.device | str) -> Engine | None:
    """The engine tensors on ``device`` go through whatever else runs (torch_xla's for an XLA
    device), or None where the process's engine carries them."""
    device = torch.device(device)
    return next((engine for engine in ENGINES if engine.owns(device)), None)


def current(device: torch.device | str | None = None) -> Engine:
    """The engine of this process or, for tensors on ``device``, the engine they go through."""
    owning = None if device is None else owner(device)
    if owning is not None:
        return owning
    for engine in ENGINES:
        if engine.in_use():
            return engine
    return next(engine for engine in ENGINES if engine.launched())
