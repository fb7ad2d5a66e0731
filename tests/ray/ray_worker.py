"""What Ray Train's workers run in tests/ray: ``train_loop_per_worker`` functions over the resize
tests' own runs, with ``aikit.integrations.ray.ElasticState`` in the run's storage.

* :func:`trace_run`: tests/resize/resize_worker.py's model, trace optimizer and loop (its logs, which
  resize_checks reads back), restored at the top as every Ray restart runs it anew;
* :func:`sharded_run`: tests/resize/fsdp_common.py's FSDP2 model under the GA wrapper, each step
  planned for Ray's world by ``init(G, M)``;
* :func:`ddp_run`: tests/torch/ddp_worker.py's DDP + GA scenarios at a fixed worker count;
* :func:`checked_run`, :func:`missing_trace_run`: what must be refused, once.

Each takes Ray's ``train_loop_config`` dict.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import torch


def trace_run(config: dict) -> None:
    """resize_worker's run; ``config``: run_dir, delay (s after each update), solo_delay (s
    after each update while alone), epochs (to train up to, all of them by default), report
    (the last commit to Ray at the end), start_from (restore()'s)."""
    import resize_worker

    from aikit.integrations.ray import ElasticState
    from aikit.runtime.Torch import distributed

    torch.set_num_threads(1)
    run_dir = Path(config["run_dir"])
    data = np.load(run_dir / "data.npz")
    x, y = torch.from_numpy(data["x"]), torch.from_numpy(data["y"])
    logs = run_dir / "logs"
    logs.mkdir(exist_ok=True)
    model, opt, _ = resize_worker.build(run_dir)  # its model, sampler and trace optimizer
    state = ElasticState(model=model, optimizer=opt)
    resize_worker.EPOCHS = config.get("epochs", resize_worker.EPOCHS)  # what its train() goes up to
    resize_worker.MARKS["joined"] = time.time()
    state.restore(start_from=config.get("start_from"))
    resize_worker.train(state, x, y, logs, config.get("delay", 0.0), config.get("solo_delay"))
    if config.get("report"):
        state.report({"epoch": opt.epoch})
    if distributed.rank() == 0:
        torch.save({"model": model.state_dict(), "updates": opt.updates}, run_dir / "final.pt")


def sharded_run(config: dict) -> None:
    """fsdp_common's sharded model through its trace, every step planned for this world; each
    update logged to run_dir/logs (world, steps). Alone, after ``hold_after`` updates the worker
    waits (up to ``hold_s``) for Ray to resize; rank 0 saves the final weights and AdamW state."""
    from fsdp_common import MAX_MICRO, adamw, data, model, schedule, steps
    from torch.distributed.fsdp import fully_shard

    import aikit.elastic.Torch as elastic
    from aikit.core.plan import micro_batch_slices
    from aikit.ga.Torch.optim import Optimizer
    from aikit.integrations.ray import ElasticState

    torch.set_num_threads(1)
    run_dir = Path(config["run_dir"])
    (run_dir / "logs").mkdir(exist_ok=True)
    net = model(1)  # not the reference's start: only restore() (or rank 0's broadcast) makes them equal
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(net)
    opt = Optimizer(adamw(net.parameters()), steps=1, reduction="sum")
    state = ElasticState(model=net, optimizer=opt, position={"epoch": 0, "step": 0})
    restored = state.restore()
    if not restored:  # a fresh start: every rank from the reference's weights
        with torch.no_grad():
            for mine, start in zip(net.parameters(), model(0).parameters(), strict=True):
                mine.copy_(torch.distributed.tensor.distribute_tensor(start, mine.device_mesh, mine.placements))
    world, rank = elastic.distributed.world_size(), elastic.distributed.rank()
    log = open(run_dir / "logs" / f"{os.getpid()}.jsonl", "a")  # noqa: SIM115 (open for the whole run)
    x, y = data()
    order, plan_of = steps(), schedule()
    at = (state.position["epoch"], state.position["step"])
    alone = 0
    for epoch, step in order[len(order) if at == (None, None) else order.index(at):]:
        window = plan_of.epoch(epoch).step_indices(step)
        plan = elastic.init(len(window), MAX_MICRO)
        opt.steps = plan.steps
        for part in micro_batch_slices(plan, rank):
            index = torch.as_tensor(window[part])
            with opt.accumulate(net):
                (((net(x[index]) - y[index]) ** 2).sum() / len(window)).backward()
            opt.step()
        following = order[order.index((epoch, step)) + 1] if (epoch, step) != order[-1] else (None, None)
        state.position = {"epoch": following[0], "step": following[1]}
        state.commit()
        log.write(json.dumps({"event": "commit", "epoch": epoch, "step": step, "world": world, "rank": rank,
                              "steps": plan.steps, "global_batch": len(window), "inc": state.incarnation,
                              "restored": state.restored_from, "pid": os.getpid(), "t": time.time()}) + "\n")
        log.flush()
        alone += world == 1
        if world == 1 and alone >= config.get("hold_after", 10**9):
            time.sleep(config.get("hold_s", 0))
    final = {k: v.full_tensor() for k, v in net.state_dict().items()}
    names = {p: name for name, p in net.named_parameters()}
    adam = {f"{names[p]}.{key}": value.full_tensor() if hasattr(value, "full_tensor") else value
            for p, values in opt.state.items() for key, value in values.items()}
    if rank == 0:
        torch.save({"final": final, "adam": adam}, run_dir / "final.pt")


def checked_run(config: dict) -> None:
    """``init(G, M)`` with this rank's ``global_batch[rank]``, an ElasticState in ``directory``
    (each rank its own sub-directory with ``per_rank``, as disks local to each node) restored and
    one commit: where the workers' check must refuse before anything is read or written."""
    import aikit.elastic.Torch as elastic
    from aikit.ga.Torch.optim import Optimizer
    from aikit.integrations.ray import ElasticState

    rank = torch.distributed.get_rank()
    plan = elastic.init(config["global_batch"][rank], 8)
    net = torch.nn.Linear(4, 2).double()
    opt = Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), plan.steps)
    directory = Path(config["directory"]) / (f"node-{rank}" if config.get("per_rank") else "")
    state = ElasticState(directory, model=net, optimizer=opt)
    state.restore()
    state.commit()


def missing_trace_run(config: dict) -> None:
    """The recipe's first line with a trace path as the user wrote it (``config["trace"]``), each
    attempt noted in run_dir/attempts.txt: a relative path is read in Ray's directory, not the driver's."""
    from aikit.elastic.Torch import CustomSampler

    with open(Path(config["run_dir"]) / "attempts.txt", "a") as attempts:
        attempts.write(f"{os.getpid()} {os.getcwd()}\n")
    CustomSampler(64, config["trace"], micro_batch=4)


def ddp_run(config: dict) -> dict:
    """Every scenario of tests/torch/ddp_worker.py on Ray's process group; returns rank 0's."""
    import ddp_worker

    torch.set_num_threads(1)
    results = {name: ddp_worker.run(name) for name in ddp_worker.SCENARIOS}
    return results if torch.distributed.get_rank() == 0 else None
