"""Cost of trace-driven sampling: planning epochs and dealing micro-batches.

A 1,000,000-sample data set, a 100,000-step trace of random global batches (multiples of the
32-sample micro-batch up to 4,096) and 8 replicas. Reports medians of repeated runs of
  * Schedule construction (trace validation) and planning one epoch (permutation + steps),
  * locating every epoch the trace covers,
  * CustomSampler's cost per micro-batch on one replica, side by side with torch's own
    DistributedSampler + BatchSampler over the same data set (the ratio is what to watch),
  * an adaptive run's schedule work per update (decide the next batch, read the epoch's view and
    this replica's micro-batches) at batch 32 on one device, near the end of the epoch's 31,250
    updates against its start. The views grow by appending, so what remains of the ratio is the
    vectorised passes over the epoch's updates (offsets, micro-batch counts): 3.5 here, against
    19 when each update rebuilt its epoch's view from the Python list of batches.

    python benchmarks/sampler.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from torch.utils.data import BatchSampler, DistributedSampler

from aikit.core.schedule import Schedule
from aikit.core.trace import Trace
from aikit.elastic.Torch import AdaptiveSampler, CustomSampler

DATASET, STEPS, MINIBATCH, REPLICAS = 1_000_000, 100_000, 32, 8


def median_seconds(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class Sized:
    def __len__(self) -> int:
        return DATASET


def adaptive_update_seconds(first: int, count: int) -> float:
    """Seconds per update of an adaptive run's schedule work for updates ``first..first+count-1``
    (the updates before are decided untimed)."""
    schedule = AdaptiveSampler(DATASET, ref_batch_size=MINIBATCH, max_batch=4096, max_device_batch=256, seed=0).schedule
    schedule.extend(first)
    start = time.perf_counter()
    for done in range(first + 1, first + count + 1):
        schedule.extend(done)
        plan = schedule.epoch(0)
        plan.counts(0)[done - 1], plan.micro_batches(done - 1, 0)
    return (time.perf_counter() - start) / count


def main() -> None:
    parser = argparse.ArgumentParser(description="trace sampler benchmark")
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    sizes = np.random.default_rng(0).integers(1, 129, size=STEPS) * MINIBATCH
    trace = Trace(sizes, source="benchmark")

    construct = median_seconds(lambda: Schedule(trace, DATASET, REPLICAS, MINIBATCH), repeats)
    plan_epoch = median_seconds(lambda: Schedule(trace, DATASET, REPLICAS, MINIBATCH).epoch(0), repeats)
    all_epochs = median_seconds(lambda: Schedule(trace, DATASET, REPLICAS, MINIBATCH).full_epochs(), repeats)
    epochs = Schedule(trace, DATASET, REPLICAS, MINIBATCH).full_epochs()

    sampler = CustomSampler(DATASET, trace, num_replicas=REPLICAS, rank=0, micro_batch=MINIBATCH, verbose=False)
    batches = len(sampler)
    ours = median_seconds(lambda: sum(1 for _ in sampler), repeats) / batches
    torch_sampler = DistributedSampler(Sized(), num_replicas=REPLICAS, rank=0, shuffle=True, seed=0)
    baseline = BatchSampler(torch_sampler, MINIBATCH, drop_last=True)
    theirs = median_seconds(lambda: sum(1 for _ in baseline), repeats) / len(baseline)

    print(f"data set {DATASET:,} samples, trace {STEPS:,} steps (batch 32..4096), {REPLICAS} replicas, "
          f"micro-batch {MINIBATCH}; medians of {repeats} runs")
    print(f"  Schedule construction (validate trace):   {construct * 1e3:8.2f} ms")
    print(f"  construct + plan epoch 0:                 {plan_epoch * 1e3:8.2f} ms")
    print(f"  construct + find every epoch:             {all_epochs * 1e3:8.2f} ms  ({epochs} epochs)")
    print(f"  CustomSampler per micro-batch (rank 0):   {ours * 1e6:8.2f} us  ({batches:,} micro-batches)")
    print(f"  torch DistributedSampler+BatchSampler:    {theirs * 1e6:8.2f} us  ({len(baseline):,} micro-batches)")
    print(f"  ratio CustomSampler / torch per micro-batch: {ours / theirs:.2f}")

    early = statistics.median(adaptive_update_seconds(0, 1000) for _ in range(repeats))
    late = statistics.median(adaptive_update_seconds(DATASET // MINIBATCH - 1250, 1000) for _ in range(repeats))
    print(f"  adaptive schedule per update, updates 0..999 of the epoch: {early * 1e6:8.2f} us")
    print(f"  adaptive schedule per update, updates 30,000..30,999:      {late * 1e6:8.2f} us")
    print(f"  ratio late / early: {late / early:.2f}")


if __name__ == "__main__":
    main()
