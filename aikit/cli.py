"""The ``aikit`` command: plans and batch-size traces from the shell.

aikit plan --global-batch-size 256 --max-device-batch 64 [--gpus N] [--policy ragged]
aikit trace check trace.csv --micro-batch 32 --replicas 8 --dataset-size 60000
(--max-gpu-batch-size and --minibatch-size, the names of Run:AI's AIkit Elastic and eth-easl, say the same)
aikit trace plot trace.csv -o trace.png [--dataset-size 60000]
aikit trace make ramp --start 64 --end 1024 --steps 500 -o trace.csv
"""

from __future__ import annotations

import argparse
import math
import sys

import aikit
from aikit.core import plan as plan_module
from aikit.core import trace as trace_module
from aikit.core.errors import AikitError, InvalidValue
from aikit.core.schedule import Schedule, checked_settings, schedule_problems
from aikit.core.trace import TraceExhaustedError, load_trace
from aikit.core.validate import aliased, positive_int, writable_file
from aikit.optional import require


def plan_rows(args: argparse.Namespace) -> tuple[str, int]:
    """The table's text and how many of its rows were refused."""
    positive_int(args.global_batch_size, "--global-batch-size")
    bound, name = aliased(args.max_device_batch, args.max_gpu_batch_size, "--max-device-batch",
                          "--max-gpu-batch-size", "Run:AI's AIkit Elastic")
    if bound is None:
        raise InvalidValue("give --max-device-batch, the most samples one device holds")
    positive_int(bound, name)
    counts = [positive_int(args.gpus, "--gpus")] if args.gpus is not None else list(range(1, 9))
    refused = 0
    header = f"{'GPUs':>4}  {'used':>4}  {'GA steps':>8}  {'micro-batch':>11}  {'global':>6}  note"
    rows = [
        f"global batch {args.global_batch_size}, at most {bound} per device, policy {args.policy!r}",
        header,
    ]
    for n in counts:
        try:
            p = plan_module.make_plan(args.global_batch_size, bound, n, policy=args.policy)
        except ValueError as error:
            rows.append(f"{n:>4}  {'-':>4}  {'-':>8}  {'-':>11}  {'-':>6}  refused: {error}")
            refused += 1
            continue
        micro = str(p.batch_size) if p.is_even else f"{p.batch_size - 1}..{p.batch_size}"
        note = "" if p.is_even else "ragged: micro-batches differ by one sample, weighted exactly"
        if p.gpus < n:
            note = f"{n - p.gpus} device(s) idle: an even split needs fewer"
        rows.append(f"{n:>4}  {p.gpus:>4}  {p.steps:>8}  {micro:>11}  {p.samples_per_update:>6}  {note}")
        if args.gpus is not None:
            rows += ["", p.summary()]
    return "\n".join(rows), refused


def cmd_plan(args: argparse.Namespace) -> int:
    """Exit status 1 when a device count's plan is refused (policy 'error' with an uneven split)."""
    text, refused = plan_rows(args)
    print(text)
    return 1 if refused else 0


def cmd_trace_check(args: argparse.Namespace) -> int:
    trace = load_trace(args.trace, args.when_exhausted, strict_steps=args.strict_steps)
    sizes = trace.sizes
    print(f"{trace}: {len(sizes)} steps, {sum(sizes.tolist())} samples, batch sizes {sizes.min()}..{sizes.max()}")
    micro, micro_name = aliased(args.micro_batch, args.minibatch_size, "--micro-batch", "--minibatch-size", "eth-easl")
    if (micro is None) == (args.max_device_batch is None):
        raise InvalidValue(f"give {micro_name} (one micro-batch size) or --max-device-batch (each step split "
                           "evenly, as an adaptive run's trace replays), one of them")
    if args.noise_every is not None and args.max_device_batch is None:
        raise InvalidValue("--noise-every splits steps that --max-device-batch would run whole: "
                           "give --max-device-batch")
    grown = {"max_device_batch": args.max_device_batch, "noise_every": args.noise_every}
    for name, value in grown.items():
        if value is not None:
            positive_int(value, f"--{name.replace('_', '-')}")
    micro, name = micro or 1, micro_name[2:].replace("-", "_")  # problems name it as CustomSampler's argument
    checked_settings(args.dataset_size, args.replicas, args.max_device_batch or micro,
                     bound=args.max_device_batch is not None, name=name)  # refused as CustomSampler does
    problems = schedule_problems(trace, args.dataset_size, args.replicas, micro, args.balanced, **grown, name=name)
    if not problems:
        schedule = Schedule(trace, args.dataset_size, args.replicas, micro, balanced=args.balanced, **grown)
        try:
            schedule.epoch(0)  # as CustomSampler does when it is built: the trace must cover its first epoch
        except TraceExhaustedError as error:
            problems.append(str(error))
        full = schedule.full_epochs()
        epochs = range(min(full, args.show_epochs) if full != math.inf else args.show_epochs)
        print(f"full epochs of {args.dataset_size} samples: {full}")
        for e in epochs:
            ep = schedule.epoch(e)
            idle = int((ep.micro_batches_per_step < args.replicas).sum())
            print(
                f"  epoch {e}: steps {ep.first_step}..{ep.first_step + len(ep) - 1} ({len(ep)} steps), "
                f"{ep.samples} samples ({args.dataset_size - ep.samples} left out), "
                f"{idle} steps with idle replicas"
            )
        used = schedule.epoch_bounds(full - 1)[1] if trace.is_finite and full else 0
        if trace.is_finite and used < len(trace):
            rest = sum(trace.sizes[used:].tolist())
            mode = "trained" if trace.when_exhausted == "stop" else "used only with when_exhausted='stop'"
            print(f"  then a partial epoch: steps {used}..{len(trace) - 1}, {rest} samples ({mode})")
    for problem in problems:
        print(f"problem: {problem}")
    print(f"{len(problems)} problem(s)")
    return 1 if problems else 0


def cmd_trace_plot(args: argparse.Namespace) -> int:
    writable_file(args.output, "give a file name with -o")
    require("matplotlib", "aikit trace plot").use("Agg")
    import matplotlib.pyplot as plt

    trace = load_trace(args.trace)
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.step(range(len(trace)), trace.sizes, where="post", label="global batch size")
    if args.dataset_size:
        schedule = Schedule(trace, args.dataset_size, 1, math.gcd(*trace.sizes.tolist()))
        for e in range(int(min(schedule.full_epochs(), 1000))):
            end = schedule.epoch_bounds(e)[1]
            ax.axvline(end, color="grey", lw=0.5, ls="--", label="epoch end" if e == 0 else None)
    ax.set(xlabel="step", ylabel="global batch size", title=f"batch-size trace {args.trace}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")
    return 0


def cmd_trace_make(args: argparse.Namespace) -> int:
    writable_file(args.output, "give a file name with -o")
    if args.kind == "constant":
        trace = trace_module.constant(args.start, args.steps)
    elif args.kind == "ramp":
        trace = trace_module.linear_ramp(args.start, args.end, args.steps, args.ramp_steps, args.multiple_of)
    else:
        trace = trace_module.step_increase(args.start, args.factor, args.every, args.steps, args.end, args.multiple_of)
    trace.to_csv(args.output)
    print(f"wrote {args.output}: {len(trace)} steps, batch sizes {trace.sizes.min()}..{trace.sizes.max()}")
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="aikit", description="Elastic batch sizes: plans and traces.")
    top.add_argument("--version", action="version", version=f"aikit {aikit.__version__}")
    sub = top.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="GA steps and micro-batches for 1..8 devices (or --gpus N)")
    p.add_argument("--global-batch-size", type=int, required=True)
    p.add_argument("--max-device-batch", type=int, help="the most samples one device holds (required)")
    p.add_argument("--max-gpu-batch-size", type=int, help="the same, by Run:AI's AIkit Elastic's name")
    p.add_argument("--gpus", type=int, help="plan for this many devices only (default: table for 1..8)")
    p.add_argument("--policy", choices=plan_module.POLICIES, default="ragged")
    p.set_defaults(run=cmd_plan)

    t = sub.add_parser("trace", help="check, plot or make a step,batchsize trace").add_subparsers(
        dest="action", required=True
    )
    c = t.add_parser("check", help="epochs, steps, samples and every problem of a trace")
    c.add_argument("trace")
    c.add_argument("--micro-batch", type=int, help="samples per micro-batch, fixed")
    c.add_argument("--minibatch-size", type=int, help="the same, by eth-easl's name")
    c.add_argument("--max-device-batch", type=int,
                   help="instead: each step split evenly in micro-batches of at most this (an adaptive run's trace)")
    c.add_argument("--noise-every", type=int, help="with --max-device-batch: every k-th step in two halves at least")
    c.add_argument("--replicas", type=int, default=1)
    c.add_argument("--dataset-size", type=int, required=True)
    c.add_argument("--balanced", action="store_true", help="require multiples of micro-batch x replicas (XLA)")
    c.add_argument("--when-exhausted", choices=trace_module.EXHAUSTION_POLICIES, default=None)
    c.add_argument("--strict-steps", action="store_true",
                   help="refuse a step column that restarts or skips (default: read sizes in file order, warn)")
    c.add_argument("--show-epochs", type=int, default=20, help="epochs to list (default 20)")
    c.set_defaults(run=cmd_trace_check)

    pl = t.add_parser("plot", help="draw the batch-size schedule to a PNG")
    pl.add_argument("trace")
    pl.add_argument("-o", "--output", default="trace.png")
    pl.add_argument("--dataset-size", type=int, help="also mark where each epoch starts")
    pl.set_defaults(run=cmd_trace_plot)

    m = t.add_parser("make", help="write a constant, ramp or step-increase trace")
    m.add_argument("kind", choices=("constant", "ramp", "steps"))
    m.add_argument("--start", type=int, required=True, help="first batch size")
    m.add_argument("--end", type=int, help="last (ramp) or largest (steps) batch size")
    m.add_argument("--steps", type=int, required=True, help="trace length")
    m.add_argument("--ramp-steps", type=int, help="ramp length (default: whole trace)")
    m.add_argument("--factor", type=float, default=2.0, help="steps: multiply by this ...")
    m.add_argument("--every", type=int, default=100, help="steps: ... every this many steps")
    m.add_argument("--multiple-of", type=int, default=1, help="round sizes to multiples of this")
    m.add_argument("-o", "--output", default="trace.csv")
    m.set_defaults(run=cmd_trace_make)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except (AikitError, ValueError, TypeError, OSError, ModuleNotFoundError) as error:
        print(f"aikit: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
