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

from aikit.core.errors import AikitError, CheckpointError, CommitError, InvalidState, InvalidValue
from aikit.core.schedule import world_problem
from aikit.core.validate import checked_float, positive_int
from aikit.elastic.Torch import checkpoint, encoding, sharded
from aikit.elastic.Torch.checkpoint import CorruptCheckpointWarning
from aikit.elastic.Torch.encoding import ShardedRef
from aikit.elastic.Torch.sampler import CustomSampler
from aikit.elastic.Torch.trace_optim import TraceOptimizer
from aikit.ga.Torch.optim import Optimizer as GAOptimizer
from aikit.runtime.Torch import collectives, distributed, random_state
from aikit.runtime.Torch.lr_free import SCHEDULE_FREE, eval_weights, lr_free_kind
from aikit.runtime.Torch.state_checks import check_groups
from aikit.runtime.Torch.wrapping import WrappingOptimizer

FORMAT = 2  # 2: the kinds of the kept objects, sharded commits; 1 (aikit 0.2) still restores


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
    become rank 0 sees (a shared file system for several hosts); with a sharded model every
    rank writes and reads its shards there, so every host must see it.
    ``overwrite=True`` lets this run commit over commits it did not restore (start over there).
    """

    def __init__(self, directory: str | os.PathLike, *, fsync: bool = True, verbose: bool = True,
                 overwrite: bool = False, **objects):
        if not objects:
            raise InvalidValue("ElasticState needs something to keep, e.g. ElasticState(dir, model=model, "
                               "optimizer=opt)")
        for name, obj in objects.items():
            if isinstance(obj, CustomSampler):
                raise InvalidValue(
                    f"{name}= is a CustomSampler: its position is the trace optimizer's (the sampler can run "
                    "ahead of training in DataLoader workers), so keep the optimizer and leave the sampler out"
                )
        directory = Path(directory)
        _refuse_a_file(directory)
        self.__dict__.update(directory=directory, fsync=fsync, verbose=verbose, overwrite=bool(overwrite),
                             _objects=dict(objects))
        self.__dict__.update(commits=0, restored_from=None, incarnation=None, _hvd_reset_callbacks=[])
        # the directory's commits this state knows (rank 0: what restore() saw and what it wrote since)
        self.__dict__.update(_known=None, _since=0)
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
        # Schedule-Free's contract: saved in eval mode, so the model's weights saved are the ones to
        # evaluate (x); back in train mode after, on every worker (the switch moves the weights)
        with eval_weights(self._objects.values()) as switched:
            train_mode = [name for name, obj in self._objects.items() if any(obj is s for s in switched)]
            if self._sharded():
                self._commit_shards(number, train_mode)
            elif distributed.rank() == 0:
                encoded = encoding.encode(self._payload(number, train_mode))
                self._refuse_unknown_commits(number)
                self._wrote(number, checkpoint.write_encoded(self.directory, number, encoded, fsync=self.fsync))
        self.commits = number
        if _horovod_elastic():
            self._check_every_worker_commits()
            self._horovod_state().check_host_updates()

    def _payload(self, number: int, train_mode: list[str]) -> dict:
        return {
            "format": FORMAT,
            "commit": number,
            "time": time.time(),
            "world_size": distributed.world_size(),
            "schedule": self._schedule_identity(),
            "kinds": {name: _kind(obj) for name, obj in self._objects.items()},
            "objects": {name: _state_of(obj) for name, obj in self._objects.items()},
            "rng": random_state.get_state(),
            "train_mode": train_mode,
        }

    def _sharded(self) -> bool:
        """Whether a kept model or optimizer holds DTensors (a model sharded with FSDP2): then
        every rank writes its shards. The same answer on every rank (one model)."""
        dtensor = sharded.dtensor_type()
        return bool(dtensor) and any(isinstance(t, dtensor) for obj in self._objects.values() for t in _tensors_of(obj))

    def _commit_shards(self, number: int, train_mode: list[str]) -> None:
        """Every rank writes its shards; rank 0, once every rank's are written, the commit file
        that names them all (the marker: a commit killed before it is no commit). A refusal or
        a failure on any rank fails the commit on every rank, before the marker."""
        shards, failure, encoded = {}, None, None
        try:
            encoded = encoding.encode(self._payload(number, train_mode), sharded=shards)
        except AikitError as error:  # every rank must hear of it: DCP's first gather carries it
            failure = error
        folder = checkpoint.shard_directory(self.directory, number)

        def write_marker(index: dict) -> None:
            marker = encoding.with_entry(encoded, "sharded", index)
            path = checkpoint.write_encoded(self.directory, number, marker, fsync=self.fsync,
                                            shards=(folder.name, set(index["files"])))
            self._wrote(number, path)

        sharded.save(shards, folder, f"{time.time_ns():x}", fsync=self.fsync, failure=failure,
                     before_write=lambda: self._refuse_unknown_commits(number), on_finish=write_marker)

    def _refuse_unknown_commits(self, number: int) -> None:
        """Refuse to write commit ``number`` over commits this state does not know (rank 0):
        a second run that forgot ``restore()``, or another live ElasticState on the directory."""
        if self.overwrite:
            return
        unknown = checkpoint.unknown_commits(self.directory, number, self._known, self._since)
        if not unknown:
            return
        listed = ", ".join(map(str, unknown))
        if self._known is None:
            raise CommitError(
                f"commit {number} would replace or delete commit(s) {listed} in {self.directory}, which this "
                "ElasticState did not restore: call state.restore() before training to go on from them, pass "
                "ElasticState(..., overwrite=True) to start over there, or give it another directory")
        raise CommitError(
            f"commit(s) {listed} in {self.directory} were written by another ElasticState after this one "
            f"{'restored' if self._since == self.restored_commit else 'committed'} commit {self._since}: two runs "
            "cannot share a directory. Stop one of them; to go on from the other's commits, restore() again")

    @property
    def restored_commit(self) -> int:
        return 0 if self.restored_from is None else self.restored_from["commit"]

    def _wrote(self, number: int, path: Path) -> None:
        """Rank 0 wrote commit ``number``: it is known, and the next commit goes on from it."""
        known = {n: identity for n, identity in (self._known or {}).items() if n >= number - 1}
        known.update({n: identity for n, identity in checkpoint.commit_listing(self.directory).items()
                      if n == number})
        self.__dict__.update(_known=known, _since=number)

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
            self.__dict__.update(_known=found.listing, _since=0 if payload is None else payload["commit"])
            if payload is None:
                self._replan()
                self._join()
                return False
            self._check(payload)  # everything, before anything changes
            if "sharded" in payload:
                try:
                    payload = self._read_shards(payload)
                except CheckpointError as error:  # raised alike on every rank: fall back together
                    passed_over[payload["commit"]] = str(error)
                    continue
            else:
                payload = self._laid_out(payload)
            self._load(payload["objects"])
            for name in payload.get("train_mode", []):  # the Schedule-Free optimizers the commit saw training
                self._objects[name].train()
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
        must leave every object as it was): the commit's own fields, its schedule, the objects
        it keeps (the same names and kinds), every object's state, the shards' shapes."""
        if not isinstance(payload, dict) or payload.get("format") not in (1, FORMAT):
            found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
            raise InvalidValue(f"{self.path} is not an aikit ElasticState checkpoint (format {found!r})")
        try:
            positive_int(payload.get("commit"), "its commit number")
            positive_int(payload.get("world_size"), "its world_size")
            checked_float(payload.get("time"), "its time", "a finite number")
            random_state.check_state(payload.get("rng"))
            if not isinstance(payload.get("objects"), dict):
                raise InvalidValue("its objects are not a dict")
            training = payload.get("train_mode", [])
            if not isinstance(training, list) or any(
                    not isinstance(name, str) or lr_free_kind(self._objects.get(name)) != SCHEDULE_FREE
                    for name in training):
                raise InvalidValue(f"its train_mode {training!r} names what is not a kept Schedule-Free optimizer")
        except AikitError as error:
            raise InvalidValue(f"the checkpoint {self.path} was not written by aikit as it is: {error}; "
                               "restore an intact commit (was it edited?)") from error
        self._check_schedule(payload["schedule"])
        saved = payload["objects"]
        self._check_names(saved, payload.get("kinds"))
        # models first: a model that does not fit is the cause of an optimizer state that does not
        for name, obj in sorted(self._objects.items(), key=lambda item: not isinstance(item[1], torch.nn.Module)):
            try:
                if hasattr(obj, "check_state"):  # aikit's optimizers check their own
                    obj.check_state(saved[name])
                elif isinstance(obj, torch.nn.Module):
                    _check_module(obj, saved[name])
                elif isinstance(obj, torch.optim.Optimizer):
                    check_groups(obj, saved[name])
                for path, ref in encoding.sharded_refs(saved[name]):
                    _shard_template(obj, path, ref)
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

    def _check_names(self, saved: dict, kinds: dict | None) -> None:
        """The same objects under the same names, each of the same kind. An object kept then and
        not now is refused (its state would be lost: a scheduler's LR), a plain value warned about."""
        missing = sorted(set(self._objects) - set(saved))
        if missing:
            raise InvalidValue(
                f"the checkpoint {self.path} holds {sorted(saved)} but not {missing}: keep the same "
                "objects as the run that wrote it, or start from an empty directory"
            )
        kinds = kinds if isinstance(kinds, dict) else {}  # format 1 recorded none
        extra = sorted(set(saved) - set(self._objects))
        stateful = [name for name in extra if kinds.get(name) is not None]
        if stateful:
            raise InvalidValue(
                f"the checkpoint {self.path} keeps {', '.join(f'{n}= (a {kinds[n]})' for n in stateful)} as well, "
                "which this ElasticState does not: its state would be lost. Keep it "
                f"(ElasticState(..., {stateful[0]}=...)), or start over in another directory")
        if extra:
            warnings.warn(f"aikit: the checkpoint {self.path} keeps the value(s) {extra} as well, which this "
                          "ElasticState does not keep: they are not restored", stacklevel=4)
        for name, obj in self._objects.items():
            then, now = kinds.get(name), _kind(obj)
            if name in kinds and then != now:
                raise InvalidValue(
                    f"the checkpoint {self.path} keeps a {then or 'plain value'} as {name}=, this ElasticState a "
                    f"{now or 'plain value'}: its state does not fit; keep the same kind of object under each name")

    def _read_shards(self, payload: dict) -> dict:
        """This rank's part of every sharded tensor of ``payload`` (checked), read into new
        tensors laid out as the kept objects' are now (any world size, sharded or not): the
        payload with them in place. Nothing kept changes here; a corrupt shard on any rank is a
        :class:`CheckpointError` on every rank."""
        index = payload["sharded"]
        destinations = {}
        for name, obj in self._objects.items():
            for path, ref in encoding.sharded_refs(payload["objects"][name]):
                destinations[ref.key] = torch.empty_like(_shard_template(obj, path, ref), dtype=ref.dtype)
        if not isinstance(index, dict) or set(destinations) - set(index.get("tensors", {})):
            raise CheckpointError(f"the checkpoint {self.path} names shards its index does not list")
        folder = self.directory / checkpoint.folder_name(index.get("directory"))
        sharded.load(destinations, folder, index)
        return {**payload, "objects": encoding.resolve_refs(payload["objects"], destinations)}

    def _laid_out(self, payload: dict) -> dict:
        """A replicated commit's whole tensors laid out as the kept objects' DTensors are now (a
        run that outgrew DDP goes on sharded with FSDP2): each rank takes its part of the tensor
        rank 0 sent it, with no collective. The payload as it was when nothing kept is sharded."""
        dtensor = sharded.dtensor_type()
        if not dtensor or not self._sharded():
            return payload
        from torch.distributed.tensor import distribute_tensor  # loaded already: the model holds DTensors

        def laid_out(obj, value, path: tuple):
            if isinstance(value, torch.Tensor) and not isinstance(value, dtensor):
                template = _template_at(obj, path)
                if isinstance(template, dtensor) and tuple(template.shape) == tuple(value.shape):
                    return distribute_tensor(value, template.device_mesh, template.placements, src_data_rank=None)
                return value
            if isinstance(value, dict):
                out = type(value)((key, laid_out(obj, item, (*path, key))) for key, item in value.items())
                if hasattr(value, "_metadata"):
                    out._metadata = value._metadata
                return out
            if type(value) in (list, tuple):
                return type(value)(laid_out(obj, item, (*path, index)) for index, item in enumerate(value))
            return value

        objects = {name: laid_out(self._objects[name], state, ()) if name in self._objects else state
                   for name, state in payload["objects"].items()}
        return {**payload, "objects": objects}

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
        opt.compare_again()  # a worker that joined compares at its first collective: so must the others

    def _schedule_identity(self) -> dict | None:
        """What fixes every step's samples: a resumed run must have the same."""
        return None if self.optimizer is None else self.optimizer.sampler.identity()

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


def _refuse_a_file(directory: Path) -> None:
    """A checkpoint directory that is a file (or lies under one) is refused when the state is
    built: read-only, no file is made."""
    for path in (directory, *directory.parents):
        if path.exists():
            if not path.is_dir():
                where = "is a file" if path == directory else f"lies under {path}, a file"
                raise InvalidValue(f"ElasticState's directory {directory} {where}, not a directory: give a "
                                   "directory (it is created at the first commit)")
            return


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


def _kind(obj) -> str | None:
    """What a kept object is, for the restore check: its class (a wrapper's with the optimizer
    it wraps); ``"module"`` for any model (checked by keys and shapes: its class may be renamed);
    None for a plain value."""
    if isinstance(obj, torch.nn.Module):
        return "module"
    if not hasattr(obj, "state_dict"):
        return None
    kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
    if not isinstance(obj, WrappingOptimizer):
        return kind
    return f"{kind}({type(obj.optimizer).__module__}.{type(obj.optimizer).__qualname__})"


def _tensors_of(obj) -> Iterator[torch.Tensor]:
    """A kept model's parameters and buffers, or a kept optimizer's parameters."""
    if isinstance(obj, torch.nn.Module):
        yield from obj.parameters()
        yield from obj.buffers()
    elif isinstance(obj, torch.optim.Optimizer):
        yield from (p for group in obj.param_groups for p in group["params"])


def _template_at(obj, path: tuple) -> torch.Tensor | None:
    """The tensor of ``obj`` whose layout an entry at ``path`` of its saved state takes (sharded
    or whole): a model's entry of the same name, an optimizer state's parameter; None if none."""
    if isinstance(obj, torch.nn.Module) and len(path) == 1:
        return obj.state_dict().get(path[0])
    if isinstance(obj, torch.optim.Optimizer):
        inner = obj.optimizer if isinstance(obj, WrappingOptimizer) else obj
        rest = path[1:] if isinstance(obj, WrappingOptimizer) and path[:1] == ("optimizer",) else path
        params = [p for group in inner.param_groups for p in group["params"]]
        if len(rest) == 3 and rest[0] == "state" and isinstance(rest[1], int) and 0 <= rest[1] < len(params):
            return params[rest[1]]
    return None


def _shard_template(obj, path: tuple, ref: ShardedRef) -> torch.Tensor:
    """The tensor of ``obj`` a sharded entry at ``path`` of its saved state loads into (its
    layout, sharded or whole, decides what this rank reads); refused when there is none or its
    shape differs."""
    have = _template_at(obj, path)
    if have is None:
        raise InvalidValue(f"the checkpoint holds a sharded tensor at {list(path)}, where this object has none to "
                           "load it into: keep the same model and optimizer")
    if tuple(have.shape) != tuple(ref.shape) and isinstance(obj, torch.nn.Module):
        raise InvalidValue(f"{path[0]} has shape {tuple(ref.shape)} in the checkpoint, {tuple(have.shape)} here")
    if tuple(have.shape) != tuple(ref.shape):
        raise InvalidValue(f"the optimizer state {path[-1]!r} of parameter {path[-2]} has shape {tuple(ref.shape)} "
                           f"in the checkpoint, its parameter {tuple(have.shape)}")
    return have


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
