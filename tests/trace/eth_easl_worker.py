"""One of two real replicas (torchrun + gloo) for tests/trace/test_eth_easl_replicas.py.

1. AdaScaleOptimizer through a trace of 1..5 micro-batches per step (rank 1 sits out the steps
   of one): per update, the parameters it saw, its LRs, gains and progress, and per micro-batch
   the samples this rank trained.
2. LinearRuleOptimizer with permutation='torch' through eth-easl's own trace over digits: the
   parameters after every update; rank 0 also runs the re-implementation of eth-easl's code
   over two simulated ranks in this same process (same threads, same kernels).
Usage: torchrun --standalone --nproc-per-node 2 eth_easl_worker.py OUT_DIR TRACE_CSV
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from eth_easl_original import original_run
from torch import nn
from torch.utils.data import DataLoader
from trace_common import MINIBATCH, dataset, make_model

from aikit.elastic.Torch import AdaScaleOptimizer, CustomSampler, LinearRuleOptimizer

ADASCALE_TRACE = [k * MINIBATCH for k in (1, 2, 3, 5, 1, 4, 2)]


def adascale(rank: int) -> dict:
    data = dataset(60)
    model = make_model(seed=rank)  # rank 0's parameters are broadcast
    sampler = CustomSampler(data, ADASCALE_TRACE, minibatch_size=MINIBATCH, when_exhausted="cycle")
    weights = [p for name, p in model.named_parameters() if name.endswith("weight")]
    biases = [p for name, p in model.named_parameters() if name.endswith("bias")]
    inner = torch.optim.SGD([{"params": weights}, {"params": biases, "lr": 0.1}], lr=0.05, momentum=0.9)
    optimizer = AdaScaleOptimizer(inner, sampler, ref_batchsize=16, decay=0.5)
    seen = {"updates": [], "samples": []}

    def record(opt, *_):
        seen["updates"].append({"at": (optimizer.epoch, optimizer.step_index),
                                "params": [p.detach().clone() for p in model.parameters()],
                                "lr": [g["lr"] for g in opt.param_groups], "gains": optimizer.gain(),
                                "model_gain": optimizer.last_gain, "progress": optimizer.progress})

    inner.register_step_pre_hook(record)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        optimizer.set_epoch(epoch)
        for x, y in DataLoader(data, batch_sampler=sampler):
            seen["samples"].append((epoch, sampler.step, y[:, 1].long().tolist()))
            nn.functional.mse_loss(model(x), y[:, :1]).backward()
            optimizer.step()
    return seen


def digits_run(rank: int, trace: str) -> dict:
    from test_eth_easl import digits_data, digits_model

    data = digits_data()
    model = digits_model()
    sampler = CustomSampler(data, trace, 42, minibatch_size=32, permutation="torch")
    inner = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    optimizer = LinearRuleOptimizer(inner, sampler, ref_batchsize=96)
    history = []
    inner.register_step_post_hook(lambda *_: history.append([p.detach().clone() for p in model.parameters()]))
    for epoch in range(3):
        sampler.set_epoch(epoch)
        optimizer.set_epoch(epoch)
        for x, y in DataLoader(data, batch_sampler=sampler):
            nn.functional.nll_loss(model(x), y).backward()
            optimizer.step()
    result = {"history": history}
    if rank == 0:
        reference = digits_model()
        result["original"] = original_run(
            reference, *data.tensors, nn.functional.nll_loss, trace, seed=42, num_replicas=2, minibatch_size=32,
            epochs=range(3), ref_batchsize=96, optimizer=torch.optim.SGD(reference.parameters(), lr=0.01, momentum=0.5))
    return result


def main(out: Path, trace: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.save({"adascale": adascale(rank), "digits": digits_run(rank, trace)}, out / f"rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
