"""What an ElasticState commit costs next to the update it follows.

A commit is one checkpoint file (with fsync and an atomic rename) on rank 0, so its cost does not
depend on the batch. What it is worth depends on the step: this script times updates of the
digits CNN of examples/elastic_resize_digits.py (global batch 128 as 8 micro-batches of 16,
one process) and commits of the same model and optimizer, with and without fsync,
interleaved, and prints the ratios of their medians.

    python benchmarks/resize_commit.py [--repeats 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from aikit.datasets import digits
from aikit.elastic.Torch import CustomSampler, ElasticState, LinearRuleOptimizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from elastic_resize_digits import model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x, y, _, _ = digits()
    x, y = torch.as_tensor(x), torch.as_tensor(y)
    sampler = CustomSampler(len(x), 128, micro_batch=16)
    net = model()
    opt = LinearRuleOptimizer(torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9), sampler, ref_batch_size=128)
    epoch, batches = 0, iter(sampler)
    update_s, commit_s, nosync_s = [], [], []
    with tempfile.TemporaryDirectory() as directory:
        state = ElasticState(Path(directory) / "a", model=net, optimizer=opt, verbose=False)
        nosync = ElasticState(Path(directory) / "b", model=net, optimizer=opt, verbose=False, fsync=False)
        for _ in range(args.repeats + 3):  # the first 3 warm up
            start = time.perf_counter()
            updated = False
            while not updated:
                idx = next(batches, None)
                if idx is None:  # the epoch is over: start the next one
                    epoch += 1
                    sampler.set_epoch(epoch)
                    opt.set_epoch(epoch)
                    batches = iter(sampler)
                    continue
                nn.functional.nll_loss(net(x[idx]), y[idx]).backward()
                updated = opt.step()
            middle = time.perf_counter()
            state.commit()
            end = time.perf_counter()
            nosync.commit()
            update_s.append(middle - start)
            commit_s.append(end - middle)
            nosync_s.append(time.perf_counter() - end)
        size = state.path.stat().st_size
    update, commit, fast = (statistics.median(times[3:]) for times in (update_s, commit_s, nosync_s))
    print(f"update (128 samples as 8 x 16):      median {update * 1e3:.2f} ms")
    print(f"commit ({size / 1024:.0f} KiB checkpoint):        median {commit * 1e3:.2f} ms")
    print(f"commit with fsync=False:             median {fast * 1e3:.2f} ms")
    print(f"commit / update = {commit / update:.3f}; with fsync=False {fast / update:.3f}")


if __name__ == "__main__":
    main()
