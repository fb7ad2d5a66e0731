"""Elastic resize: training that goes on the same when workers join or leave.

:class:`ElasticState` keeps the last consistent state of a run (model, optimizer with its trace
position, RNG states and any values of the user's) in a checkpoint directory. ``commit()``
after an update writes it atomically (temporary file, then ``os.replace``), so a worker killed
at any instant leaves either the previous commit or the new one, never half of one.
``restore()`` at start reads the last commit on rank 0, broadcasts it, and re-plans it for the
current world size.

Why resuming with another number of workers is exact: :class:`aikit.core.schedule.Schedule`
derives every step's global batch and sample order from the trace, the data set size, the
seed and the epoch alone; only the deal of micro-batches to replicas depends on the replica
count. Resuming at step ``s`` of epoch ``e`` with a different number of workers therefore trains
on the same global batches at the same LR, and the updates equal the uninterrupted ones up to
floating-point summation order. A commit is taken between updates (never mid-step), because
gradients accumulated mid-step belong to one replica's share of a deal that is about to change.

A model sharded with FSDP2 (DTensors) has no rank that holds all of it: then every rank writes
its shards through PyTorch Distributed Checkpoint (:mod:`aikit.elastic.Torch.sharded`), rank 0
writes the commit file (the marker, last, naming every shard and its SHA-256), and ``restore()``
reads each rank's part of the shards for the world that loads, of any size. A replicated commit
restored into a sharded model gives each rank its part of the whole tensors (a run that outgrew
DDP goes on with FSDP2).

A commit never replaces or deletes a commit it does not know: ``restore()`` learns the
directory's commits, ``commit()`` refuses when another run wrote there since (or when a run
that never restored would write over newer commits); ``overwrite=True`` starts over there.

Under torchrun (c10d rendezvous) every worker is restarted on a join or a leave, and
``restore()`` at the top of the script is all it takes. Under Horovod elastic the workers that
survive stay alive: pass the state to ``hvd.elastic.run``, which calls :meth:`ElasticState.sync`
after every reset; that reloads the last commit and re-deals the sampler to the new world. Which
of the two is the engine's to say (:meth:`aikit.runtime.Torch.engines.Engine.resizing`): an
engine that re-forms the world itself gives the state its side of the protocol.

Here :class:`ElasticState` keeps the order of things (what a commit holds; what a restore reads,
checks, loads and joins, in that order); each step is a module of its own:
:mod:`~aikit.elastic.Torch.commits` writes commits (replicated or sharded) and refuses to write over
commits the run does not know, :mod:`~aikit.elastic.Torch.restore_checks` checks a commit before
anything changes, :mod:`~aikit.elastic.Torch.layout` lays its tensors out for this world,
:mod:`~aikit.elastic.Torch.loading` loads them.
"""

from __future__ import annotations

import functools
import os
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from aikit.core.errors import CheckpointError, InvalidState, InvalidValue
from aikit.elastic.Torch import checkpoint
from aikit.elastic.Torch.checkpoint import CorruptCheckpointWarning
from aikit.elastic.Torch.commits import CommitStorage, check_every_worker_commits, refuse_a_file
from aikit.elastic.Torch.layout import holds_dtensors, laid_out, read_shards
from aikit.elastic.Torch.loading import load, set_rng_state
from aikit.elastic.Torch.restore_checks import FORMAT, check_commit, kind, planned_global_batch, schedule_identity
from aikit.elastic.Torch.sampler import TraceSampler
from aikit.elastic.Torch.trace_optim import TraceOptimizer
from aikit.ga.Torch.optim import Optimizer as GAOptimizer
from aikit.runtime.Torch import collectives, distributed, random_state
from aikit.runtime.Torch.lr_free import eval_weights


class ElasticState(CommitStorage):
    """The state a run resumes from after workers join or leave, kept in ``directory``.

    ``objects`` are what to keep, by name: anything with ``state_dict()``/``load_state_dict()``
    (model, optimizer, LR scheduler, GradScaler) or a plain data value (read and set it as
    ``state.<name>``: tensors, arrays, numbers, strings, and lists, tuples and dicts of them; see
    :mod:`aikit.elastic.Torch.checkpoint`). A :class:`~aikit.elastic.Torch.trace_optim.TraceOptimizer` among them
    carries the epoch, step and sampler position; its sampler is re-dealt to the workers there
    are on restore. ``fsync=False`` skips flushing each commit to disk: it still survives any
    process being killed, not a crash of the host that holds ``directory``.
    Every worker builds the state and calls ``commit()``/``restore()`` together;
    rank 0 reads and writes ``directory``, which must therefore be storage every host that can
    become rank 0 sees (a shared file system for several hosts); with a sharded model every
    rank writes and reads its shards there, so every host must see it.
    ``overwrite=True`` lets this run commit over commits it did not restore (start over there).
    Every commit records the global batch of the plan ``init()`` published last (None before one).
    """

    def __init__(self, directory: str | os.PathLike, *, fsync: bool = True, verbose: bool = True,
                 overwrite: bool = False, **objects):
        if not objects:
            raise InvalidValue("ElasticState needs something to keep, e.g. ElasticState(dir, model=model, "
                               "optimizer=opt)")
        for name, obj in objects.items():
            if isinstance(obj, TraceSampler):
                raise InvalidValue(
                    f"{name}= is a {type(obj).__name__}: its position is the trace optimizer's (the sampler can run "
                    "ahead of training in DataLoader workers), so keep the optimizer and leave the sampler out"
                )
        directory = Path(directory)
        refuse_a_file(directory)
        self.__dict__.update(directory=directory, fsync=fsync, verbose=verbose, overwrite=bool(overwrite),
                             _objects=dict(objects))
        self.__dict__.update(commits=0, restored_from=None, incarnation=None, _reset_callbacks=[], _resizing=None)
        traced = [obj for obj in objects.values() if isinstance(obj, TraceOptimizer)]
        if len(traced) > 1:
            raise InvalidValue("ElasticState keeps one trace optimizer (it owns the epoch and step); got several")
        self.__dict__["optimizer"] = traced[0] if traced else None

    # plain values read and set as attributes, as in Horovod's State
    def __getattr__(self, name: str):
        objects = self.__dict__.get("_objects", {})
        if name in objects:
            return objects[name]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __setattr__(self, name: str, value) -> None:
        if name in self._objects:
            self._objects[name] = value
        else:
            super().__setattr__(name, value)

    @property
    def path(self) -> Path | None:
        """The newest commit file in the directory (None before the first commit)."""
        return checkpoint.newest_file(self.directory)

    @property
    def epoch(self) -> int:
        """The epoch in progress (the trace optimizer's)."""
        return self._traced().epoch

    @property
    def step(self) -> int:
        """Updates done in the epoch in progress."""
        return self._traced().step_index

    def _traced(self) -> TraceOptimizer:
        if self.optimizer is None:
            raise AttributeError("epoch and step come from a trace optimizer: keep one, e.g. optimizer=opt")
        return self.optimizer

    def epochs(self, count: int) -> Iterator[int]:
        """Epochs ``0..count-1`` from where the run stands, each set on the sampler and optimizer."""
        opt = self._traced()
        first = opt.epoch + (opt.step_index >= len(opt.epoch_schedule) and opt.micro_step == 0)
        for epoch in range(first, count):
            opt.sampler.set_epoch(epoch)
            opt.set_epoch(epoch)
            yield epoch

    # ---- commit ------------------------------------------------------------------------------

    def commit(self) -> None:
        """Save the state as the one to resume from: call it after an update, on every worker.

        Only rank 0 writes (the replicas are equal after an update), so a worker that made
        several updates in one ``optimizer.step()`` (steps in which it had no micro-batch) is
        not out of step with the others. Under Horovod elastic it also checks, with the other
        workers, whether hosts were added or removed, and if so stops for a resize.
        """
        if self.optimizer is not None and self.optimizer.micro_step:
            raise InvalidState(
                f"commit() in the middle of step {self.optimizer.step_index} of epoch {self.optimizer.epoch} "
                f"({self.optimizer.micro_step} of its micro-batches accumulated): commit right after an update, "
                "when optimizer.step() returns True"
            )
        for name, obj in self._objects.items():
            if isinstance(obj, GAOptimizer) and obj.micro_step:
                raise InvalidState(
                    f"commit() in the middle of an update: {name} has {obj.micro_step} of its {obj.steps} "
                    "micro-steps accumulated; commit right after the update, when optimizer.micro_step == 0"
                )
        number = self.commits + 1  # counted once written: a failed commit changes nothing
        # Schedule-Free's contract: saved in eval mode, so the model's weights saved are the ones to
        # evaluate (x); back in train mode after, on every worker (the switch moves the weights)
        with eval_weights(self._objects.values()) as switched:
            train_mode = [name for name, obj in self._objects.items() if any(obj is s for s in switched)]
            payload = functools.partial(self._payload, number, train_mode)  # made by the ranks that write
            self._write_commit(number, payload, sharded=holds_dtensors(self._objects.values()))
        self.commits = number
        if (resizing := self._engine_resizing()) is not None:  # its host check is a collective
            check_every_worker_commits(self.optimizer)
            resizing.check_hosts()

    def _payload(self, number: int, train_mode: list[str]) -> dict:
        return {
            "format": FORMAT,
            "commit": number,
            "time": time.time(),
            "world_size": distributed.world_size(),
            "schedule": schedule_identity(self.optimizer),
            "global_batch_size": planned_global_batch(),  # of the plan init() published last
            "kinds": {name: kind(obj) for name, obj in self._objects.items()},
            "objects": {name: obj.state_dict() if hasattr(obj, "state_dict") else obj
                        for name, obj in self._objects.items()},
            "rng": random_state.get_state(),
            "train_mode": train_mode,
        }

    @property
    def restored_commit(self) -> int:
        return 0 if self.restored_from is None else self.restored_from["commit"]

    # ---- restore -----------------------------------------------------------------------------

    def restore(self) -> bool:
        """Load the last commit (if there is one) and re-plan it for the current world size.

        Every worker calls it after joining the process group; rank 0 reads the checkpoint and
        broadcasts it. Returns True when a commit was loaded, False on a fresh start. Under
        Horovod elastic ``hvd.elastic.run`` calls it after a failure, before the world is formed
        again; loading then waits for the :meth:`sync` that follows.
        """
        if self._engine_resizing() is not None:
            return False
        if (distributed.rank() == 0 and "TORCHELASTIC_RUN_ID" in os.environ
                and os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") != "1"):
            warnings.warn(
                "torchrun shares its rendezvous TCPStore with the workers, and then a node that joins a running "
                "job waits for ever (pytorch#135712): launch torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "
                "so workers can be added", stacklevel=2)
        return self.sync()

    def sync(self) -> bool:
        """Same as :meth:`restore`; the name ``hvd.elastic.run`` calls after every reset."""
        passed_over: dict[int, str] = {}  # commits whose shards failed, the same on every rank
        while True:
            found, failure = None, None
            if distributed.rank() == 0:
                try:
                    found = checkpoint.latest(self.directory, passed_over)
                except CheckpointError as error:  # every rank must hear of it, or the others wait for ever
                    failure = error
            found, message, self.incarnation = collectives.broadcast_object(
                (found, failure and str(failure), time.time_ns()), "restore()'s broadcast of the last commit")
            if failure is not None:
                raise failure
            if message is not None:
                raise CheckpointError(f"rank 0 could not restore: {message}")
            for note in found.notes:  # on every rank alike
                warnings.warn(CorruptCheckpointWarning(note), stacklevel=3)
            payload = found.payload
            self._learn_commits(found.listing, 0 if payload is None else payload["commit"])
            if payload is None:
                self._replan()
                self._join()
                return False
            check_commit(payload, self._objects, self.optimizer, self.directory,  # everything, before anything changes
                         self._expected_global_batch())
            if "sharded" in payload:
                try:
                    payload = read_shards(payload, self._objects, self.directory)
                except CheckpointError as error:  # raised alike on every rank: fall back together
                    passed_over[payload["commit"]] = str(error)
                    continue
            else:
                payload = laid_out(payload, self._objects)
            load(self._objects, payload["objects"])
            for name in payload.get("train_mode", []):  # the Schedule-Free optimizers the commit saw training
                self._objects[name].train()
            self._replan()
            rank = distributed.rank()
            set_rng_state(payload["rng"], rank)
            self.commits = payload["commit"]
            self.restored_from = {"commit": payload["commit"], "world_size": payload["world_size"],
                                  "age_s": time.time() - payload["time"]}
            if self.verbose and rank == 0:
                print(self.describe(payload["world_size"]), flush=True)
            self._join()
            return True

    def _expected_global_batch(self) -> int | None:
        """The global batch a commit must record to be restored here; None: not checked, since a
        long-lived process may hold the plan of an ``init()`` of another run. Ray's state, whose
        every worker is a fresh process, checks it against the plan its ``init()`` published."""
        return None

    def _join(self) -> None:
        """The trace optimizer's collectives due at its position (rank 0's parameters the first
        time, the steps this replica sits out), after every object is loaded and re-dealt."""
        if self.optimizer is not None:
            self.optimizer.join()

    def describe(self, saved_world_size: int) -> str:
        """One line on what was resumed and how the next step is now dealt."""
        now = distributed.world_size()
        line = f"aikit resize: resumed commit {self.commits}, saved by {saved_world_size} worker(s), now {now}"
        opt = self.optimizer
        if opt is None or opt.step_index >= len(opt.epoch_schedule):
            return line
        plan, step = opt.epoch_schedule, opt.step_index
        micro = int(plan.micro_batches_per_step[step])

        def per_worker(workers: int) -> int:
            return -(-micro // workers)

        return (f"{line}; epoch {opt.epoch} step {step}: global batch {int(plan.batch_sizes[step])} = {micro} "
                f"micro-batches of {plan.micro_size(step)}, at most {per_worker(saved_world_size)} per worker before, "
                f"{per_worker(now)} now (same samples, same LR)")

    def _replan(self) -> None:
        """Deal the trace optimizer's sampler to the current world and put it back in position.

        A step cut short by a failure is not carried over (its gradients belong to the old deal):
        :meth:`sync` reloads the last commit right after.
        """
        opt = self.optimizer
        if opt is None:
            return
        sampler, (replicas, rank) = opt.sampler, (distributed.world_size(), distributed.rank())
        if (sampler.num_replicas, sampler.rank) != (replicas, rank):
            sampler.set_world(replicas, rank)
            opt.redeal()
        opt.compare_again()  # a worker that joined compares at its first collective: so must the others

    # ---- TorchFT: what a replica group that heals fetches from a live one ----------------------

    def snapshot(self) -> dict:
        """What a commit would hold now, in memory: tensors and JSON-able values (what a TorchFT
        replica group that heals fetches from a live one). Local."""
        return self._payload(self.commits, [])

    def load_snapshot(self, payload: dict, rank: int) -> None:
        """Load a live replica's :meth:`snapshot` as :meth:`restore` loads a commit: checked whole
        first, then every object in one order, and ``rank``'s random streams. Local: no collective."""
        numbered = payload if payload.get("commit") != 0 else {**payload, "commit": 1}  # a state before any commit
        check_commit(numbered, self._objects, self.optimizer, self.directory, self._expected_global_batch())
        load(self._objects, laid_out(payload, self._objects)["objects"])
        set_rng_state(payload["rng"], rank)
        self.commits = payload["commit"]

    def take_over_commits(self) -> None:
        """Know the directory's commits as this run's own: where the replica that writes commits
        changes while the run goes on (TorchFT's quorum has a new rank 0), it goes on from those the
        one before wrote. Reads the directory, writes nothing."""
        listing = checkpoint.commit_listing(self.directory)
        self._learn_commits(listing, max(listing, default=0))

    # ---- Horovod elastic protocol (hvd.elastic.run drives these) ----------------------------

    def _engine_resizing(self):
        """The engine's side of this state where the engine re-forms the world (Horovod
        elastic), made when first asked under such an engine; None elsewhere."""
        if self._resizing is None:
            self.__dict__["_resizing"] = distributed.current().resizing()
        return self._resizing

    def register_reset_callbacks(self, callbacks) -> None:
        """Functions to call after Horovod re-forms the world (before training goes on)."""
        self._reset_callbacks.extend(callbacks)

    def on_hosts_updated(self, timestamp, update_res) -> None:
        """Horovod's driver says hosts were added or removed; acted on at the next commit."""
        self._engine_resizing().hosts_updated(timestamp, update_res)

    def on_reset(self) -> None:
        """After Horovod re-formed the world: re-deal the sampler, then the user's callbacks."""
        if (resizing := self._engine_resizing()) is not None:
            resizing.reset()
        self._replan()
        for callback in self._reset_callbacks:
            callback()

    def __repr__(self) -> str:
        return f"ElasticState({str(self.directory)!r}, {', '.join(self._objects)}; {self.commits} commits)"
