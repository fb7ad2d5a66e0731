"""One worker of the resize fault tests, launched by torchrun or horovodrun.

    resize_worker.py RUN_DIR [--delay SECONDS] [--horovod]

Trains resize_common's model through the trace with an :class:`ElasticState` in RUN_DIR/ckpt,
committing after every update. Before each micro-batch's ``optimizer.step()`` it appends the
micro-batch's sample ids to RUN_DIR/logs/<pid>.jsonl (so a step rank 0 commits has every
rank's ids on disk: the step's all-reduce cannot finish before each rank logged). Rank 0 also
logs each commit's time. At the end rank 0 writes the final weights to RUN_DIR/final.pt.
"""
# ruff: noqa: E402 (BOOTED is taken before the imports)

from __future__ import annotations

import time

BOOTED = time.time()  # before the imports: recovery time includes them

import argparse
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
from resize_common import EPOCHS, MINIBATCH, REF_BATCH, SEED, N, loss_of, make_model, make_sgd, trace

from aikit.elastic.Torch import CustomSampler, LinearRuleOptimizer
from aikit.elastic.Torch.resize import ElasticState

MARKS = {"imported": time.time()}  # when the worker got where (seconds since the epoch)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds to sleep after each update")
    parser.add_argument("--solo-delay", type=float, default=None, help="seconds after each update while alone")
    parser.add_argument("--horovod", action="store_true")
    parser.add_argument("--timeout", type=float, default=30, help="the process group's timeout in seconds")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = np.load(args.run_dir / "data.npz")
    x, y = torch.from_numpy(data["x"]), torch.from_numpy(data["y"])
    logs = args.run_dir / "logs"
    logs.mkdir(exist_ok=True)

    if args.horovod:
        import horovod.torch as hvd

        hvd.init()
        model, opt, state = build(args.run_dir, broadcast=False)  # a joining worker must not broadcast here
        hvd.elastic.run(train)(state, x, y, logs, args.delay, args.solo_delay)
        rank = hvd.rank()
    else:
        torch.distributed.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
        MARKS["joined"] = time.time()
        model, opt, state = build(args.run_dir)
        state.restore()
        train(state, x, y, logs, args.delay, args.solo_delay)
        rank = torch.distributed.get_rank()
    if rank == 0:
        torch.save({"model": model.state_dict(), "updates": opt.updates}, args.run_dir / "final.pt")


def build(run_dir: Path, broadcast: bool = True):
    model = make_model()
    sampler = CustomSampler(N, trace(), minibatch_size=MINIBATCH, seed=SEED)
    opt = LinearRuleOptimizer(make_sgd(model), sampler, ref_batchsize=REF_BATCH, broadcast=broadcast)
    return model, opt, ElasticState(run_dir / "ckpt", model=model, optimizer=opt)


def train(state: ElasticState, x, y, logs: Path, delay: float, solo_delay: float | None = None) -> None:
    from aikit.elastic.Torch import distributed

    opt, model = state.optimizer, state.model
    world, rank = distributed.world_size(), distributed.rank()
    if world == 1 and solo_delay is not None:
        delay = solo_delay
    log = open(logs / f"{os.getpid()}.jsonl", "a")  # noqa: SIM115 (open for the whole run)

    def write(**record) -> None:
        record.update(inc=state.incarnation, world=world, rank=rank, pid=os.getpid(), ppid=os.getppid(),
                      host=os.environ.get("HOROVOD_HOSTNAME", os.environ.get("AIKIT_TEST_HOST")), t=time.time())
        log.write(json.dumps(record) + "\n")
        log.flush()

    write(event="start", booted=BOOTED, **MARKS, restored=state.restored_from, epoch=opt.epoch, step=opt.step_index)
    for epoch in state.epochs(EPOCHS):
        for batch in opt.sampler:
            loss_of(model, x[batch], y[batch]).backward()
            write(event="micro", epoch=epoch, step=opt.step_index, ids=batch)
            if opt.step():
                write(event="update", epoch=opt.epoch, step=opt.step_index, updates=opt.updates)
                if rank == 0:
                    write(event="committing", updates=opt.updates)
                state.commit()
                if rank == 0:
                    write(event="commit", epoch=opt.epoch, step=opt.step_index, updates=opt.updates)
                time.sleep(delay)
    log.close()


if __name__ == "__main__":
    sys.exit(main())
