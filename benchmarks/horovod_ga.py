"""Time per update: aikit's Horovod GA against Horovod's own ``backward_passes_per_step``.

    python benchmarks/horovod_ga.py [--np 2] [--steps 4] [--updates 30]

Relaunches itself under ``horovodrun -np N -H localhost:N --gloo``. Both sides train the same
MLP on synthetic data with ``steps`` micro-batches per update: aikit's
``horovod.DistributedOptimizer`` (local accumulation; during the last backward, buckets of final
gradients start their all-reduce), the same with ``bucket_cap_mb=None`` (one all-reduce after
the backward: what the overlap gains), and a hand-written loop over
``hvd.DistributedOptimizer(backward_passes_per_step=steps)`` (loss divided by ``steps``,
per-parameter all-reduces started from backward hooks). Updates alternate between the three so
all see the same machine load; rank 0 prints the medians and their ratios.
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
    import horovod.torch as hvd
    import torch

    from aikit.elastic.Torch import horovod

    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    def mlp() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                   torch.nn.ReLU(), torch.nn.Linear(1024, 10))

    x, y = torch.randn(steps * micro, 256), torch.randint(0, 10, (steps * micro,))
    chunks = list(zip(x.split(micro), y.split(micro), strict=True))
    ours_model, theirs_model, whole_model = mlp(), mlp(), mlp()
    ours = horovod.DistributedOptimizer(torch.optim.SGD(ours_model.parameters(), lr=0.01), steps)
    whole = horovod.DistributedOptimizer(torch.optim.SGD(whole_model.parameters(), lr=0.01), steps,
                                         bucket_cap_mb=None)
    theirs = hvd.DistributedOptimizer(torch.optim.SGD(theirs_model.parameters(), lr=0.01),
                                      named_parameters=theirs_model.named_parameters(), backward_passes_per_step=steps)

    def update_ours() -> None:
        for xb, yb in chunks:
            torch.nn.functional.cross_entropy(ours_model(xb), yb).backward()
            ours.step()

    def update_whole() -> None:
        for xb, yb in chunks:
            torch.nn.functional.cross_entropy(whole_model(xb), yb).backward()
            whole.step()

    def update_theirs() -> None:
        theirs.zero_grad()
        for xb, yb in chunks:
            (torch.nn.functional.cross_entropy(theirs_model(xb), yb) / steps).backward()
        theirs.step()

    times: dict[str, list[float]] = {"aikit": [], "aikit one all-reduce": [], "horovod": []}
    for i in range(updates + 3):  # 3 warm-up updates each
        for name, update in (("aikit", update_ours), ("aikit one all-reduce", update_whole),
                             ("horovod", update_theirs)):
            hvd.allreduce(torch.zeros(1), name=f"barrier.{name.replace(' ', '_')}.{i}")  # start together
            start = time.perf_counter()
            update()
            if i >= 3:
                times[name].append(time.perf_counter() - start)
    if hvd.rank() == 0:
        ours_ms, whole_ms, theirs_ms = (statistics.median(t) * 1e3 for t in times.values())
        print(f"{hvd.size()} ranks, {steps} micro-batches of {micro} per update, {updates} updates each, "
              f"{sum(p.numel() for p in ours_model.parameters()):,} parameters")
        print(f"median per update: aikit {ours_ms:.1f} ms, aikit one all-reduce {whole_ms:.1f} ms, "
              f"horovod backward_passes_per_step {theirs_ms:.1f} ms")
        print(f"ratio aikit / horovod: {ours_ms / theirs_ms:.3f} (one all-reduce: {whole_ms / theirs_ms:.3f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--updates", type=int, default=30)
    parser.add_argument("--micro", type=int, default=32)
    args = parser.parse_args()
    if "HOROVOD_RANK" in os.environ:
        return worker(args.steps, args.updates, args.micro)
    horovodrun = Path(sys.executable).parent / "horovodrun"
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    command = [str(horovodrun), "-np", str(args.np), "-H", f"localhost:{args.np}", "--gloo", sys.executable,
               __file__, *sys.argv[1:]]
    sys.exit(subprocess.call(command, env=env))


if __name__ == "__main__":
    main()
