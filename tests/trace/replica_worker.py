"""One replica of a real 2-process run through a random trace, over torch.distributed (gloo)
or Horovod.

Saves, per rank, the parameters after every update, the sample indices it trained on, and the
BatchNorm counters of a second run in which it has steps with no micro-batch.
Usage: torchrun --standalone --nproc-per-node 2 replica_worker.py OUT_DIR SEED
       horovodrun -np 2 -H localhost:2 --gloo python replica_worker.py OUT_DIR SEED horovod
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader
from trace_common import MINIBATCH, dataset, make_model, random_trace

from aikit.elastic.Torch import CustomSampler, LinearRuleOptimizer, distributed


def start(engine: str) -> int:
    """Join the 2-process world of ``engine``; aikit must detect it on its own."""
    if engine == "horovod":
        import horovod.torch as hvd

        hvd.init()
    else:
        dist.init_process_group("gloo")
    rank = distributed.rank()
    assert (distributed.engine(), distributed.world_size()) == (engine, 2)
    return rank


def main(out: Path, seed: int, engine: str) -> None:
    rank = start(engine)
    data = dataset()
    sizes = random_trace(seed, len(data))

    # 1. every update equals the big-batch update; record parameters and samples
    model = make_model(seed=rank)  # different on each rank: the optimizer broadcasts rank 0's
    sampler = CustomSampler(data, sizes, minibatch_size=MINIBATCH, seed=seed, when_exhausted="stop")
    inner = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    optimizer = LinearRuleOptimizer(inner, sampler, ref_batchsize=32)
    history, samples = [], []
    inner.register_step_post_hook(lambda *_: history.append([p.detach().clone() for p in model.parameters()]))
    for epoch in range(2):
        sampler.set_epoch(epoch)
        optimizer.set_epoch(epoch)
        for x, y in DataLoader(data, batch_sampler=sampler):
            samples.append((epoch, sampler.step, y[:, 1].long().tolist()))
            nn.functional.mse_loss(model(x), y[:, :1]).backward()
            optimizer.step()
        # a replica whose last micro-batch came early made the epoch's remaining updates then
        assert optimizer.step_index == len(optimizer.epoch_schedule)

    # 2. a trace of single micro-batches: rank 1 sits out every other step, with no batch
    bn_model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1)).double()
    bn_sampler = CustomSampler(data, [MINIBATCH, 2 * MINIBATCH], minibatch_size=MINIBATCH, when_exhausted="cycle")
    bn_optimizer = LinearRuleOptimizer(torch.optim.SGD(bn_model.parameters(), lr=0.05), bn_sampler, ref_batchsize=16)
    bn_sampler.set_epoch(0)  # the loop calls set_epoch(0) although the constructors did: it must not
    bn_optimizer.set_epoch(0)  # join the leading step rank 1 sits out a second time
    yielded = 0
    for x, y in DataLoader(data, batch_sampler=bn_sampler):
        yielded += 1
        nn.functional.mse_loss(bn_model(x), y[:, :1]).backward()
        bn_optimizer.step()
    torch.save(
        {"history": history, "samples": samples, "bn_yielded": yielded, "bn_updates": bn_optimizer.updates,
         "bn_tracked": int(bn_model[1].num_batches_tracked), "bn_params": list(bn_model.parameters())},
        out / f"rank{rank}.pt",
    )
    if engine == "torch.distributed":
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "torch.distributed")
