"""Train a small CNN on the embedded digits with aikit choosing the global batch while training.

The AdaptiveSampler starts at --ref-batch-size and its goodput controller (Pollux/AdaptDL's
throughput x statistical efficiency) moves the global batch between updates as the measured
gradient noise scale grows; the AdaptiveOptimizer accumulates the micro-batches, measures the
noise from their gradients, all-reduces once per update and scales the LR by AdaScale's gain.
Every change is logged; the batches the run took are written as a trace that replays it with
TraceSampler, and a plot shows batch, noise scale and LR over the run.

    python examples/adaptive_digits.py --plot adaptive.png --trace-out adaptive_trace.csv
    python examples/adaptive_digits.py --max-device-batch 256   # the per-device batch grows too
    torchrun --standalone --nproc-per-node 2 examples/adaptive_digits.py

Exits with code 21 when the final test accuracy is under --target (by default 0.9 for a run of the
default 4 epochs or more; a shorter one, such as `--epochs 1` for a quick look, only reports it).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import TensorDataset

from aikit.datasets import digits
from aikit.elastic.Torch import AdaptiveOptimizer, AdaptiveSampler

FULL_EPOCHS, TARGET = 4, 0.9  # the accuracy a full run must reach (1 epoch reaches about 0.85)


def model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 10), nn.LogSoftmax(dim=1),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=FULL_EPOCHS)
    parser.add_argument("--ref-batch-size", type=int, default=32, help="global batch the LR is tuned for (the start)")
    parser.add_argument("--max-batch", type=int, default=512)
    parser.add_argument("--micro-batch", type=int, default=16, help="samples per device per micro-batch")
    parser.add_argument("--max-device-batch", type=int,
                        help="instead of --micro-batch: the per-device batch grows with the global batch up to this")
    parser.add_argument("--lr", type=float, default=0.05, help="LR at --ref-batch-size")
    parser.add_argument("--rule", default="adascale", choices=["adascale", "sqrt", "linear", "constant"])
    parser.add_argument("--hold-after", type=int,
                        help="hold the batch from the update that starts at this many samples on (nothing more "
                             "decided or measured)")
    parser.add_argument("--plot", help="save the batch / noise scale / LR plot here (PNG)")
    parser.add_argument("--trace-out", help="write the batches taken as a step,batchsize trace here")
    parser.add_argument("--target", type=float,
                        help=f"least acceptable final test accuracy (default: {TARGET} from {FULL_EPOCHS} epochs on, "
                             "none for a shorter run)")
    args = parser.parse_args()
    target = args.target if args.target is not None else TARGET if args.epochs >= FULL_EPOCHS else 0.0

    logging.basicConfig(level=logging.INFO, format="%(message)s")  # one line per batch change
    if "WORLD_SIZE" in os.environ:  # launched by torchrun: one replica per process
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    x_train, y_train, x_test, y_test = digits()
    data = TensorDataset(torch.as_tensor(x_train), torch.as_tensor(y_train))
    with warnings.catch_warnings():  # 1,437 images: each epoch leaves the last few (< one micro-batch) out
        warnings.simplefilter("ignore")
        per_device = ({"micro_batch": args.micro_batch} if args.max_device_batch is None
                      else {"max_device_batch": args.max_device_batch})
        sampler = AdaptiveSampler(data, ref_batch_size=args.ref_batch_size, max_batch=args.max_batch,
                                  hold_after=args.hold_after, **per_device)
    net = model()
    optimizer = AdaptiveOptimizer(torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9), sampler, args.rule)
    loader = sampler.loader(data)
    master = sampler.rank == 0
    if master:
        print(f"{sampler.num_replicas} replica(s), {len(data)} training images, global batch "
              f"{args.ref_batch_size}..{args.max_batch} in micro-batches of "
              f"{args.micro_batch if args.max_device_batch is None else f'up to {args.max_device_batch}'}, "
              f"LR rule {args.rule}")

    accuracy = 0.0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        optimizer.set_epoch(epoch)
        net.train()
        for x, y in loader:
            nn.functional.nll_loss(net(x), y).backward()
            optimizer.step()  # accumulates, or all-reduces, measures the noise, updates and re-plans
        net.eval()
        with torch.no_grad():
            accuracy = (net(torch.as_tensor(x_test)).argmax(1) == torch.as_tensor(y_test)).double().mean().item()
        if master:
            last = optimizer.history[-1]
            updates = len(optimizer.epoch_schedule)
            print(f"epoch {epoch}: {updates} updates, global batch now {sampler.controller.batch}, "
                  f"noise scale {last['noise_scale']:.0f}, lr {last['lr']:.4g}, test accuracy {accuracy:.3f}",
                  flush=True)
    if master and args.trace_out:
        sampler.write_trace(args.trace_out)
        print(f"trace of {len(sampler.controller.batches)} updates written to {args.trace_out}")
    if master and args.plot:
        from aikit.plot_adaptive import plot_adaptive

        plot_adaptive(optimizer.history, args.plot, title="aikit adaptive batch: digits",
                      held_from=sampler.schedule.held_from)
        print(f"plot written to {args.plot}")
    if dist.is_initialized():
        dist.destroy_process_group()
    if accuracy < target:
        print(f"final test accuracy {accuracy:.3f} is under the target {target}", file=sys.stderr)
        return 21
    return 0


if __name__ == "__main__":
    sys.exit(main())
