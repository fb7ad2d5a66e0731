"""Train on the embedded digits in TorchFT replica groups: lose one, bring it back, no restart.

Each process is one replica group. A lighthouse gathers the groups into a quorum before every
update; aikit deals the update's global batch (the trace's, 64 here) over the groups that take
part, so it stays 64 whether two groups train or one. A group that dies costs the others its
heartbeat and the update it died in; a group started again heals from a live one (the model, the
optimizer and the trace position, as commit bytes) and joins at the next update. Start the
lighthouse and two groups (needs ``pip install 'aikit-elastic[torchft]'``):

    torchft_lighthouse --min_replicas 1 --join_timeout_ms 2000 --heartbeat_timeout_ms 1000 --bind [::]:29510
    python examples/torchft_digits.py --lighthouse http://localhost:29510 --id group0
    python examples/torchft_digits.py --lighthouse http://localhost:29510 --id group1

Kill either (Ctrl-C, or ``kill -9``) and start it again: the other goes on alone, then with it.
``--demo`` does it all on this machine: a lighthouse in this process, two groups, one of which
SIGKILLs itself after --lose-at updates and is started again (each micro-batch sleeps --compute-s,
as a bigger model's compute would take, so that the run lasts until it is back). Exits with code 21
when a group's final test accuracy is under --target.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

from aikit.datasets import digits
from aikit.elastic.Torch import ElasticState, TraceOptimizer, TraceSampler
from aikit.elastic.Torch.fault_tolerance import ReplicaGroup


def train(args: argparse.Namespace) -> float:
    """One replica group's training; returns its final test accuracy."""
    torch.manual_seed(0)  # every group builds the same model (the first quorum makes them equal anyway)
    x_train, y_train, x_test, y_test = digits()
    dataset = TensorDataset(torch.as_tensor(x_train), torch.as_tensor(y_train))
    sampler = TraceSampler(dataset, args.global_batch, micro_batch=16)  # the trace: 64 every step
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10), nn.LogSoftmax(dim=1))
    optimizer = TraceOptimizer(torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9), sampler,
                               ref_batch_size=64)
    state = ElasticState(args.checkpoints, model=net, optimizer=optimizer)  # what a group that heals fetches
    with ReplicaGroup(state, args.lighthouse, replica_id=args.id, timeout_s=10) as group:
        for epoch in group.epochs(args.epochs):
            for indices in group.micro_batches():  # this group's share of each update, dealt after its quorum
                x, y = dataset[indices]
                nn.functional.nll_loss(net(x), y).backward()
                time.sleep(args.compute_s)  # stands in for a bigger model's compute
                optimizer.step()
                if group.updates == args.lose_at:
                    print(f"{args.id}: SIGKILL after update {args.lose_at}", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
            with torch.no_grad():
                correct = (net(torch.as_tensor(x_test)).argmax(1) == torch.as_tensor(y_test)).float().mean().item()
            print(f"{args.id}: epoch {epoch} done, {group.replicas} group(s) in the last quorum, "
                  f"{group.committed} updates committed here, test accuracy {correct:.3f}", flush=True)
    return correct


def demo(args: argparse.Namespace) -> int:
    """A lighthouse here, two groups; one dies after --lose-at updates and is started again."""
    os.environ.setdefault("RUST_LOG", "error")  # TorchFT's Rust side logs every quorum at INFO (read at its import)
    from torchft.coordination import LighthouseServer

    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=2000, heartbeat_timeout_ms=1000)
    command = [sys.executable, __file__, "--lighthouse", lighthouse.address(), "--epochs", str(args.epochs),
               "--target", str(args.target), "--checkpoints", args.checkpoints, "--compute-s", str(args.compute_s)]
    try:
        groups = {"group0": subprocess.Popen([*command, "--id", "group0"]),
                  "group1": subprocess.Popen([*command, "--id", "group1", "--lose-at", str(args.lose_at)])}
        if groups["group1"].wait() == -signal.SIGKILL:
            time.sleep(1)
            print("group1 was lost; starting it again", flush=True)
            groups["group1"] = subprocess.Popen([*command, "--id", "group1"])
        codes = [process.wait() for process in groups.values()]
    finally:
        lighthouse.shutdown()
    return max(codes, key=abs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lighthouse", help="the lighthouse's address (default: $TORCHFT_LIGHTHOUSE)")
    parser.add_argument("--id", default=os.environ.get("REPLICA_GROUP_ID"), help="this replica group's name")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--lose-at", type=int, default=-1, help="SIGKILL this group after that many updates")
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--checkpoints", default=str(Path("checkpoints") / "torchft_digits"))
    parser.add_argument("--compute-s", type=float, default=0.0,
                        help="seconds each micro-batch sleeps, as a bigger model's compute would take (--demo: 0.03)")
    parser.add_argument("--demo", action="store_true", help="a lighthouse and two groups here, one lost")
    args = parser.parse_args()
    if args.demo:
        args.lose_at = 20 if args.lose_at < 0 else args.lose_at
        args.compute_s = args.compute_s or 0.03  # so that the run lasts while the lost group comes back
        sys.exit(demo(args))
    correct = train(args)
    if correct < args.target:
        print(f"{args.id}: test accuracy {correct:.3f} is under the target {args.target}", flush=True)
        sys.exit(21)


if __name__ == "__main__":
    main()
