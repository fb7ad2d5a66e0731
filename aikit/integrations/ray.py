"""Ray Train: aikit's elastic state in the workers of a ``TorchTrainer``.

Ray Train v2 keeps no worker across a failure or a resize. With
``ScalingConfig(num_workers=(min, max))`` it stops the whole worker group and starts a new one with
the workers it can get, each running ``train_loop_per_worker`` from the top. Ray sets up
torch.distributed (gloo, or NCCL on GPUs) before the loop runs, so aikit reads Ray's world through
its torch.distributed engine (Ray needs no engine of its own): ``aikit.elastic.Torch.init(G, M)``
plans for the workers there are, and ``restore()`` at the top of the loop re-plans the last commit
for them, exactly as under torchrun.

:class:`ElasticState` is :class:`aikit.elastic.Torch.ElasticState` with what Ray adds:

* its directory defaults to the run's storage, ``<RunConfig.storage_path>/<RunConfig.name>/aikit``,
  which Ray already asks to be shared by every node. The commits there are aikit's own (atomic,
  checksummed, never unpickled, FSDP2 shards through DCP) and cost a file write on rank 0, so a
  run can commit after every update. Ray's ``ray.train.report`` is a barrier that waits for the
  controller to take the previous report (``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``, 2 s by default),
  too slow to be called after every update;
* ``restore()`` first checks, with every worker, that each one sees what rank 0 writes in the
  directory (after a resize rank 0 may be on another node) and that all were given the same
  ``init()`` plan, before anything is read or loaded; and it refuses a commit made under another
  global batch than this worker's ``init()`` plans (every Ray worker is a fresh process, so the
  plan it holds is this run's);
* :class:`StopOnAikitError` (``RunConfig(callbacks=[...])``) ends the run at a worker's aikit error
  that a restart would meet again (a trace that is not there, workers given different plans), which
  Ray Train would otherwise retry ``max_failures`` times;
* ``report(metrics)`` hands the last commit to Ray as a checkpoint, as often as the user likes
  (every epoch, say): hard links inside the run's directory, nothing uploaded. ``Result.checkpoint``,
  ``CheckpointConfig`` and ``ray.train.get_checkpoint()`` then see it, and a new run restores from
  it with ``restore(start_from=...)`` (the way Ray Train v2 starts a run from another's checkpoint).
"""

from __future__ import annotations

from aikit.optional import ray  # isort: skip  (first: a missing Ray names its extra)
import os
import shutil
import time
from pathlib import Path

import ray.train
import torch
from ray.train import CheckpointUploadMode

import aikit.elastic.Torch
from aikit.core.agreement import check_agreement, own_row, rows_of
from aikit.core.errors import CommitError, InvalidState, InvalidType, InvalidValue, repeats_on_restart
from aikit.elastic.Torch import checkpoint
from aikit.elastic.Torch.restore_checks import planned_global_batch
from aikit.runtime.process import TORCH, plan_of
from aikit.runtime.Torch import collectives, distributed

__all__ = ["ElasticState", "StopOnAikitError", "run_storage"]

SUBDIRECTORY = "aikit"  # the commits, in the run's directory
REPORTED = "aikit_checkpoints"  # the commits reported to Ray (links), in the run's directory
SEEN_WAIT_S = 5.0  # how long a worker looks for rank 0's marker (a shared file system's caches)


def train_storage(refusal: str):
    """Ray Train's storage context of this run, or an :class:`InvalidState` of ``refusal`` (what
    needs a Ray Train worker, and the fix) where this is none of ``trainer.fit()``'s workers."""
    try:
        return ray.train.get_context().get_storage()
    except RuntimeError as error:
        raise InvalidState(refusal) from error


def run_storage() -> Path:
    """The run's directory, ``<RunConfig.storage_path>/<RunConfig.name>``, as a path of this file
    system: what ``ray.train.get_context().get_storage()`` says, inside ``train_loop_per_worker``."""
    storage = train_storage("aikit.integrations.ray.ElasticState() without a directory reads the run's storage "
                            "from Ray Train: build it inside train_loop_per_worker, or give it a directory")
    kind = storage.storage_filesystem.type_name
    if kind != "local":
        raise InvalidValue(
            f"RunConfig(storage_path=...) is on a {kind!r} file system, but ElasticState commits by renaming a file "
            "(atomic, never half written): give storage_path as a directory of a shared file system (NFS, a "
            "FUSE-mounted bucket that supports rename), or ElasticState(directory=...) on one")
    return Path(storage.experiment_fs_path)


class ElasticState(aikit.elastic.Torch.ElasticState):
    """:class:`aikit.elastic.Torch.ElasticState` in a Ray Train worker: ``directory`` defaults to
    the run's storage (:func:`run_storage` / ``aikit``); ``restore()`` checks the workers first;
    ``report(metrics)`` gives the last commit to Ray. Everything else is the same: build it, call
    ``restore()`` at the top of ``train_loop_per_worker`` and ``commit()`` after updates."""

    def __init__(self, directory: str | os.PathLike | None = None, **kwargs):
        super().__init__(run_storage() / SUBDIRECTORY if directory is None else directory, **kwargs)

    def restore(self, start_from: str | os.PathLike | ray.train.Checkpoint | None = None) -> bool:
        """Check the workers (every one sees the directory, every one was given the same plan),
        then :meth:`aikit.elastic.Torch.ElasticState.restore`. ``start_from``: where a new run
        starts when its directory holds no commit yet, a commit another run gave Ray (its
        ``Result.checkpoint``, or that folder): Ray Train v2 dropped ``resume_from_checkpoint=``
        and passes such a checkpoint through ``train_loop_config`` instead."""
        folder = getattr(start_from, "path", start_from)
        if folder is not None and not isinstance(folder, (str, os.PathLike)):
            raise InvalidType(f"restore(start_from=...) takes a folder (a str or a path) or a ray.train.Checkpoint, "
                              f"got {type(start_from).__name__} {start_from!r:.60}: the Result.checkpoint another run "
                              "gave Ray, passed in train_loop_config, e.g. restore(start_from=config['checkpoint'])")
        fresh = self._check_workers()
        if not fresh or folder is None:
            return super().restore()
        folder = Path(folder)
        if not checkpoint.commit_files(folder):
            raise InvalidValue(f"restore(start_from={str(folder)!r}) holds no aikit commit: give the folder (or the "
                               "Checkpoint) ElasticState.report() gave Ray, e.g. Result.checkpoint")
        directory = self.directory
        self.__dict__["directory"] = folder  # read there; committed in this state's directory
        try:
            return super().restore()
        finally:
            self.__dict__["directory"] = directory
            self._learn_commits({}, self.commits)

    def _expected_global_batch(self) -> int | None:
        """The plan this worker's ``init()`` published: each Ray worker is a fresh process, so
        a plan here is this run's, and a commit made under another global batch is refused."""
        return planned_global_batch()

    def report(self, metrics: dict | None = None) -> None:
        """``ray.train.report(metrics, checkpoint=...)`` with the last commit, on every worker
        (Ray's report waits for all of them): rank 0 links the commit's files into
        ``<run>/aikit_checkpoints/commit_<n>`` and reports that folder, which Ray keeps or prunes
        as ``CheckpointConfig`` says. ``metrics`` gets ``aikit_commit``, the commit's number."""
        storage = train_storage("ElasticState.report() hands the last commit to Ray Train (ray.train.report), "
                                "which takes it only in a worker of trainer.fit(): call it inside "
                                "train_loop_per_worker; outside Ray the commits are in ElasticState's directory")
        reported = None
        if self.commits and distributed.rank() == 0:
            folder = Path(storage.experiment_fs_path) / REPORTED / f"commit_{self.commits:09d}"
            link_commit(self.directory, self.commits, folder)
            reported = ray.train.Checkpoint(str(folder), filesystem=storage.storage_filesystem)
        ray.train.report({**(metrics or {}), "aikit_commit": self.commits}, checkpoint=reported,
                         checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)

    def _check_workers(self) -> bool:
        """Every worker sees a file rank 0 writes in the directory, and every worker was given the
        same plan; refused alike on every worker before anything is read. Returns whether the
        directory holds no commit (a fresh start), as rank 0 sees it."""
        rank, world = distributed.rank(), distributed.world_size()
        fresh = rank == 0 and not checkpoint.commit_files(self.directory)
        if world == 1:
            return fresh
        marker, failure = None, None
        if rank == 0:
            try:
                marker = seen_marker(self.directory)
            except OSError as error:
                failure = f"{type(error).__name__}: {error}"
        name, failure, fresh = collectives.broadcast_object(
            (marker and Path(marker).name, failure, fresh), "restore()'s check of the storage")
        seen = rank == 0 or (name is not None and appears(self.directory / name, SEEN_WAIT_S))
        settings = plan_settings()
        table = torch.tensor([*own_row(settings, rank, world), *(float(seen and r == rank) for r in range(world))],
                             dtype=torch.float64)
        collectives.all_reduce_sum_([table])
        if marker is not None:
            Path(marker).unlink(missing_ok=True)
        values = table.tolist()
        if failure is not None:
            raise CommitError(f"ElasticState's directory {self.directory} cannot be written by rank 0: {failure}")
        blind = [r for r, flag in enumerate(values[len(values) - world:]) if not flag]
        if blind:
            raise InvalidValue(
                f"ElasticState's directory {self.directory} is not storage every worker sees: rank(s) "
                f"{', '.join(map(str, blind))} cannot see the file rank 0 wrote there. After a resize rank 0 may be "
                "on another node, which would not find the commits: give RunConfig(storage_path=...) (or "
                "ElasticState's directory) on a file system every node mounts (NFS, ...)")
        check_agreement(list(settings), rows_of(values[:len(values) - world], world))
        return fresh


class StopOnAikitError(ray.train.UserCallback):
    """``RunConfig(callbacks=[StopOnAikitError()])``: a worker's aikit error that a restart would
    meet again (bad input or state, a run that cannot go on:
    :func:`aikit.core.errors.repeats_on_restart`) ends ``fit()`` at once, with the workers' errors,
    instead of Ray Train restarting the worker group ``FailureConfig(max_failures)`` times into
    the same refusal. A lost worker, a collective cut off, a commit not written or memory still
    restart, as Ray's elastic runs should. Runs on Ray Train's controller (Ray's ``UserCallback``):
    it raises a ``ray.train.ControllerError``, which Ray's failure policy does not retry."""

    def after_exception(self, run_context, worker_exceptions: dict[int, Exception]) -> None:
        errors = {rank: getattr(error, "_base_exc", error) for rank, error in worker_exceptions.items()}  # Ray's wrap
        final = {rank: error for rank, error in errors.items() if repeats_on_restart(error)}
        if not final:
            return
        said = "\n".join(f"[rank {rank}] {type(error).__name__}: {error}" for rank, error in sorted(final.items()))
        raise ray.train.ControllerError(ray.train.WorkerGroupError(
            f"aikit: a restart would meet this again, so the run stops here rather than Ray retrying it "
            f"(aikit.integrations.ray.StopOnAikitError):\n{said}", worker_exceptions))


def plan_settings() -> dict[str, object]:
    """The plan the last ``init()`` of this worker published (zeros before one): what the
    workers of one run must share."""
    plan = plan_of(TORCH)
    if plan is None:
        return {"global_batch_size": 0, "max_device_batch": 0, "gpus": 0, "steps": 0, "policy": "none"}
    return {"global_batch_size": plan.global_batch_size, "max_device_batch": plan.max_device_batch,
            "gpus": plan.num_replicas, "steps": plan.micro_steps, "policy": plan.policy}


def seen_marker(directory: Path) -> str:
    """An empty file of a name no one else writes, in ``directory`` (made if need be)."""
    directory.mkdir(parents=True, exist_ok=True)
    marker = directory / f".aikit_seen.{os.getpid()}.{time.time_ns():x}"
    marker.touch()
    return str(marker)


def appears(path: Path, within: float) -> bool:
    """Whether ``path`` exists, or comes to within ``within`` seconds (NFS caches a directory's
    listing for a few seconds)."""
    deadline = time.monotonic() + within
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def link_commit(directory: Path, number: int, folder: Path) -> None:
    """Commit ``number`` of ``directory`` (its file, and its shards when sharded) in ``folder``,
    as hard links (a copy where the file system has none): a folder ``ElasticState`` restores."""
    if folder.exists():
        return
    source = checkpoint.commit_path(directory, number)
    shards = checkpoint.shard_directory(directory, number)
    partial = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        _link(source, partial / source.name)
        if shards.is_dir():
            shutil.copytree(shards, partial / shards.name, copy_function=_link)
        os.replace(partial, folder)
    except OSError as error:
        shutil.rmtree(partial, ignore_errors=True)
        raise CommitError(f"commit {number} could not be given to Ray in {folder}: {error}") from error


def _link(source: str | os.PathLike, target: str | os.PathLike) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system, or one without hard links
        shutil.copy2(source, target)
