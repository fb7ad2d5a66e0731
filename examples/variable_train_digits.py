"""Train a small CNN on the embedded digits with the global batch size read from a trace.

eth-easl's variable batch size MNIST script on scikit-learn's digits: the batch size follows trace.csv (make
your own with ``aikit trace make``), the CustomSampler deals each step's micro-batches to the
replicas, and LinearRuleOptimizer accumulates, all-reduces and scales the LR per step.

    python examples/variable_train_digits.py
    torchrun --standalone --nproc-per-node 2 examples/variable_train_digits.py

Exits with code 21 when the best test accuracy is under --target (as eth-easl's script does).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aikit.datasets import digits
from aikit.elastic.Torch import CustomSampler, LinearRuleOptimizer


def model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 10), nn.LogSoftmax(dim=1),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(Path(__file__).with_name("trace.csv")))
    parser.add_argument("--batch-size", type=int, default=32, help="micro-batch size")
    parser.add_argument("--lr", type=float, default=0.05, help="LR at --ref-batch-size")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--ref-batch-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--log-steps", type=int, default=10)
    parser.add_argument("--target", type=float, default=0.97, help="least acceptable test accuracy")
    args = parser.parse_args()

    if "WORLD_SIZE" in os.environ:  # launched by torchrun: one replica per process
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    x_train, y_train, x_test, y_test = digits()
    train_dataset = TensorDataset(torch.as_tensor(x_train), torch.as_tensor(y_train))

    train_sampler = CustomSampler(train_dataset, args.trace, micro_batch=args.batch_size)
    train_loader = DataLoader(train_dataset, batch_sampler=train_sampler)
    net = model()
    optimizer = LinearRuleOptimizer(torch.optim.SGD(net.parameters(), lr=args.lr, momentum=args.momentum),
                                    train_sampler, ref_batch_size=args.ref_batch_size, log_steps=args.log_steps)
    master = train_sampler.rank == 0
    if master:
        print(f"{train_sampler.num_replicas} replica(s), {len(train_dataset)} training images, trace {args.trace}")

    best = 0.0
    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        optimizer.set_epoch(epoch)
        net.train()
        for x, y in train_loader:
            nn.functional.nll_loss(net(x), y).backward()
            optimizer.step()  # accumulates, or all-reduces and updates
        net.eval()
        with torch.no_grad():
            accuracy = (net(torch.as_tensor(x_test)).argmax(1) == torch.as_tensor(y_test)).double().mean().item()
        best = max(best, accuracy)
        if master:
            sizes = optimizer.epoch_schedule.batch_sizes
            print(f"epoch {epoch}: {len(sizes)} steps, batch sizes {int(sizes.min())}..{int(sizes.max())}, "
                  f"test accuracy {accuracy:.3f}", flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()
    if best < args.target:
        print(f"best test accuracy {best:.3f} is under the target {args.target}", file=sys.stderr)
        return 21
    return 0


if __name__ == "__main__":
    sys.exit(main())
