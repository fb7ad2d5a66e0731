"""XLA:CPU SPMD data parallel: updates per second on 1, 2 and 4 devices, and what a long trace
of changing batch sizes costs in compilations.

Runs in .venv-xla (torch 2.9.0 + torch_xla 2.9.0, scripts/install_xla.sh); every device count
is its own process (``CPU_NUM_DEVICES`` is read once, when the XLA runtime starts):

    nice -n 10 .venv-xla/bin/python benchmarks/xla_spmd.py
    nice -n 10 .venv-xla/bin/python benchmarks/xla_spmd.py --devices 1 2 --trace-steps 200

1. Compilations, in a fresh process: a 1,000-step trace of 8 distinct global batches (1..8
   micro-steps) trained with aikit (every micro-step one shape) and, side by side, with each
   step's whole batch in one forward (one shape per distinct size): compile count after 100
   steps and at the end, and total compile time, from ``torch_xla.debug.metrics``.
2. Throughput: LinearRuleOptimizer through a constant trace of global batch 128, 32 samples per
   device per micro-step (4 micro-steps per update on 1 device, 2 on 2, 1 on 4), an MLP on
   synthetic data; the median over rounds of the time per update, after a warm-up epoch.

The virtual CPU devices share this machine's cores: more devices split the same arithmetic,
they do not add compute, so this measures the SPMD overhead, not a speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MICRO, GLOBAL, FEATURES, CLASSES = 32, 128, 64, 10


def child(devices: int, rounds: int, updates: int, trace_steps: int) -> dict:
    import numpy as np
    import torch
    import torch_xla
    import torch_xla.debug.metrics as met
    import torch_xla.runtime as xr
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from aikit.elastic.Torch import CustomSampler, LinearRuleOptimizer, spmd

    xr.use_spmd()
    mesh = spmd.data_mesh()
    assert xr.global_runtime_device_count() == devices
    device = torch_xla.device()
    gen = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(8192, FEATURES, generator=gen), torch.randint(0, CLASSES, (8192,), generator=gen))

    def new_model(seed):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(FEATURES, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                             nn.Linear(256, CLASSES)).to(device)

    def model_and_optimizer(trace, seed=0):
        model = new_model(seed)
        sampler = CustomSampler(data, trace, micro_batch=MICRO, when_exhausted="cycle")
        optimizer = LinearRuleOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), sampler,
                                        ref_batch_size=GLOBAL)
        return model, sampler, optimizer

    def train(model, sampler, optimizer, epoch, stop_after, marks=None):
        """Up to ``stop_after`` updates of ``epoch``; ``marks[n]`` gets the compile count after
        the ``n``-th update since training began."""
        sampler.set_epoch(epoch)
        optimizer.set_epoch(epoch)
        done = 0
        for x, y in spmd.loader(DataLoader(data, batch_sampler=sampler), mesh):
            nn.functional.cross_entropy(model(x), y).backward()
            if optimizer.step():
                done += 1
                if marks is not None and optimizer.updates in marks:
                    marks[optimizer.updates] = met.metric_data("CompileTime")[0]
                if done == stop_after:
                    break
        torch_xla.sync(wait=True)
        return done

    result = {}

    # 1. compilations over a long trace of 8 distinct sizes in a fresh process, aikit against whole-batch steps
    unit = MICRO * devices
    sizes = (np.random.default_rng(1).integers(1, 9, size=trace_steps) * unit).tolist()
    assert len(set(sizes)) == 8
    for name in ("aikit", "whole batch"):
        met.clear_all()
        start, steps, epoch, marks = time.perf_counter(), 0, 0, {100: None}
        if name == "aikit":
            model, sampler, optimizer = model_and_optimizer(sizes, seed=1)
            while steps < trace_steps:
                steps += train(model, sampler, optimizer, epoch, trace_steps - steps, marks)
                epoch += 1
            after_100 = marks[100]
        else:
            model = new_model(seed=1)
            sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            x_all, y_all = data.tensors
            offset = 0
            for step, size in enumerate(sizes):
                if offset + size > len(data):
                    offset = 0
                x, y = spmd.shard((x_all[offset:offset + size], y_all[offset:offset + size]), mesh)
                offset += size
                nn.functional.cross_entropy(model(x), y).backward()
                for group in sgd.param_groups:
                    group["lr"] = 0.05 * size / GLOBAL
                sgd.step()
                sgd.zero_grad()
                torch_xla.sync()
                if step + 1 == 100:
                    after_100 = met.metric_data("CompileTime")[0]
            torch_xla.sync(wait=True)
        count, total_ns, _ = met.metric_data("CompileTime")[:3]
        result[name] = {"compiles_after_100_steps": after_100, "compiles": count,
                        "compile_seconds": total_ns / 1e9, "wall_seconds": time.perf_counter() - start}

    # 2. throughput at a constant global batch (its graphs are compiled by now but for the update's)
    model, sampler, optimizer = model_and_optimizer(GLOBAL)
    train(model, sampler, optimizer, 0, updates)  # warm-up: compiles
    seconds = []
    for r in range(rounds):
        start = time.perf_counter()
        train(model, sampler, optimizer, r + 1, updates)
        seconds.append((time.perf_counter() - start) / updates)
    per_update = statistics.median(seconds)
    result.update(devices=devices, updates_per_s=1 / per_update, samples_per_s=GLOBAL / per_update,
                  micro_steps_per_update=GLOBAL // (MICRO * devices))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--updates", type=int, default=20, help="updates per timed round")
    parser.add_argument("--trace-steps", type=int, default=1000)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.rounds, args.updates, args.trace_steps)))
        return
    results = []
    for devices in args.devices:
        env = {"TF_CPP_MIN_LOG_LEVEL": "2", **os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": str(devices),
               "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        command = [sys.executable, __file__, "--child", str(devices), "--rounds", str(args.rounds),
                   "--updates", str(args.updates), "--trace-steps", str(args.trace_steps)]
        print(f"running {devices} device(s) ...", file=sys.stderr, flush=True)
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
        if done.returncode:
            sys.exit(f"{devices} device(s) failed:\n{done.stderr[-3000:]}")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"SPMD on XLA:CPU, global batch {GLOBAL}, {MICRO} per device per micro-step (medians of {args.rounds})")
    print(f"{'devices':>7} {'micro-steps':>11} {'updates/s':>10} {'samples/s':>10}")
    for r in results:
        print(f"{r['devices']:>7} {r['micro_steps_per_update']:>11} {r['updates_per_s']:>10.1f} "
              f"{r['samples_per_s']:>10.0f}")
    print(f"\n{args.trace_steps}-step trace, 8 distinct global batches (1..8 micro-steps)")
    print(f"{'devices':>7} {'loop':>12} {'compiles@100':>12} {'compiles':>8} {'compile s':>9} {'wall s':>7}")
    for r in results:
        for name in ("aikit", "whole batch"):
            c = r[name]
            print(f"{r['devices']:>7} {name:>12} {c['compiles_after_100_steps']:>12} {c['compiles']:>8} "
                  f"{c['compile_seconds']:>9.2f} {c['wall_seconds']:>7.1f}")


if __name__ == "__main__":
    main()
