"""One Horovod rank training through a random batch-size trace with LinearRuleOptimizer.

Saves the final parameters and update count, and the BatchNorm counters of a run in which rank 1
sits out every other step. Usage: horovodrun -np 2 -H localhost:2 --gloo python trace_worker.py OUT SEED
"""

import sys
from pathlib import Path

import horovod.torch as hvd
import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from trace_common import MINIBATCH, dataset, make_model, random_trace

from aikit.elastic.Torch import CustomSampler, LinearRuleOptimizer, distributed


def main(out: Path, seed: int) -> None:
    hvd.init()
    rank = hvd.rank()
    assert (distributed.engine(), distributed.world_size(), distributed.rank()) == ("horovod", 2, rank)
    data = dataset()
    model = make_model(seed=rank)  # ranks start apart: the optimizer broadcasts rank 0's parameters
    sampler = CustomSampler(data, random_trace(seed, len(data)), minibatch_size=MINIBATCH, seed=seed,
                            when_exhausted="stop")
    optimizer = LinearRuleOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3), sampler, ref_batchsize=32
    )
    for epoch in range(2):
        sampler.set_epoch(epoch)
        optimizer.set_epoch(epoch)
        for x, y in DataLoader(data, batch_sampler=sampler):
            nn.functional.mse_loss(model(x), y[:, :1]).backward()
            optimizer.step()
        assert optimizer.step_index == len(optimizer.plan)

    # trace [4, 8] cycling: rank 1 has a micro-batch only in every other step
    bn_model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1)).double()
    bn_sampler = CustomSampler(data, [MINIBATCH, 2 * MINIBATCH], minibatch_size=MINIBATCH, when_exhausted="cycle")
    bn_optimizer = LinearRuleOptimizer(torch.optim.SGD(bn_model.parameters(), lr=0.05), bn_sampler, ref_batchsize=16)
    yielded = 0
    for x, y in DataLoader(data, batch_sampler=bn_sampler):
        yielded += 1
        nn.functional.mse_loss(bn_model(x), y[:, :1]).backward()
        bn_optimizer.step()
    torch.save(
        {"final": [p.detach().clone() for p in model.parameters()], "updates": optimizer.updates,
         "bn_yielded": yielded, "bn_updates": bn_optimizer.updates,
         "bn_tracked": int(bn_model[1].num_batches_tracked), "bn_params": list(bn_model.parameters())},
        out / f"rank{rank}.pt",
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
