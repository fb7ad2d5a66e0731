"""One worker of the Horovod elastic GA test, launched by ``horovodrun --host-discovery-script``.

    elastic_ga_worker.py RUN_DIR DELAY SOLO_DELAY

Trains hvd_case's ELASTIC case with aikit's Horovod ``DistributedOptimizer`` and
``accumulate(samples=)`` inside ``hvd.elastic.run``, the state in ``hvd.elastic.TorchState``
(model, the GA optimizer, the update counter), committing after every update. At the top of each
update it plans for the world it finds (``aikit.elastic.Torch.init`` reads ``hvd.size()``) and
sets ``optimizer.steps``; update k always trains on window k. Each update appends
``{"update", "world", "rank", "steps", "host", "t"}`` to RUN_DIR/logs/<pid>.jsonl; then it sleeps DELAY seconds
(SOLO_DELAY while alone), until the test creates RUN_DIR/fast, so the resizes it asks for find
the job running. At the end rank 0 writes the parameters to RUN_DIR/final.pt.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import horovod.torch as hvd
import torch
from hvd_case import ELASTIC, data, model

import aikit.elastic.Torch
from aikit.core.plan import micro_batch_slices
from aikit.elastic.Torch import horovod


def main() -> None:
    run_dir, delay, solo_delay = Path(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    hvd.init()
    torch.set_num_threads(1)
    x, y = data()
    net = model(seed=100 + hvd.rank())  # workers start apart: the elastic sync makes them rank 0's
    inner, _ = ELASTIC.inner(net)
    optimizer = horovod.DistributedOptimizer(inner, 1, global_batch_size=ELASTIC.G,
                                             max_grad_norm=ELASTIC.max_grad_norm)
    state = hvd.elastic.TorchState(model=net, optimizer=optimizer, update=0)
    windows = ELASTIC.window_indices()
    log = open(run_dir / "logs" / f"{os.getpid()}.jsonl", "a")  # noqa: SIM115 (open for the whole run)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.update < len(windows):
            plan = aikit.elastic.Torch.init(ELASTIC.G, ELASTIC.M)  # the world of this update
            optimizer.steps = plan.steps
            rank, world, window = hvd.rank(), hvd.size(), windows[state.update]
            for piece in micro_batch_slices(plan, rank):
                idx = window[piece]
                with optimizer.accumulate(net, samples=len(idx)):
                    if len(idx):
                        torch.nn.functional.cross_entropy(net(x[idx]), y[idx]).backward()
                optimizer.step()
            assert optimizer.updated and optimizer.micro_step == 0
            state.update += 1
            log.write(json.dumps({"update": state.update, "world": world, "rank": rank, "steps": plan.steps,
                                  "host": os.environ.get("HOROVOD_HOSTNAME"),
                                  "t": time.time()}) + "\n")
            log.flush()
            if not (run_dir / "fast").exists():
                time.sleep(solo_delay if world == 1 else delay)
            state.commit()

    train(state)
    if hvd.rank() == 0:
        torch.save([p.detach().clone() for p in net.parameters()], run_dir / "final.pt")


if __name__ == "__main__":
    main()
