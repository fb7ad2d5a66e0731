"""What a sharded ElasticState commit and restore cost, next to a replicated one of the same model.

A model sharded with FSDP2 is committed by every rank (its shard file, raw bytes with a SHA-256 per
chunk) and rank 0 (the marker, once every shard is written); a replicated model by rank 0 alone
(one safetensors file). This script times both for an MLP (``--width`` 1024: 2.1 M float32
parameters, AdamW, 25 MB of state) on the workers torchrun starts, commits with and without
fsync and restores, and prints the medians (each the slowest rank's time).

    torchrun --standalone --nproc-per-node 2 benchmarks/resize_sharded.py [--repeats 10] [--width 1024]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from aikit.elastic.Torch import ElasticState
from aikit.ga.Torch.optim import Optimizer


def build(width: int, shard: bool) -> tuple[torch.nn.Module, Optimizer]:
    """The MLP and AdamW (in the GA wrapper) after one update, so that AdamW holds its state."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh(), torch.nn.Linear(width, width),
                              torch.nn.Tanh(), torch.nn.Linear(width, 10))
    if shard:
        for module in (net[0], net[2], net[4], net):
            fully_shard(module)
    opt = Optimizer(torch.optim.AdamW(net.parameters(), lr=1e-3), steps=1)
    with opt.accumulate(net):
        net(torch.randn(8, width)).square().mean().backward()
    opt.step()
    return net, opt


def slowest(seconds: float) -> float:
    """The slowest rank's time: an operation is done when every rank is."""
    box = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(box, op=dist.ReduceOp.MAX)
    return float(box)


def timed(operation) -> float:
    dist.barrier()
    start = time.perf_counter()
    operation()
    return slowest(time.perf_counter() - start)


def measure(directory: Path, width: int, shard: bool, fsync: bool, repeats: int) -> tuple[float, float, int]:
    """Median commit and restore seconds, and the bytes of one commit on disk."""
    net, opt = build(width, shard)
    state = ElasticState(directory, model=net, optimizer=opt, overwrite=True, fsync=fsync, verbose=False)
    commits = [timed(state.commit) for _ in range(repeats)]
    restores = []
    for _ in range(repeats):
        again = ElasticState(directory, model=net, optimizer=opt, fsync=fsync, verbose=False)
        restores.append(timed(again.restore))
    newest = max(directory.glob("aikit_state.*.safetensors"))
    size = newest.stat().st_size + sum(p.stat().st_size for p in directory.glob(newest.name.replace(
        "safetensors", "shards") + "/*"))
    return statistics.median(commits), statistics.median(restores), size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--width", type=int, default=1024)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    root = [tempfile.mkdtemp(prefix="aikit-sharded-") if rank == 0 else None]
    dist.broadcast_object_list(root)
    rows = []
    for shard in (True, False):
        for fsync in (True, False):
            directory = Path(root[0]) / f"{'sharded' if shard else 'replicated'}-{fsync}"
            commit, restore, size = measure(directory, args.width, shard, fsync, args.repeats)
            rows.append((("sharded, every rank" if shard else "replicated, rank 0"), fsync, commit, restore, size))
    if rank == 0:
        print(f"{world} workers, MLP width {args.width}, AdamW, medians of {args.repeats}")
        print(f"{'commit written by':<22} {'fsync':<6} {'commit ms':>10} {'restore ms':>11} {'MB':>6}")
        for who, fsync, commit, restore, size in rows:
            print(f"{who:<22} {fsync!s:<6} {commit * 1e3:>10.1f} {restore * 1e3:>11.1f} {size / 1e6:>6.1f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
