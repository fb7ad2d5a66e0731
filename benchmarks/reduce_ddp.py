"""Time per update: aikit's reduce-at-update GA against DDP with ``no_sync`` accumulation.

    python benchmarks/reduce_ddp.py [--np 2] [--steps 4] [--updates 30]

Relaunches itself under ``torchrun --standalone --nproc-per-node N`` (gloo, CPU). Both sides
train the same MLP on synthetic data with ``steps`` micro-batches per update:

* ``reduce``: ``aikit.ga.Torch.optim.Optimizer(..., reduce=True)`` on the plain model (local
  accumulation; during the last backward, buckets of final gradients start their all-reduce);
* ``one all-reduce``: the same with ``bucket_cap_mb=None`` (one all-reduce after the backward:
  what the overlap gains);
* ``ddp no_sync``: the GA wrapper over a ``DistributedDataParallel`` model, whose
  ``accumulate(model)`` skips DDP's all-reduce on every micro-step but the last, where DDP's
  bucketed hooks overlap it with the backward.

Updates alternate between the two so both see the same machine load; rank 0 prints the
medians and their ratio (issue 12 aims at <= 1.05).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def worker(steps: int, updates: int, micro: int) -> None:
    import torch
    import torch.distributed as dist

    from aikit.ga.Torch.optim import Optimizer

    dist.init_process_group("gloo")
    torch.set_num_threads(1)

    def mlp() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                   torch.nn.ReLU(), torch.nn.Linear(1024, 10))

    torch.manual_seed(dist.get_rank())
    x, y = torch.randn(steps * micro, 256), torch.randint(0, 10, (steps * micro,))
    chunks = list(zip(x.split(micro), y.split(micro), strict=True))
    plain, whole, ddp = mlp(), mlp(), torch.nn.parallel.DistributedDataParallel(mlp())
    reducing = Optimizer(torch.optim.SGD(plain.parameters(), lr=0.01), steps, reduce=True)
    reducing_whole = Optimizer(torch.optim.SGD(whole.parameters(), lr=0.01), steps, reduce=True, bucket_cap_mb=None)
    no_sync = Optimizer(torch.optim.SGD(ddp.parameters(), lr=0.01), steps)

    def update_reduce() -> None:
        for xb, yb in chunks:
            torch.nn.functional.cross_entropy(plain(xb), yb).backward()
            reducing.step()

    def update_whole() -> None:
        for xb, yb in chunks:
            torch.nn.functional.cross_entropy(whole(xb), yb).backward()
            reducing_whole.step()

    def update_ddp() -> None:
        for xb, yb in chunks:
            with no_sync.accumulate(ddp):
                torch.nn.functional.cross_entropy(ddp(xb), yb).backward()
            no_sync.step()

    times: dict[str, list[float]] = {"reduce": [], "one all-reduce": [], "ddp no_sync": []}
    for i in range(updates + 3):  # 3 warm-up updates each
        for name, update in (("reduce", update_reduce), ("one all-reduce", update_whole),
                             ("ddp no_sync", update_ddp)):
            dist.barrier()  # start together
            start = time.perf_counter()
            update()
            if i >= 3:
                times[name].append(time.perf_counter() - start)
    for a, b, c in zip(plain.parameters(), whole.parameters(), ddp.module.parameters(), strict=True):
        assert torch.equal(a, b)  # the overlap changes no bit
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-6)  # the same training as DDP
    if dist.get_rank() == 0:
        ours_ms, whole_ms, ddp_ms = (statistics.median(t) * 1e3 for t in times.values())
        print(f"{dist.get_world_size()} processes (gloo), {steps} micro-batches of {micro} per update, "
              f"{updates} updates each, {sum(p.numel() for p in plain.parameters()):,} parameters")
        print(f"median per update: reduce-at-update {ours_ms:.1f} ms, one all-reduce {whole_ms:.1f} ms, "
              f"DDP no_sync {ddp_ms:.1f} ms")
        print(f"ratio reduce-at-update / DDP no_sync: {ours_ms / ddp_ms:.3f} (one all-reduce: "
              f"{whole_ms / ddp_ms:.3f})")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--updates", type=int, default=30)
    parser.add_argument("--micro", type=int, default=32)
    args = parser.parse_args()
    if "LOCAL_RANK" in os.environ:
        return worker(args.steps, args.updates, args.micro)
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.np),
               __file__, *sys.argv[1:]]
    sys.exit(subprocess.call(command, env=env))


if __name__ == "__main__":
    main()
