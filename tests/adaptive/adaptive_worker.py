"""One replica of a real 2-process adaptive run, over torch.distributed (gloo) or Horovod.

Each rank's clock says its updates cost differently, so the replicas agree on the batch only if
the controller sees all-reduced times. Saves, per rank: the parameters after every update, the
samples of every micro-batch, the batches and changes, each update's noise estimate, and how
many all-reduces the updates made.
Usage: torchrun --standalone --nproc-per-node 2 adaptive_worker.py OUT_DIR
       horovodrun -np 2 -H localhost:2 --gloo python adaptive_worker.py OUT_DIR horovod
"""

import sys
from pathlib import Path

import torch
from adaptive_common import Clock, dataset, make_model, train

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from replica_worker import start

from aikit.elastic.Torch import AdaptiveOptimizer, AdaptiveSampler
from aikit.runtime.Torch import collectives

MICRO, BASE, MAX, EPOCHS = 4, 16, 64, 2  # two micro-steps per replica at the base batch


def main(out: Path, engine: str) -> None:
    rank = start(engine)

    reductions = [0]
    all_reduce = collectives.all_reduce_sum_

    def counted(tensors):
        reductions[0] += 1
        return all_reduce(tensors)

    collectives.all_reduce_sum_ = counted  # the real collective, counted

    data = dataset()
    model = make_model(seed=rank)  # different on each rank: the optimizer broadcasts rank 0's
    clock = Clock(per_update=0.05 * (1 + 3 * rank))  # the ranks time their updates differently
    sampler = AdaptiveSampler(data, base_batch=BASE, max_batch=MAX, micro_batch=MICRO, seed=5, decay=0.0,
                              max_change=8.0)  # several plans within the few epochs the test trains
    optimizer = AdaptiveOptimizer(torch.optim.SGD(model.parameters(), lr=0.02), sampler, "linear", clock=clock)
    noise = []
    optimizer.optimizer.register_step_post_hook(lambda *_: noise.append(sampler.controller.noise.smoothed))
    history, samples = train(model, data, EPOCHS, sampler=sampler, optimizer=optimizer, clock=clock)
    torch.save({"history": history, "samples": samples, "batches": sampler.controller.batches,
                "changes": sampler.controller.changes, "reductions": reductions[0],
                "noise": [(n.grad_sq, n.trace) for n in noise],
                "sizes": [len(sampler.schedule.epoch(e)) for e in range(EPOCHS)]}, out / f"rank{rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "torch.distributed")
