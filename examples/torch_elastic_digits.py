"""aikit's main job: a small CNN on the embedded digits, elastic in its hardware.

The global batch stays 256 whatever runs it; aikit plans GA steps and micro-batches for the
devices found (one CPU process: 4 GA steps of 64; two processes: 2 steps of 64 each):

    python examples/torch_elastic_digits.py
    torchrun --nproc-per-node 2 examples/torch_elastic_digits.py
    horovodrun -np 2 -H localhost:2 --gloo python examples/torch_elastic_digits.py

One process on a multi-GPU machine uses torch.nn.DataParallel; under torchrun every process
is one device of DistributedDataParallel (gloo on CPU, NCCL on GPUs); under horovodrun every
process is one device and aikit's Horovod optimizer all-reduces once per update.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

import aikit.elastic.Torch
from aikit.core.plan import micro_batch_slices
from aikit.datasets import digits
from aikit.elastic.Torch import distributed
from aikit.ga.Torch.optim import Optimizer


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10),
    )


def main() -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--global-batch-size", type=int, default=256)
    parser.add_argument("--max-device-batch", type=int, default=64)
    parser.add_argument("--gpus", type=int, default=None, help="devices to plan for (default: found)")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads per process: 8x8 images are too small to split, more only spin")
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    torch.set_num_threads(args.threads)
    horovod_run = "HOROVOD_RANK" in os.environ  # launched by horovodrun
    multi_process = "WORLD_SIZE" in os.environ
    if horovod_run:
        import horovod.torch as hvd

        hvd.init()
    elif multi_process:
        torch.distributed.init_process_group("nccl" if cuda else "gloo")
    device = torch.device(f"cuda:{distributed.local_rank()}" if cuda else "cpu")
    plan = aikit.elastic.Torch.init(args.global_batch_size, args.max_device_batch, gpus=args.gpus)
    master = aikit.elastic.Torch.master
    if master:
        print(aikit.elastic.Torch.summary(), flush=True)

    # standard strides: DDP's bucket views expect gradients in the parameters' own layout
    x_train, y_train, x_test, y_test = (
        torch.from_numpy(a).clone(memory_format=torch.contiguous_format).to(device) for a in digits(seed=args.seed)
    )
    torch.manual_seed(args.seed)
    net = cnn().to(device)
    if multi_process:  # one device per process; DDP broadcasts rank 0's weights
        model = nn.parallel.DistributedDataParallel(net, device_ids=[device.index] if cuda else None)
    elif torch.cuda.device_count() > 1:  # one process, every GPU: Run:AI's AIkit Elastic recipe
        model = nn.DataParallel(net)
    else:
        model = net
    adam = torch.optim.Adam(net.parameters(), lr=args.lr)
    if horovod_run:  # one all-reduce per update over Horovod; every rank starts from rank 0's weights
        from aikit.elastic.Torch import horovod

        optimizer = horovod.DistributedOptimizer(adam, aikit.elastic.Torch.steps)
        horovod.broadcast_state(net, optimizer)
    else:
        optimizer = Optimizer(adam, aikit.elastic.Torch.steps)

    # Every update takes the next G samples of the epoch's shuffled order (same seed on every
    # rank); this process trains on its pieces of them. The last len % G samples of an epoch
    # wait for a later epoch's shuffle rather than making a smaller update.
    pieces = micro_batch_slices(plan, distributed.rank() if multi_process or horovod_run else None)
    updates = len(y_train) // plan.global_batch_size
    progress = tqdm(total=args.epochs * updates, disable=not master, desc="training", unit="update")
    for epoch in range(args.epochs):
        order = torch.from_numpy(np.random.default_rng([args.seed, epoch]).permutation(len(y_train)))
        for update in range(updates):
            window = order[update * plan.global_batch_size : (update + 1) * plan.global_batch_size]
            for piece in pieces:
                batch = window[piece].to(device)
                with optimizer.accumulate(model, samples=len(batch)):
                    loss = nn.functional.cross_entropy(model(x_train[batch]), y_train[batch])
                    loss.backward()
                optimizer.step()
            progress.update()
            progress.set_postfix(epoch=epoch, loss=f"{loss.item():.3f}")
    progress.close()

    net.eval()
    with torch.no_grad():
        accuracy = (net(x_test).argmax(1) == y_test).double().mean().item()
    if master:
        print(f"held-out accuracy: {accuracy:.2%} on {len(y_test)} digits "
              f"({args.epochs} epochs, {args.epochs * updates} updates of {plan.global_batch_size})")
    if multi_process:
        torch.distributed.destroy_process_group()
    return accuracy


if __name__ == "__main__":
    main()
