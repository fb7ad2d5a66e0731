"""Train on the embedded digits with Ray Train's elastic workers, the global batch kept.

Ray Train (``ScalingConfig(num_workers=(min, max))``) starts the worker group again whenever a
worker is lost or more become available, each worker running the training function from the
top. There ``ElasticState.restore()`` loads the last commit re-planned for the workers there
are: every update trains the trace's global batch, on the same samples, at the same LR, whatever
the count. On one machine this starts a local Ray cluster (one node) and SIGKILLs one worker after
--lose-at updates (0: none); Ray restarts the group and the run goes on from the last commit. That
is a restart, not a resize: the lost worker's CPU is free again at once, so Ray starts the same 2
workers ("resumed commit 5, saved by 2 worker(s), now 2"). A resize, the count changing, needs nodes
that come and go: a cluster of your own (the second line), or tests/ray/test_ray_elastic.py and
benchmarks/resize_ray.py, which lose and add the nodes of a local ``ray.cluster_utils.Cluster``:

    python examples/ray_elastic_digits.py
    python examples/ray_elastic_digits.py --address auto --workers 2 8 --storage /mnt/shared/ray --lose-at 0

The second line joins a running cluster (``ray start``): --storage and --trace must then be on
storage every node mounts (the trace's path is resolved here, on the driver: Ray runs the workers in
directories of their own). A run of the same --name goes on from its last commit; an aikit refusal
(a trace that is not there) ends the run at once (``StopOnAikitError``) rather than Ray retrying it.
Exits with code 21 when the final test accuracy is under --target.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import ray
import torch
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aikit.integrations.ray import StopOnAikitError


def train_loop_per_worker(config: dict) -> None:
    """What every Ray worker runs, from the top at every (re)start."""
    from aikit.datasets import digits
    from aikit.elastic.Torch import CustomSampler, LinearRuleOptimizer
    from aikit.integrations.ray import ElasticState

    torch.manual_seed(0)
    x_train, y_train, x_test, y_test = digits()
    dataset = TensorDataset(torch.as_tensor(x_train), torch.as_tensor(y_train))
    sampler = CustomSampler(dataset, config["trace"], micro_batch=config["batch_size"])  # deals to Ray's world
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10), nn.LogSoftmax(dim=1))
    optimizer = LinearRuleOptimizer(torch.optim.SGD(net.parameters(), lr=config["lr"], momentum=0.9), sampler,
                                    ref_batch_size=config["ref_batch_size"])
    state = ElasticState(model=net, optimizer=optimizer)  # in <storage>/<name>/aikit
    state.restore()  # the last commit, re-planned for these workers (a fresh start if none)
    for epoch in state.epochs(config["epochs"]):
        for x, y in DataLoader(dataset, batch_sampler=sampler):
            nn.functional.nll_loss(net(x), y).backward()
            if optimizer.step():  # an update: this step's global batch is done
                state.commit()
                lose_one(config["lose_at"], optimizer.updates, state)
        correct = accuracy(net, x_test, y_test)
        if sampler.rank == 0:
            print(f"epoch {epoch} done by {sampler.num_replicas} worker(s), {optimizer.updates} updates, "
                  f"test accuracy {correct:.3f}", flush=True)
        state.report({"epoch": epoch, "accuracy": correct})  # the last commit to Ray: Result.checkpoint


def lose_one(lose_at: int, updates: int, state) -> None:
    """The demonstration's fault: on a fresh start, the last worker dies after ``lose_at`` updates."""
    world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
    if updates == lose_at and state.restored_from is None and rank == world - 1:
        print(f"losing worker {rank} of {world} after update {updates}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


def accuracy(net: nn.Module, x, y) -> float:
    net.eval()
    with torch.no_grad():
        correct = (net(torch.as_tensor(x)).argmax(1) == torch.as_tensor(y)).double().mean().item()
    net.train()
    return correct


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(Path(__file__).with_name("trace.csv").resolve()))
    parser.add_argument("--batch-size", type=int, default=16, help="micro-batch size")
    parser.add_argument("--lr", type=float, default=0.2, help="LR at --ref-batch-size")
    parser.add_argument("--ref-batch-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs=2, default=(1, 2), metavar=("MIN", "MAX"))
    parser.add_argument("--lose-at", type=int, default=5, help="SIGKILL a worker after this update (0: none)")
    parser.add_argument("--address", default=None, help="a running Ray cluster (default: start one here)")
    parser.add_argument("--storage", default="ray_elastic_digits_runs", help="RunConfig(storage_path)")
    parser.add_argument("--name", default="digits", help="RunConfig(name): the same name goes on from its commits")
    parser.add_argument("--target", type=float, default=0.9, help="least acceptable test accuracy")
    args = parser.parse_args()

    # Ray Train 2.60 patches print() in its workers, whose stdout is Ray's own stream, so each line
    # came out twice (the print, and Ray's logger): printed once, as the process prints it
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    if args.address is None:  # a cluster of its own ("local"), never one this machine runs already
        ray.init(address="local", num_cpus=args.workers[1], include_dashboard=False)
    else:
        ray.init(address=args.address)
    config = {"trace": str(Path(args.trace).resolve()), "batch_size": args.batch_size, "lr": args.lr,
              "ref_batch_size": args.ref_batch_size, "epochs": args.epochs, "lose_at": args.lose_at}
    trainer = TorchTrainer(
        train_loop_per_worker, train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=tuple(args.workers)),
        run_config=RunConfig(storage_path=os.path.abspath(args.storage), name=args.name,
                             failure_config=FailureConfig(max_failures=3), callbacks=[StopOnAikitError()]))
    result = trainer.fit()
    ray.shutdown()
    if result.metrics is None:  # a run of this name that had finished: nothing left to train
        print(f"run {args.name!r} had trained its {args.epochs} epochs already: give another --name")
        return 0
    final = result.metrics["accuracy"]
    print(f"final test accuracy {final:.3f}; Ray's checkpoint: {result.checkpoint.path}")
    if final < args.target:
        print(f"final test accuracy {final:.3f} is under the target {args.target}", file=sys.stderr)
        return 21
    return 0


if __name__ == "__main__":
    sys.exit(main())
