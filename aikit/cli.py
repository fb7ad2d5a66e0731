"""The ``aikit`` command: plans and batch-size traces from the shell.

aikit plan --global-batch-size 256 --max-device-batch 64 [--gpus N] [--policy ragged]
aikit trace check trace.csv --micro-batch 32 --replicas 8 --dataset-size 60000
(--max-gpu-batch-size, the name of Run:AI's AIkit Elastic, says the same as --max-device-batch)
aikit trace plot trace.csv -o trace.png [--dataset-size 60000]
aikit trace make ramp --start 64 --end 1024 --steps 500 -o trace.csv
aikit trace make schedule "0:768 250B:1536 500B:3072" --seq-length 4096 --tokens 1T -o trace.csv
aikit trace make rampup 16 8 300000 --global-batch-size 1024 --samples 1M -o trace.csv
aikit trace make stages --batch 1024 --samples 10M -o trace.csv
aikit trace make seesaw --start 64 --max-batch 512 --cosine --samples 1M -o trace.csv
aikit trace check --schedule "0:768 250B:1536" --seq-length 4096 --tokens 1T --micro-batch 4 --dataset-size ...

Numbers are read as ASCII digits only (Python's ``int()`` also takes ``6_4`` and Arabic-Indic
digits, and reads them as 64); sample and token counts take Megatron's K, M, B, T suffixes.
"""

from __future__ import annotations

import argparse
import math
import re
import sys

import numpy as np

import aikit
from aikit.core import frontier, ramp
from aikit.core import plan as plan_module
from aikit.core import trace as trace_module
from aikit.core.batch_schedule import trace_steps
from aikit.core.errors import AikitError, InvalidValue
from aikit.core.scaling import cosine_decay, step_decay
from aikit.core.schedule import Schedule, checked_settings, schedule_problems
from aikit.core.trace import Trace, TraceExhaustedError, load_trace, schedule_trace
from aikit.core.validate import checked_float, checked_int, non_negative_int, positive_int, writable_file
from aikit.optional import require
from aikit.runtime.originals import either


def whole_number(text: str) -> int:
    """An integer option in ASCII digits (argparse's ``int`` reads ``6_4`` and ``٦٤`` as 64)."""
    if not re.fullmatch(r"[+-]?[0-9]+", text.strip(), re.ASCII):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number written in ASCII digits")
    return int(text)


def amount(text: str) -> int:
    """A count of samples or tokens: ASCII digits with Megatron's K, M, B or T suffix (``10M``)."""
    try:
        return ramp.parse_amount(text, "count", "the option")[0]
    except AikitError as error:
        raise argparse.ArgumentTypeError(str(error).replace("the option: count ", "")) from None


def plan_rows(args: argparse.Namespace) -> tuple[str, int]:
    """The table's text and how many of its rows were refused."""
    positive_int(args.global_batch_size, "--global-batch-size")
    bound, name = either("max_gpu_batch_size", args.max_device_batch, args.max_gpu_batch_size, flags=True)
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
        micro = str(p.device_batch) if p.is_even else f"{p.device_batch - 1}..{p.device_batch}"
        note = "" if p.is_even else "ragged: micro-batches differ by one sample, weighted exactly"
        if p.num_replicas < n:
            note = f"{n - p.num_replicas} device(s) idle: an even split needs fewer"
        rows.append(f"{n:>4}  {p.num_replicas:>4}  {p.micro_steps:>8}  {micro:>11}  {p.samples_per_update:>6}  {note}")
        if args.gpus is not None:
            rows += ["", p.summary()]
    return "\n".join(rows), refused


def cmd_plan(args: argparse.Namespace) -> int:
    """Exit status 1 when a device count's plan is refused (policy 'error' with an uneven split)."""
    text, refused = plan_rows(args)
    print(text)
    return 1 if refused else 0


def checked_trace(args: argparse.Namespace) -> tuple[Trace, ramp.BatchSchedule | None]:
    """The trace ``check`` and ``plot`` read: the CSV file, or the steps of ``--schedule``."""
    if (args.trace is None) == (args.schedule is None):
        raise InvalidValue("give a trace file or --schedule 'threshold:batch ...' (a batch-size schedule), one of them")
    if args.schedule is None:
        for name in ("seq_length", "unit", "steps", "samples", "tokens"):
            if getattr(args, name) is not None:
                raise InvalidValue(f"--{name.replace('_', '-')} describes a --schedule; a trace file holds its steps")
        return load_trace(args.trace, args.when_exhausted, strict_steps=args.strict_steps), None
    if args.steps is not None:
        trace_steps(args.steps, "--steps")  # refused by its name, before the steps are made
    schedule = ramp.threshold_schedule(args.schedule, seq_length=args.seq_length, unit=args.unit)
    return schedule_trace(schedule, steps=args.steps, samples=args.samples, tokens=args.tokens,
                          when_exhausted=args.when_exhausted), schedule


def cmd_trace_check(args: argparse.Namespace) -> int:
    non_negative_int(args.show_epochs, "--show-epochs")  # -1 listed nothing and said nothing
    micro, micro_name = args.micro_batch, "--micro-batch"
    if (micro is None) == (args.max_device_batch is None):
        raise InvalidValue(f"give {micro_name} (one micro-batch size) or --max-device-batch (each step split "
                           "evenly, as an adaptive run's trace replays), one of them")
    for option in ("noise_every", "noise_until"):
        if getattr(args, option) is not None and args.max_device_batch is None:
            flag = "--" + option.replace("_", "-")
            raise InvalidValue(f"{flag} splits steps that --max-device-batch would run whole: give --max-device-batch")
    grown = {"max_device_batch": args.max_device_batch, "noise_every": args.noise_every,
             "noise_until": args.noise_until}
    for option, value in {micro_name: micro, "--max-device-batch": args.max_device_batch,
                          "--noise-every": args.noise_every}.items():
        if value is not None:
            positive_int(value, option)  # 0 refused, as TraceSampler refuses it
    if args.noise_until is not None:
        non_negative_int(args.noise_until, "--noise-until")
    trace, batch_schedule = checked_trace(args)
    sizes = trace.sizes
    print(f"{trace}: {len(sizes)} steps, {sum(sizes.tolist())} samples, batch sizes {sizes.min()}..{sizes.max()}")
    if batch_schedule is not None:
        print_stages(batch_schedule, sizes)
    micro, name = micro or 1, micro_name[2:].replace("-", "_")  # problems name it as TraceSampler's argument
    checked_settings(args.dataset_size, args.replicas, args.max_device_batch or micro,
                     bound=args.max_device_batch is not None, name=name)  # refused as TraceSampler does
    problems = schedule_problems(trace, args.dataset_size, args.replicas, micro, args.balanced, **grown, name=name)
    if not problems:
        fixed = None if args.max_device_batch is not None else micro  # one of the two, as TraceSampler takes them
        schedule = Schedule(trace, args.dataset_size, args.replicas, fixed, balanced=args.balanced, **grown)
        try:
            schedule.epoch(0)  # as TraceSampler does when it is built: the trace must cover its first epoch
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

    trace, schedule = checked_trace(args)
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.step(range(len(trace)), trace.sizes, where="post", label="global batch size")
    if schedule is not None:
        before = np.concatenate(([0], np.cumsum(trace.sizes)))
        for number, threshold in enumerate(schedule.thresholds[1:].tolist(), start=2):
            step = int(np.searchsorted(before, threshold))  # the first step after the threshold's samples
            if step < len(trace):
                ax.axvline(step, color="tab:orange", lw=0.8, ls=":", label="schedule entry" if number == 2 else None)
    if args.dataset_size:
        schedule = Schedule(trace, args.dataset_size, 1, math.gcd(*trace.sizes.tolist()))
        for e in range(int(min(schedule.full_epochs(), 1000))):
            end = schedule.epoch_bounds(e)[1]
            ax.axvline(end, color="grey", lw=0.5, ls="--", label="epoch end" if e == 0 else None)
    ax.set(xlabel="step", ylabel="global batch size", title=f"batch-size trace {trace.source}"[:90])
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")
    return 0


def print_stages(schedule: ramp.BatchSchedule, sizes: np.ndarray) -> None:
    """Where each entry of ``schedule`` starts over the steps ``sizes``."""
    per = f", seq_length {schedule.seq_length}" if schedule.seq_length else ""
    print(f"schedule {schedule} (thresholds in {schedule.unit}{per}):")
    for line in schedule.stages(sizes):
        print(f"  {line}")


def multiple_of(value: int, multiple: int, name: str) -> int:
    """``value`` if it is a multiple of ``--multiple-of``, else the error naming the nearest."""
    if value % multiple:
        below, above = value // multiple * multiple, -(-value // multiple) * multiple
        raise InvalidValue(f"{name} {value} is not a multiple of --multiple-of {multiple}: use "
                           f"{f'{below} or ' if below else ''}{above}")
    return value


def made_schedule(args: argparse.Namespace) -> ramp.BatchSchedule:
    """The schedule ``trace make schedule|rampup|stages|seesaw`` describes."""
    fits = {"micro_batch": args.micro_batch, "world": args.world}
    if args.kind == "schedule":
        return ramp.threshold_schedule(args.spec, seq_length=args.seq_length, unit=args.unit, **fits)
    if args.kind == "rampup":
        return ramp.rampup(args.rampup_batch_size, args.global_batch_size, **fits)
    if args.kind == "stages":
        if args.samples is None and args.tokens is None:
            raise InvalidValue("the stages are fractions of the budget: give it with --samples or --tokens")
        budget, unit = (args.samples, "samples") if args.samples is not None else (args.tokens, "tokens")
        stages = [stage.split(":") for stage in args.stage] if args.stage else ramp.NANOCHAT_STAGES
        if any(len(stage) != 2 for stage in stages):
            raise InvalidValue(f"--stage takes BATCH_FRACTION:BUDGET_FRACTION (e.g. 1/4:3%), got {args.stage}")
        return ramp.staged_schedule(args.batch, budget, stages, unit=unit, seq_length=args.seq_length, **fits)
    if (args.cosine is None) == (args.milestones is None):
        raise InvalidValue("give the LR decay Seesaw follows: --cosine SAMPLES (cosine over that many samples) or "
                           "--milestones SAMPLES ... (step decay), one of them")
    decay = cosine_decay(args.cosine) if args.cosine is not None else step_decay(args.milestones, args.gamma)
    return ramp.seesaw_schedule(args.start, decay, max_batch=args.max_batch, **fits)


def cmd_trace_make(args: argparse.Namespace) -> int:
    writable_file(args.output, "give a file name with -o")
    if args.steps is not None:
        trace_steps(args.steps, "--steps")  # refused by its name, before a list of that many is made
    if args.kind in ("constant", "ramp", "steps"):
        checked_int(args.multiple_of, "--multiple-of", 1, None, "a positive integer",  # 0: a division by zero
                    "every batch size is a multiple of it; 1 (the default) allows any")
    if args.kind == "steps":
        checked_float(args.factor, "--factor", "a finite number above 0", lambda f: math.isfinite(f) and f > 0,
                      "the batch is multiplied by it every --every steps (up to --end), e.g. --factor 2")
    schedule = None
    if args.kind == "constant":
        trace = trace_module.constant(multiple_of(args.start, args.multiple_of, "--start"), args.steps)
    elif args.kind == "ramp":
        for name in ("start", "end"):
            multiple_of(getattr(args, name), args.multiple_of, f"--{name}")
        trace = trace_module.linear_ramp(args.start, args.end, args.steps, args.ramp_steps, args.multiple_of)
    elif args.kind == "steps":
        multiple_of(args.start, args.multiple_of, "--start")
        if args.end is not None:
            multiple_of(args.end, args.multiple_of, "--end")
        trace = trace_module.step_increase(args.start, args.factor, args.every, args.steps, args.end, args.multiple_of)
    else:
        schedule = made_schedule(args)
        tokens = args.tokens if args.kind != "stages" or args.seq_length is not None else None
        samples = args.samples if tokens is None else None
        trace = schedule_trace(schedule, steps=args.steps, samples=samples, tokens=tokens)
    trace.to_csv(args.output)
    print(f"wrote {args.output}: {len(trace)} steps, batch sizes {trace.sizes.min()}..{trace.sizes.max()}")
    if schedule is not None:
        print_stages(schedule, trace.sizes)
    return 0


def run_point(text: str) -> tuple[int, float]:
    """A fixed-batch run as ``BATCH:UPDATES`` (updates to the target; ``BATCH:-``: never reached it)."""
    batch, _, updates = text.partition(":")
    if not re.fullmatch(r"[0-9]+", batch, re.ASCII) or not re.fullmatch(r"-|[0-9]+", updates, re.ASCII):
        raise argparse.ArgumentTypeError(f"{text!r} is not BATCH:UPDATES (e.g. 128:504, or 512:- for a run that "
                                         "never reached the target)")
    return int(batch), math.inf if updates == "-" else float(updates)


def cmd_frontier(args: argparse.Namespace) -> int:
    if (args.per_update is None) != (args.per_sample is None):
        raise InvalidValue("give both --per-update and --per-sample (seconds), or neither")
    runs = sorted(args.runs)
    fit = frontier.fit_frontier([b for b, _ in runs], [s for _, s in runs])
    print(f"fixed-batch frontier through {len(runs)} runs: S_min {fit.min_updates:.0f} updates, E_min "
          f"{fit.min_samples:.0f} samples, critical batch {fit.critical_batch:.0f}")
    print(" batch  updates   samples  excess")
    for batch, updates in runs:
        print(f"{batch:6d} {updates:8.0f} {batch * updates:9.0f} {fit.excess(updates, batch * updates):7.2f}")
    if args.per_update is not None:
        cost = frontier.UpdateCost(args.per_update, args.per_sample)
        best = fit.best_batch(cost)
        seconds = cost.seconds(best) * fit.updates(best)
        print(f"at {cost.per_update * 1e3:.3g} ms an update + {cost.per_sample * 1e6:.3g} us a sample: the "
              f"time-optimal fixed batch is {best:.0f} ({fit.updates(best):.0f} updates, {seconds:.3g} s on the "
              "frontier)")
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="aikit", description="Elastic batch sizes: plans and traces.")
    top.add_argument("--version", action="version", version=f"aikit {aikit.__version__}")
    sub = top.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="GA steps and micro-batches for 1..8 devices (or --gpus N)")
    p.add_argument("--global-batch-size", type=whole_number, required=True)
    p.add_argument("--max-device-batch", type=whole_number, help="the most samples one device holds (required)")
    p.add_argument("--max-gpu-batch-size", type=whole_number, help="the same, by Run:AI's AIkit Elastic's name")
    p.add_argument("--gpus", type=whole_number, help="plan for this many devices only (default: table for 1..8)")
    p.add_argument("--policy", choices=plan_module.POLICIES, default="ragged")
    p.set_defaults(run=cmd_plan)

    f = sub.add_parser("frontier", help="the fixed-batch frontier through a grid's runs, and the time-optimal batch")
    f.add_argument("runs", nargs="+", type=run_point, metavar="BATCH:UPDATES",
                   help="each fixed batch's updates to the same target at its tuned LR ('-': never reached)")
    f.add_argument("--per-update", type=float, help="seconds an update costs whatever its batch ...")
    f.add_argument("--per-sample", type=float, help="... and per sample: the time-optimal fixed batch at that cost")
    f.set_defaults(run=cmd_frontier)

    t = sub.add_parser("trace", help="check, plot or make a step,batchsize trace").add_subparsers(
        dest="action", required=True
    )
    c = t.add_parser("check", help="epochs, steps, samples and every problem of a trace")
    source_options(c)
    c.add_argument("--micro-batch", type=whole_number, help="samples per micro-batch, fixed")
    c.add_argument("--max-device-batch", type=whole_number,
                   help="instead: each step split evenly in micro-batches of at most this (an adaptive run's trace)")
    c.add_argument("--noise-every", type=whole_number,
                   help="with --max-device-batch: every k-th step in two halves at least")
    c.add_argument("--noise-until", type=whole_number,
                   help="with --noise-every: only the steps before this one (where an adaptive run held its batch)")
    c.add_argument("--replicas", type=whole_number, default=1)
    c.add_argument("--dataset-size", type=whole_number, required=True)
    c.add_argument("--balanced", action="store_true", help="require multiples of micro-batch x replicas (XLA)")
    c.add_argument("--when-exhausted", choices=trace_module.EXHAUSTION_POLICIES, default=None)
    c.add_argument("--strict-steps", action="store_true",
                   help="refuse a step column that restarts or skips (default: read sizes in file order, warn)")
    c.add_argument("--show-epochs", type=whole_number, default=20, help="epochs to list (default 20)")
    c.set_defaults(run=cmd_trace_check)

    pl = t.add_parser("plot", help="draw the batch-size schedule to a PNG")
    source_options(pl)
    pl.add_argument("-o", "--output", default="trace.png")
    pl.add_argument("--dataset-size", type=whole_number, help="also mark where each epoch starts")
    pl.add_argument("--when-exhausted", choices=trace_module.EXHAUSTION_POLICIES, default=None)
    pl.add_argument("--strict-steps", action="store_true", help="refuse a step column that restarts or skips")
    pl.set_defaults(run=cmd_trace_plot)

    make = t.add_parser("make", help="write a trace: constant, ramp or step increase in steps, or a schedule in "
                                     "samples or tokens (schedule, rampup, stages, seesaw)")
    kinds = make.add_subparsers(dest="kind", required=True)
    make.set_defaults(run=cmd_trace_make)
    m = kinds.add_parser("constant", help="one batch size")
    m.add_argument("--start", type=whole_number, required=True, help="the batch size")
    in_steps(m)
    m = kinds.add_parser("ramp", help="batch size rising linearly over steps")
    m.add_argument("--start", type=whole_number, required=True, help="first batch size")
    m.add_argument("--end", type=whole_number, required=True, help="last batch size")
    m.add_argument("--ramp-steps", type=whole_number, help="ramp length (default: whole trace)")
    in_steps(m)
    m = kinds.add_parser("steps", help="batch size multiplied every so many steps (Smith et al.)")
    m.add_argument("--start", type=whole_number, required=True, help="first batch size")
    m.add_argument("--end", type=whole_number, help="largest batch size")
    m.add_argument("--factor", type=float, default=2.0, help="multiply by this ...")
    m.add_argument("--every", type=whole_number, default=100, help="... every this many steps")
    in_steps(m)

    m = kinds.add_parser("schedule", help="Megatron-LM's --step-batch-size-schedule 'THRESHOLD:BATCH ...'")
    m.add_argument("spec", help="e.g. '0:768 250B:1536 500B:3072' (K, M, B, T suffixes)")
    m.add_argument("--seq-length", type=whole_number, help="tokens per sample: thresholds count tokens")
    m.add_argument("--unit", choices=ramp.UNITS, help="what thresholds count (default: tokens with --seq-length)")
    in_units(m)
    m = kinds.add_parser("rampup", help="NeMo's rampup_batch_size: START INCREMENT SAMPLES")
    m.add_argument("rampup_batch_size", type=amount, nargs=3, metavar=("START", "INCREMENT", "SAMPLES"))
    m.add_argument("--global-batch-size", type=whole_number, required=True, help="the batch after the ramp")
    in_units(m)
    m = kinds.add_parser("stages", help="nanochat's staged ramp: 1/4 then 1/2 of the batch over the first 3%% "
                                        "and 7%% of the budget, then the whole batch")
    m.add_argument("--batch", type=whole_number, required=True, help="the whole batch, after the stages")
    m.add_argument("--stage", action="append", metavar="BATCH_FRACTION:BUDGET_FRACTION",
                   help="a stage, e.g. 1/4:3%% (repeat it; default: nanochat's 1/4:3%% 1/2:7%%)")
    m.add_argument("--seq-length", type=whole_number, help="tokens per sample, with --tokens")
    in_units(m)
    m = kinds.add_parser("seesaw", help="Seesaw: the batch doubles where an LR decay over samples would halve the LR")
    m.add_argument("--start", type=whole_number, required=True, help="the base batch")
    m.add_argument("--max-batch", type=whole_number, required=True, help="the batch stops growing here")
    m.add_argument("--cosine", type=amount, metavar="SAMPLES", help="cosine decay over this many samples")
    m.add_argument("--milestones", type=amount, nargs="+", metavar="SAMPLES", help="step decay at these samples")
    m.add_argument("--gamma", type=float, default=0.5, help="step decay: the LR's factor at each milestone")
    in_units(m)
    return top


def source_options(command: argparse.ArgumentParser) -> None:
    """A trace file, or a batch-size schedule and its length (``check`` and ``plot``)."""
    command.add_argument("trace", nargs="?", help="a step,batchsize CSV file (or give --schedule)")
    command.add_argument("--schedule", help="instead: a schedule 'THRESHOLD:BATCH ...' (Megatron's, as trace make "
                                            "prints it) and its length (--steps, --samples or --tokens)")
    command.add_argument("--seq-length", type=whole_number, help="tokens per sample: the schedule counts tokens")
    command.add_argument("--unit", choices=ramp.UNITS, help="what the thresholds count")
    length_options(command)


def length_options(command: argparse.ArgumentParser) -> None:
    length = command.add_mutually_exclusive_group()
    length.add_argument("--steps", type=whole_number, help="trace length in steps")
    length.add_argument("--samples", type=amount, help="... or in samples (e.g. 10M)")
    length.add_argument("--tokens", type=amount, help="... or in tokens (e.g. 1T; needs --seq-length)")


def in_steps(command: argparse.ArgumentParser) -> None:
    """Options of the kinds that count steps."""
    command.add_argument("--steps", type=whole_number, required=True, help="trace length")
    command.add_argument("--multiple-of", type=whole_number, default=1,
                         help="sizes are multiples of this (--start and --end must be)")
    command.add_argument("-o", "--output", default="trace.csv")


def in_units(command: argparse.ArgumentParser) -> None:
    """Options of the kinds that count samples or tokens."""
    length_options(command)
    command.add_argument("--micro-batch", type=whole_number, default=1,
                         help="every batch must be whole micro-batches of this ...")
    command.add_argument("--world", type=whole_number, default=1, help="... on every one of this many replicas")
    command.add_argument("-o", "--output", default="trace.csv")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except (AikitError, ValueError, TypeError, OSError, ModuleNotFoundError) as error:
        print(f"aikit: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
