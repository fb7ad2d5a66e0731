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

Under torchrun (c10d rendezvous) every worker is restarted on a join or a leave, and
``restore()`` at the top of the script is all it takes. Under Horovod elastic the workers that
survive stay alive: pass the state to ``hvd.elastic.run``, which calls :meth:`ElasticState.sync`
after every reset; that reloads the last commit and re-deals the sampler to the new world.
"""

from __future__ import annotations

import copy
import hashlib
import os
import queue
import random
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from aikit.core.errors import CheckpointError, InvalidState, InvalidValue
from aikit.core.schedule import world_problem
from aikit.elastic.Torch import checkpoint
from aikit.elastic.Torch.sampler import CustomSampler
from aikit.elastic.Torch.trace_optim import TraceOptimizer
from aikit.ga.Torch.optim import Optimizer as GAOptimizer
from aikit.runtime.Torch import distributed, random_state
from aikit.runtime.Torch.state_checks import check_groups

FORMAT = 1


class ElasticState:
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
    become rank 0 sees (a shared file system for several hosts).
    """

    def __init__(self, directory: str | os.PathLike, *, fsync: bool = True, verbose: bool = True, **objects):
        if not objects:
            raise InvalidValue(
                "ElasticState needs something to keep, e.g. ElasticState(dir, model=model, optimizer=opt)")
        for name, obj in objects.items():
            if isinstance(obj, CustomSampler):
                raise InvalidValue(
                    f"{name}= is a CustomSampler: its position is the trace optimizer's (the sampler can run "
                    "ahead of training in DataLoader workers), so keep the optimizer and leave the sampler out"
                )
        self.__dict__.update(directory=Path(directory), fsync=fsync, verbose=verbose, _objects=dict(objects))
        self.__dict__.update(commits=0, restored_from=None, incarnation=None, _hvd_reset_callbacks=[])
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
        found = checkpoint.commit_files(self.directory)
        return found[0][1] if found else None

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
        first = opt.epoch + (opt.step_index >= len(opt.plan) and opt.micro == 0)
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
        if self.optimizer is not None and self.optimizer.micro:
            raise InvalidState(
                f"commit() in the middle of step {self.optimizer.step_index} of epoch {self.optimizer.epoch} "
                f"({self.optimizer.micro} of its micro-batches accumulated): commit right after an update, "
                "when optimizer.step() returns True"
            )
        for name, obj in self._objects.items():
            if isinstance(obj, GAOptimizer) and obj.position:
                raise InvalidState(
                    f"commit() in the middle of an update: {name} has {obj.position} of its {obj.steps} "
                    "micro-steps accumulated; commit right after the update, when optimizer.position == 0"
                )
        number = self.commits + 1  # counted once written: a failed commit changes nothing
        if distributed.rank() == 0:
            payload = {
                "format": FORMAT,
                "commit": number,
                "time": time.time(),
                "world_size": distributed.world_size(),
                "schedule": self._schedule_identity(),
                "objects": {name: _state_of(obj) for name, obj in self._objects.items()},
                "rng": random_state.get_state(),
            }
            checkpoint.write(self.directory, number, payload, fsync=self.fsync)
        self.commits = number
        if _horovod_elastic():
            self._check_every_worker_commits()
            self._horovod_state().check_host_updates()

    def _check_every_worker_commits(self) -> None:
        """Horovod's host check is a collective, so every worker must commit equally often; a
        worker with no micro-batch in a step makes that update inside another ``step()`` call
        and would commit less often than the others."""
        opt = self.optimizer
        if opt is None:
            return
        plan, workers = opt.plan, distributed.world_size()
        short = np.flatnonzero(plan.micro_batches_per_step < workers)
        if short.size:
            step = int(short[0])
            raise InvalidValue(
                f"under Horovod elastic every worker must get a micro-batch in every step, but step {step} of "
                f"epoch {plan.epoch} (global batch {int(plan.batch_sizes[step])}) has "
                f"{int(plan.micro_batches_per_step[step])} micro-batch(es) of {plan.micro_batch} for {workers} "
                f"workers: use a micro_batch that divides every batch size and is at most "
                f"{int(plan.batch_sizes.min())} / (--max-np)"
            )

    # ---- restore -----------------------------------------------------------------------------

    def restore(self) -> bool:
        """Load the last commit (if there is one) and re-plan it for the current world size.

        Every worker calls it after joining the process group; rank 0 reads the checkpoint and
        broadcasts it. Returns True when a commit was loaded, False on a fresh start. Under
        Horovod elastic ``hvd.elastic.run`` calls it after a failure, before the world is formed
        again; loading then waits for the :meth:`sync` that follows.
        """
        if _horovod_elastic():
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
        payload, failure = None, None
        if distributed.rank() == 0:
            try:
                payload = checkpoint.read_latest(self.directory)
            except CheckpointError as error:  # every rank must hear of it, or the others wait for ever
                failure = error
        payload, message, self.incarnation = _broadcast_object((payload, failure and str(failure), time.time_ns()))
        if failure is not None:
            raise failure
        if message is not None:
            raise CheckpointError(f"rank 0 could not restore: {message}")
        if payload is None:
            self._replan()
            self._join()
            return False
        self._check(payload)  # everything, before anything changes
        self._load(payload["objects"])
        self._replan()
        rank = distributed.rank()
        _set_rng_state(payload["rng"], rank)
        self.commits = payload["commit"]
        self.restored_from = {"commit": payload["commit"], "world_size": payload["world_size"],
                              "age_s": time.time() - payload["time"]}
        if self.verbose and rank == 0:
            print(self.describe(payload["world_size"]), flush=True)
        self._join()
        return True

    def _check(self, payload: dict) -> None:
        """Every reason ``payload`` cannot be restored into the kept objects (a failed restore
        must leave every object as it was)."""
        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
            raise InvalidValue(f"{self.path} is not an aikit ElasticState checkpoint (format {found!r})")
        self._check_schedule(payload["schedule"])
        saved = payload["objects"]
        missing = sorted(set(self._objects) - set(saved))
        if missing:
            raise InvalidValue(
                f"the checkpoint {self.path} holds {sorted(saved)} but not {missing}: keep the same "
                "objects as the run that wrote it, or start from an empty directory"
            )
        for name, obj in self._objects.items():
            try:
                if hasattr(obj, "check_state"):  # aikit's optimizers check their own
                    obj.check_state(saved[name])
                elif isinstance(obj, torch.nn.Module):
                    _check_module(obj, saved[name])
                elif isinstance(obj, torch.optim.Optimizer):
                    check_groups(obj, saved[name])
            except ValueError as error:
                raise InvalidValue(f"the checkpoint {self.path} cannot be restored into {name}=: {error}") from error
        self._check_world(saved)

    def _check_world(self, saved: dict) -> None:
        """A balanced sampler (every replica the same whole micro-batches of every step) whose
        steps still to train do not fit this world is refused with the world sizes that do
        (Megatron #3913); the steps trained before need not fit."""
        opt = self.optimizer
        if opt is None or not getattr(opt.sampler, "balanced", False):
            return
        name = next(name for name, obj in self._objects.items() if obj is opt)
        position, schedule = saved[name]["trace"], opt.sampler.schedule
        first = schedule.epoch_bounds(position["epoch"])[0] + position["step"]
        problem = world_problem(schedule.trace, first, schedule.micro_batch, distributed.world_size())
        if problem:
            raise InvalidValue(f"the checkpoint {self.path} cannot resume on {distributed.world_size()} replica(s): "
                               f"{problem}; resume on one of those, or with another trace")

    def _load(self, saved: dict) -> None:
        """Load every kept object, in one order whatever the keyword order: the objects aikit
        cannot check beforehand (schedulers, scalers; put back as they were if one fails), then
        models, then optimizers, then plain values. No load makes a collective."""
        order = {name: (2 if isinstance(obj, torch.optim.Optimizer) else 1 if isinstance(obj, torch.nn.Module)
                        else 0 if hasattr(obj, "load_state_dict") else 3, name)
                 for name, obj in self._objects.items()}
        names = sorted(self._objects, key=order.get)
        unchecked = [name for name in names if order[name][0] == 0]
        before = {name: copy.deepcopy(self._objects[name].state_dict()) for name in unchecked}
        try:
            for name in unchecked:
                self._objects[name].load_state_dict(saved[name])
        except Exception:
            for name, state in before.items():
                self._objects[name].load_state_dict(state)
            raise
        for name in names:
            obj = self._objects[name]
            inner = obj.optimizer if isinstance(obj, TraceOptimizer) else obj  # its zero_grad() waits for updates
            if isinstance(inner, (torch.nn.Module, torch.optim.Optimizer)):
                inner.zero_grad(set_to_none=True)  # a step cut short leaves gradients behind
        for name in names[len(unchecked):]:
            if hasattr(self._objects[name], "load_state_dict"):
                self._objects[name].load_state_dict(saved[name])
            else:
                self._objects[name] = saved[name]

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
        if opt is None or opt.step_index >= len(opt.plan):
            return line
        plan, step = opt.plan, opt.step_index
        micro = int(plan.micro_batches_per_step[step])

        def per_worker(workers: int) -> int:
            return -(-micro // workers)

        return (f"{line}; epoch {opt.epoch} step {step}: global batch {int(plan.batch_sizes[step])} = {micro} "
                f"micro-batches of {plan.micro_batch}, at most {per_worker(saved_world_size)} per worker before, "
                f"{per_worker(now)} now (same samples, same LR)")

    def _replan(self) -> None:
        """Deal the trace optimizer's sampler to the current world and put it back in position.

        A step cut short by a failure is not carried over (its gradients belong to the old deal):
        :meth:`sync` reloads the last commit right after.
        """
        opt = self.optimizer
        if opt is None:
            return
        sampler, (replicas, rank) = opt.sampler, _world()
        if (sampler.num_replicas, sampler.rank) != (replicas, rank):
            sampler.set_world(replicas, rank)
            opt.redeal()

    def _schedule_identity(self) -> dict | None:
        """What fixes every step's samples: a resumed run must have the same."""
        if self.optimizer is None:
            return None
        s = self.optimizer.sampler.schedule
        if hasattr(s, "identity"):  # an adaptive run: its settings fix the batches it decides
            return s.identity()
        return {"trace": hashlib.sha256(s.trace.sizes.tobytes()).hexdigest(), "trace_source": s.trace.source,
                "when_exhausted": s.trace.when_exhausted, "dataset_size": s.dataset_size, "seed": s.seed,
                "shuffle": s.shuffle, "permutation": self.optimizer.sampler.permutation}

    def _check_schedule(self, saved: dict | None) -> None:
        now = self._schedule_identity()
        if saved is None or now is None:
            return
        saved = {"permutation": "numpy", **saved}  # commits from before the permutation option
        differ = [f"{key} {saved.get(key)!r} then, {now[key]!r} now" for key in now
                  if key != "trace_source" and saved.get(key) != now[key]]
        if differ:
            what = "; ".join(d if not d.startswith("trace ") else
                             f"trace {saved['trace_source']} then, {now['trace_source']} now (different sizes)"
                             for d in differ)
            raise InvalidValue(
                f"the checkpoint {self.path} was written by a run with other samples per step ({what}): resume "
                "with the same trace, data set, seed, shuffle and permutation, or start from an empty directory"
            )

    # ---- Horovod elastic protocol (hvd.elastic.run drives these) ----------------------------

    def _horovod_state(self):
        """Horovod's own State, for its host-update bookkeeping (the driver notifies it)."""
        if "_hvd_state" not in self.__dict__:
            from horovod.common.elastic import State

            hvd = distributed.horovod()
            self.__dict__["_hvd_state"] = State(bcast_object=hvd.broadcast_object, get_rank=hvd.rank)
        return self.__dict__["_hvd_state"]

    def register_reset_callbacks(self, callbacks) -> None:
        """Functions to call after Horovod re-forms the world (before training goes on)."""
        self._hvd_reset_callbacks.extend(callbacks)

    def on_hosts_updated(self, timestamp, update_res) -> None:
        """Horovod's driver says hosts were added or removed; acted on at the next commit."""
        self._horovod_state().on_hosts_updated(timestamp, update_res)

    def on_reset(self) -> None:
        """After Horovod re-formed the world: re-deal the sampler, then the user's callbacks."""
        self._horovod_state()._host_messages = queue.Queue()
        self._replan()
        for callback in self._hvd_reset_callbacks:
            callback()

    def __repr__(self) -> str:
        return f"ElasticState({str(self.directory)!r}, {', '.join(self._objects)}; {self.commits} commits)"


# ---- helpers -------------------------------------------------------------------------------


def _world() -> tuple[int, int]:
    return distributed.world_size(), distributed.rank()


def _check_module(module: torch.nn.Module, saved: dict) -> None:
    """Refuse a state dict whose keys or shapes do not fit ``module``."""
    if not isinstance(saved, dict):
        raise InvalidValue(f"a module's state dict must be a dict, got {type(saved).__name__}")
    have = module.state_dict()
    missing, unexpected = sorted(set(have) - set(saved)), sorted(set(saved) - set(have))
    if missing or unexpected:
        raise InvalidValue(f"the saved model lacks {missing} and has {unexpected} besides: build the same model")
    for key, value in have.items():
        got = getattr(saved[key], "shape", None)
        if got is not None and tuple(got) != tuple(value.shape):
            raise InvalidValue(f"{key} has shape {tuple(got)} in the checkpoint, {tuple(value.shape)} here")


def _state_of(obj):
    return obj.state_dict() if hasattr(obj, "state_dict") else obj


def _set_rng_state(state: dict, rank: int) -> None:
    """Rank 0 continues the saved random streams; every other rank gets its own streams,
    seeded from them and its rank (workers must not draw the same dropout masks)."""
    random_state.set_state(state)
    if rank:
        digest = hashlib.sha256(state["torch"].numpy().tobytes() + rank.to_bytes(8, "little")).digest()
        seed = int.from_bytes(digest[:8], "little") >> 1
        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)
        random.seed(seed)


def _horovod_elastic() -> bool:
    """True in a worker that ``horovodrun --min-np/--max-np`` started (Horovod elastic mode)."""
    return distributed.engine() == "horovod" and os.environ.get("HOROVOD_ELASTIC") == "1"


def _broadcast_object(obj):
    """Rank 0's ``obj`` on every worker."""
    if distributed.world_size() == 1:
        return obj
    if distributed.engine() == "horovod":
        return distributed.horovod().broadcast_object(obj, root_rank=0)
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


