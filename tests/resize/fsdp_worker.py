"""One worker of the sharded resize tests, under ``torchrun --nproc-per-node N`` (gloo, CPU).

    fsdp_worker.py OUT CKPT NAME [--init-seed S] [--stop-after K] [--pause-commit C] [--forget-restore]

A model sharded with FSDP2 (``fully_shard`` on each Linear and the root), AdamW in aikit's GA
wrapper, an ``ElasticState(CKPT, model=, optimizer=, position=)`` restored at start. Each trace
step of fsdp_common is planned for this world by ``aikit.elastic.Torch.init(G, M)`` (the
wrapper's ``steps`` set from it) and its global batch cut by ``micro_batch_slices``; every update
is committed, with ``position`` (the next epoch and step) as a plain value.

``--stop-after K``: after the K-th update of this run, take one micro-step of the next and exit
(a worker lost mid-update: that update was never committed). ``--pause-commit C``: rank 1
stops in commit C before writing its shard, touches OUT/NAME.paused and sleeps until killed
(each rank writes its pid to OUT/NAME.pid<r> at start). ``--forget-restore``: no ``restore()``;
the first commit's error is what each rank saves, and it exits. ``restore()`` runs with ``torch.load``
and ``pickle.load`` failing. Each rank saves what it saw to OUT/NAME.rank<r>.pt: the restore, its
warnings, every micro-batch's samples, and (all ranks gather them) the final weights and AdamW
state.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import pickle
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path
from unittest import mock

import torch
import torch.distributed as dist
from fsdp_common import MAX_MICRO, adamw, data, model, schedule, steps
from torch.distributed.fsdp import fully_shard

import aikit.elastic.Torch as elastic
from aikit.core.errors import CommitError
from aikit.core.plan import micro_batch_slices
from aikit.elastic.Torch import sharded
from aikit.elastic.Torch.checkpoint import CorruptCheckpointWarning
from aikit.elastic.Torch.resize import ElasticState
from aikit.ga.Torch.optim import Optimizer


def pause_in_commit(number: int, rank: int, paused: Path) -> None:
    """Rank ``rank`` stops in commit ``number`` before writing its shard (until killed)."""
    write = sharded.ShardWriter.write_data

    def write_data(self, plan, planner):
        if self.directory.name.startswith(f"aikit_state.{number:09d}.") and dist.get_rank() == rank:
            paused.touch()
            time.sleep(600)
        return write(self, plan, planner)

    sharded.ShardWriter.write_data = write_data


@contextlib.contextmanager
def no_file_unpickled():
    """torch.load and pickle.load fail on anything but bytes in memory (restore()'s broadcast
    of rank 0's commit unpickles those, from the job's own rank 0): DCP's own reader unpickles
    its .metadata file with pickle.load and its items with torch.load; aikit's must do neither."""

    def refusing(load):
        def guarded(source, *args, **kwargs):
            if not isinstance(source, io.BytesIO):
                raise AssertionError(f"restore() unpickled {source!r}")
            return load(source, *args, **kwargs)

        return guarded

    with mock.patch.object(torch, "load", refusing(torch.load)), \
            mock.patch.object(torch.serialization, "load", refusing(torch.serialization.load)), \
            mock.patch.object(pickle, "load", refusing(pickle.load)):
        yield


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("ckpt", type=Path)
    parser.add_argument("name")
    parser.add_argument("--init-seed", type=int, default=0)
    parser.add_argument("--stop-after", type=int, default=None)
    parser.add_argument("--pause-commit", type=int, default=None)
    parser.add_argument("--forget-restore", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    (args.out / f"{args.name}.pid{rank}").write_text(str(os.getpid()))
    if args.pause_commit is not None:
        pause_in_commit(args.pause_commit, 1, args.out / f"{args.name}.paused")

    net = model(args.init_seed)  # a restarted run starts elsewhere: only restore() brings the weights back
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(net)
    opt = Optimizer(adamw(net.parameters()), steps=1, reduction="sum")
    state = ElasticState(args.ckpt, model=net, optimizer=opt, position={"epoch": 0, "step": 0}, verbose=False)
    with warnings.catch_warnings(record=True) as caught, no_file_unpickled():
        warnings.simplefilter("always")
        restored = False if args.forget_restore else state.restore()
    seen = {"restored": restored, "restored_from": state.restored_from, "commits": state.commits,
            "position": dict(state.position), "log": [],
            "warnings": [str(w.message) for w in caught if issubclass(w.category, CorruptCheckpointWarning)]}

    x, y = data()
    order, plan_of = steps(), schedule()
    at = (state.position["epoch"], state.position["step"])
    start = len(order) if at == (None, None) else order.index(at)
    for update, (epoch, step) in enumerate(order[start:], start=1):
        window = plan_of.epoch(epoch).step_indices(step)
        plan = elastic.init(len(window), MAX_MICRO)
        opt.steps = plan.steps
        for part in micro_batch_slices(plan, rank):
            index = torch.as_tensor(window[part])
            seen["log"].append((epoch, step, world, rank, index.tolist()))
            with opt.accumulate(net):
                loss = ((net(x[index]) - y[index]) ** 2).sum() / len(window)
                loss.backward()
            opt.step()
            if args.stop_after is not None and update == args.stop_after + 1:
                torch.save(seen, args.out / f"{args.name}.rank{rank}.pt")
                os._exit(0)  # lost mid-update
        assert opt.micro_step == 0
        following = order[order.index((epoch, step)) + 1] if (epoch, step) != order[-1] else (None, None)
        state.position = {"epoch": following[0], "step": following[1]}
        if args.forget_restore:
            try:
                state.commit()
                seen["refused"] = None
            except CommitError as error:
                seen["refused"] = str(error)
            torch.save(seen, args.out / f"{args.name}.rank{rank}.pt")
            dist.destroy_process_group()
            return
        state.commit()
    seen["final"] = {k: v.full_tensor() for k, v in net.state_dict().items()}
    names = {p: name for name, p in net.named_parameters()}
    seen["adam"] = {f"{names[p]}.{key}": value.full_tensor() if hasattr(value, "full_tensor") else value
                    for p, values in opt.state.items() for key, value in values.items()}
    seen["steps_per_update"] = opt.steps
    torch.save(seen, args.out / f"{args.name}.rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
