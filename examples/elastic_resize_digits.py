"""Train on the embedded digits through workers joining and leaving, with the same updates.

The batch size follows trace.csv; every update is committed to --checkpoint-dir. When workers
come or go, the job resumes from the last commit with the same global batches, the same LR and
the same sample order: only the deal of micro-batches to workers changes.

    python examples/elastic_resize_digits.py
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes=1:4 --nproc-per-node=1 --max-restarts=3 \\
        --rdzv-backend=c10d --rdzv-endpoint=HOST:29400 --rdzv-id=digits examples/elastic_resize_digits.py
    horovodrun -np 2 --min-np 1 --max-np 4 --host-discovery-script ./hosts.sh --gloo \\
        python examples/elastic_resize_digits.py --horovod

Start the torchrun line on each node (HOST: the node that hosts the rendezvous); kill one or
start one more mid-run and the others go on. --checkpoint-dir must be storage every node sees.
Exits with code 21 when the final test accuracy is under --target.
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
from aikit.elastic.Torch import ElasticState, TraceOptimizer, TraceSampler


def model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 10), nn.LogSoftmax(dim=1),
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(Path(__file__).with_name("trace.csv")))
    parser.add_argument("--batch-size", type=int, default=16, help="micro-batch size")
    parser.add_argument("--lr", type=float, default=0.05, help="LR at --ref-batch-size")
    parser.add_argument("--ref-batch-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--checkpoint-dir", default="elastic_resize_checkpoint")
    parser.add_argument("--horovod", action="store_true", help="run under horovodrun (elastic or not)")
    parser.add_argument("--target", type=float, default=0.95, help="least acceptable test accuracy")
    args = parser.parse_args()

    if args.horovod:
        import horovod.torch as hvd

        hvd.init()
    elif "WORLD_SIZE" in os.environ:  # torchrun: one replica per process
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    x_train, y_train, x_test, y_test = digits()
    dataset = TensorDataset(torch.as_tensor(x_train), torch.as_tensor(y_train))
    sampler = TraceSampler(dataset, args.trace, micro_batch=args.batch_size)
    loader = DataLoader(dataset, batch_sampler=sampler)
    net = model()
    # under Horovod elastic a worker that joins must not broadcast on its own: the state's sync does it
    optimizer = TraceOptimizer(torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9), sampler,
                               ref_batch_size=args.ref_batch_size, broadcast=not args.horovod)
    state = ElasticState(args.checkpoint_dir, model=net, optimizer=optimizer)

    def train(state: ElasticState) -> None:
        for epoch in state.epochs(args.epochs):  # from where the last commit left off
            for x, y in loader:
                nn.functional.nll_loss(net(x), y).backward()
                if optimizer.step():  # an update: the global batch of this step is done
                    state.commit()
            if sampler.rank == 0:
                print(f"epoch {epoch} done by {sampler.num_replicas} worker(s), {optimizer.updates} updates, "
                      f"test accuracy {accuracy(net, x_test, y_test):.3f}", flush=True)

    if args.horovod:
        hvd.elastic.run(train)(state)  # restores, re-deals and goes on when workers come or go
    else:
        state.restore()  # the last commit, re-planned for this world size (a fresh start if none)
        train(state)
    final = accuracy(net, x_test, y_test)
    if dist.is_initialized():
        dist.destroy_process_group()
    if final < args.target:
        print(f"final test accuracy {final:.3f} is under the target {args.target}", file=sys.stderr)
        return 21
    return 0


def accuracy(net: nn.Module, x, y) -> float:
    net.eval()
    with torch.no_grad():
        correct = (net(torch.as_tensor(x)).argmax(1) == torch.as_tensor(y)).double().mean().item()
    net.train()
    return correct


if __name__ == "__main__":
    sys.exit(main())
