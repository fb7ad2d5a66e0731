"""What a lost or returning replica costs under TorchFT, next to aikit's restart-based resize under
torchrun's elastic agent, and what TorchFT's manager costs an update.

**Faults** (``--only faults``): two TorchFT replica groups of one process each
(tests/torchft/ft_worker.py: a float64 MLP, the trace path, each micro-batch 50 ms longer than its
compute) on an in-process lighthouse (heartbeat 1 s, join timeout 2 s). One group is SIGKILLed in
the middle of an update, in another run between two updates; timed from the kill to the survivor's
next committed update. A group relaunched after the survivor's ninth update is timed from its
launch to its first committed update with the healed state (the survivor waits for it between two
updates, so that the run does not end first: it asks for its next quorum once the new group has
joined the lighthouse, as it would at its next update). Beside them, the same faults
under torchrun's elastic agent (benchmarks/resize_ray.py's runs: two one-worker nodes, aikit's
``ElasticState`` restore after every restart): a node lost, a node added. Every run is checked
(every update equal to the one-process big batch, each sample once). It also prints the global
batch TorchFT's own averaging would have trained in the updates of the run with one group lost
(its ``DistributedSampler`` keeps each group's shard; the average is over the groups there are).

**Overhead** (``--only overhead``): two processes train the GA wrapper (``reduce=True``) on a CPU MLP
(float32, 2 x 1024 hidden, 256 and 1024 samples an update in micro-batches of 64), the same samples dealt
by the same UpdateSampler, under TorchFT (a ReplicaGroup: its quorum, ``Manager.allreduce`` and
``should_commit`` every update) and under torchrun (aikit's own all-reduce over torch.distributed's
gloo). Paired and interleaved: each round runs both, in alternating order; an update's wall time,
its main thread's CPU time and its process's, medians of each run, then of the rounds; and what
TorchFT adds an update, in milliseconds (a fixed cost: the ratio falls as updates grow). Goal:
TorchFT / torchrun <= 1.05.

    python benchmarks/resize_torchft.py [--runs 3] [--only faults|torchrun|overhead]   # all three by default
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / part) for part in ("torchft", "", "resize", "ray")] + [str(ROOT / "benchmarks")]
UPDATES, WARMUP, M, WIDTH = 40, 5, 64, 1024


# ---- faults ---------------------------------------------------------------------------------

def events(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.endswith("}")] if log.exists() else []


def wait(log: Path, test, timeout: float = 300) -> list[dict]:
    ends = time.monotonic() + timeout
    while time.monotonic() < ends:
        rows = events(log)
        if any(test(row) for row in rows):
            return rows
        time.sleep(0.02)
    raise TimeoutError(f"{log}: nothing matched within {timeout} s")


def commits_of(rows: list[dict]) -> list[dict]:
    return [row for row in rows if row["event"] == "update" and row["committed"]]


def faults_run(scratch: Path, where: str) -> tuple[float, tuple[float, float], float, list[int]]:
    """One run: b killed ``where`` ("in" or "after" update 3), b2 relaunched; returns (stall, (rejoin,
    of which after it joined the lighthouse), a normal update's seconds, the groups of every update)."""
    import ft_checks
    from torchft.coordination import LighthouseServer

    from conftest import Groups  # tests/torchft's: its groups as processes

    scratch.mkdir(parents=True)
    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=2000, heartbeat_timeout_ms=1000)
    run = Groups(scratch, lighthouse.address(), "trace")
    try:
        common = ("--epochs", 8, "--slow-s", 0.05)
        run.start("a", *common, "--pause-after", 8, "--pause-s", 300, "--resume", scratch / "resume")
        run.start("b", *common, f"--pause-{where}", 3, "--pause-s", 120)
        run.begin("a", "b")
        run.wait_for("b", "paused", position=3)
        run.signal("b", signal.SIGKILL)
        run.wait_for("a", "paused", position=8)  # a trains on alone until b2 can join (its next quorum takes it in)
        launched = time.time()
        run.start("b2", *common, together=False)
        run.wait_for("b2", "ready", timeout=300)
        (scratch / "resume").touch()
        joined = wait(run.log("b2"), lambda row: row["event"] == "update" and row["committed"])
        first = min(row["time"] for row in commits_of(joined))
        rejoin = first - launched, first - next(row["time"] for row in joined if row["event"] == "ready")
        run.finish("a", "b2")
        updates = ft_checks.check_exact(run, ("a", "b", "b2"), epochs=8)
        a = commits_of(run.events("a"))
        stall = ft_checks.stall(run, "a", "b")
        normal = statistics.median(later["time"] - row["time"] for row, later in itertools.pairwise(a[:4]))
        return stall, rejoin, normal, [len(updates[p]) for p in sorted(updates)]
    finally:
        run.stop_all()
        lighthouse.shutdown()


def torchrun_runs(scratch: Path, runs: int) -> list[tuple[float, float]]:
    from resize_ray import torchrun_run

    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests" / "resize"), str(ROOT / "tests")])
    return [torchrun_run(scratch / f"torchrun{run}") for run in range(runs)]


def faults(scratch: Path, runs: int, with_torchrun: bool) -> None:
    import ft_common

    rows: dict[str, list[tuple]] = {"in": [], "after": []}
    groups = None
    for run in range(runs):
        for where in ("in", "after"):
            stall, rejoin, normal, groups_of = faults_run(scratch / f"ft_{where}{run}", where)
            rows[where].append((stall, rejoin, normal))
            groups = groups_of if where == "in" else groups
            print(f"TorchFT run {run + 1}, killed {where} update 3: next committed update {stall:.2f} s after the kill "
                  f"(an update: {normal:.2f} s), relaunch to its first update {rejoin[0]:.1f} s ({rejoin[1]:.2f} s "
                  "after it joined the lighthouse)", flush=True)
    torchrun = torchrun_runs(scratch, runs) if with_torchrun else []
    for down, up in torchrun:
        print(f"torchrun c10d run: node lost {down:.1f} s, node added {up:.1f} s", flush=True)
    med = statistics.median
    print(f"\nseconds to the first update after the fault, medians of {runs} run(s) ({os.cpu_count()} cores):")
    print(f"{'engine, fault':<52} {'lost':>7} {'added':>7}   (after joining; one update)")
    for where, label in (("in", "TorchFT, group SIGKILLed mid-update"),
                         ("after", "TorchFT, group SIGKILLed between updates")):
        each = rows[where]
        print(f"{label:<52} {med(r[0] for r in each):>7.2f} {med(r[1][0] for r in each):>7.1f}   "
              f"({med(r[1][1] for r in each):.2f} s; {med(r[2] for r in each):.2f} s)")
    if torchrun:
        print(f"{'torchrun c10d, aikit ElasticState restore (node)':<52} {med(d for d, _ in torchrun):>7.1f} "
              f"{med(u for _, u in torchrun):>7.1f}")
    batch = [len(ft_common.trace_schedule().epoch(e).step_indices(s)) for e in range(2)
             for s in range(len(ft_common.trace_schedule().epoch(e)))]
    groups = groups[:len(batch)]
    print("\nthe global batch of the first 14 updates of the last run killed mid-update (the groups in each quorum):")
    print("groups       ", " ".join(f"{n:>3}" for n in groups))
    print("aikit        ", " ".join(f"{b:>3}" for b in batch))
    print("TorchFT avg  ", " ".join(f"{b * n // 2:>3}" for b, n in zip(batch, groups, strict=True)))


# ---- overhead -------------------------------------------------------------------------------

def overhead_worker(engine: str, out: Path, lighthouse: str | None, G: int) -> None:
    """One process of the overhead runs: UPDATES updates of the GA wrapper, each timed."""
    import torch
    import torch.distributed as dist

    from aikit.elastic.Torch import ElasticState
    from aikit.elastic.Torch.fault_tolerance import ReplicaGroup
    from aikit.elastic.Torch.update_sampler import UpdateSampler
    from aikit.ga.Torch.optim import Optimizer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    x, y = torch.randn(G * UPDATES, 256), torch.randint(0, 10, (G * UPDATES,))
    net = torch.nn.Sequential(torch.nn.Linear(256, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH),
                              torch.nn.ReLU(), torch.nn.Linear(WIDTH, 10))
    optimizer = Optimizer(torch.optim.SGD(net.parameters(), lr=0.01), 1, reduce=True, global_batch_size=G)
    sampler = UpdateSampler(len(x), G, M, seed=0)
    times: list[tuple[float, ...]] = []  # (wall, main thread's CPU, the process's CPU) of each update

    def train(parts) -> None:
        for part in parts:
            with optimizer.accumulate(samples=len(part)):
                torch.nn.functional.cross_entropy(net(x[part]), y[part]).backward()
            optimizer.step()

    if engine == "torchrun":
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        for _ in range(UPDATES):
            started = time.perf_counter(), time.thread_time(), time.process_time()
            parts = [part.tolist() for part in sampler.micro_batches(2, rank)]
            optimizer.steps = len(parts)
            train(parts)
            sampler.advance()
            times.append((time.perf_counter() - started[0], time.thread_time() - started[1],
                          time.process_time() - started[2]))
        dist.destroy_process_group()
    else:
        rank = int(os.environ["GROUP"])
        state = ElasticState(out.parent / f"commits{rank}", model=net, optimizer=optimizer, samples=sampler)
        marks: list[tuple[float, float, float]] = []

        def mark(group, committed) -> None:
            marks.append((time.perf_counter(), time.thread_time(), time.process_time()))

        with ReplicaGroup(state, lighthouse, replica_id=f"g{rank}", host="127.0.0.1", on_update=mark,
                          verbose=False) as group:
            (out.parent / f"ready{rank}").touch()
            while not all((out.parent / f"ready{r}").exists() for r in range(2)):
                time.sleep(0.01)
            marks.append((time.perf_counter(), time.thread_time(), time.process_time()))
            for _ in group.epochs(1):
                for part in group.micro_batches():
                    with optimizer.accumulate(samples=len(part)):
                        torch.nn.functional.cross_entropy(net(x[part]), y[part]).backward()
                    optimizer.step()
        times = [tuple(y - x for x, y in zip(a, b, strict=True)) for a, b in itertools.pairwise(marks)]
    if rank == 0:
        out.write_text(json.dumps(times))


def overhead_run(scratch: Path, engine: str, batch: int) -> tuple[float, float, float]:
    scratch.mkdir(parents=True, exist_ok=True)
    out = scratch / f"{engine}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RUST_LOG": "error", "PYTHONPATH": str(ROOT)}
    me = [sys.executable, __file__, "--worker", engine, "--out", str(out), "--global-batch", str(batch)]
    if engine == "torchrun":
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                   __file__, "--worker", engine, "--out", str(out), "--global-batch", str(batch)]
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"torchrun exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    else:
        from torchft.coordination import LighthouseServer

        lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=2, join_timeout_ms=2000)
        try:
            procs = [subprocess.Popen([*me, "--lighthouse", lighthouse.address()], env={**env, "GROUP": str(rank)},
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for rank in range(2)]
            for proc in procs:
                if proc.wait(600):
                    raise RuntimeError(proc.stderr.read().decode()[-3000:])
        finally:
            lighthouse.shutdown()
    times = json.loads(out.read_text())[WARMUP:]
    return tuple(statistics.median(t[i] for t in times) for i in range(3))


def overhead(scratch: Path, rounds: int, batch: int) -> None:
    results: dict[str, list[tuple[float, float, float]]] = {"torchrun": [], "torchft": []}
    for round_ in range(rounds):
        for engine in (("torchrun", "torchft") if round_ % 2 == 0 else ("torchft", "torchrun")):
            results[engine].append(overhead_run(scratch / f"{engine}{batch}-{round_}", engine, batch))
            wall, thread, process = results[engine][-1]
            print(f"round {round_ + 1} {engine}: {wall * 1000:.1f} ms an update, {thread * 1000:.1f} ms of its main "
                  f"thread's CPU, {process * 1000:.1f} ms of the process's", flush=True)
    med = statistics.median
    wall = {engine: med(r[0] for r in runs) for engine, runs in results.items()}
    cpu = {engine: med(r[1] for r in runs) for engine, runs in results.items()}
    process = {engine: med(r[2] for r in runs) for engine, runs in results.items()}
    ratios = [ft[0] / tr[0] for ft, tr in zip(results["torchft"], results["torchrun"], strict=True)]
    print(f"\nan update of the GA wrapper ({batch} samples, micro-batches of {M}), two processes, medians of {rounds} "
          f"paired rounds ({UPDATES - WARMUP} updates each):")
    print(f"{'engine':<44} {'wall ms':>8} {'main CPU':>9} {'all CPU':>8}")
    for engine, label in (("torchrun", "torchrun (aikit's all-reduce over gloo)"),
                          ("torchft", "TorchFT (quorum, Manager.allreduce, commit)")):
        print(f"{label:<44} {wall[engine] * 1000:>8.1f} {cpu[engine] * 1000:>9.1f} {process[engine] * 1000:>8.1f}")
    print(f"TorchFT / torchrun: wall {wall['torchft'] / wall['torchrun']:.3f} (paired rounds: "
          f"{', '.join(f'{r:.3f}' for r in ratios)}), main-thread CPU {cpu['torchft'] / cpu['torchrun']:.3f}, "
          f"the process's CPU {process['torchft'] / process['torchrun']:.3f}; goal <= 1.05")
    print(f"TorchFT's cost an update: {(wall['torchft'] - wall['torchrun']) * 1000:+.1f} ms of wall time, "
          f"{(cpu['torchft'] - cpu['torchrun']) * 1000:+.1f} ms of the main thread's CPU, "
          f"{(process['torchft'] - process['torchrun']) * 1000:+.1f} ms of the process's\n", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", choices=("faults", "torchrun", "overhead"))
    parser.add_argument("--worker", choices=("torchrun", "torchft"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--lighthouse", help=argparse.SUPPRESS)
    parser.add_argument("--global-batch", type=int, nargs="+", default=[256, 1024],
                        help="the overhead runs' global batches (micro-batches of 64: 2 or 8 a process)")
    args = parser.parse_args()
    os.environ.setdefault("RUST_LOG", "error")  # TorchFT's Rust side logs every quorum at INFO
    if args.worker:
        overhead_worker(args.worker, Path(args.out), args.lighthouse, args.global_batch[0])
        return
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        if args.only in (None, "faults", "torchrun"):
            if args.only == "torchrun":
                for down, up in torchrun_runs(scratch, args.runs):
                    print(f"torchrun c10d: node lost {down:.1f} s, node added {up:.1f} s", flush=True)
            else:
                faults(scratch, args.runs, with_torchrun=args.only is None)
        if args.only in (None, "overhead"):
            for batch in args.global_batch:
                overhead(scratch, args.runs, batch)


if __name__ == "__main__":
    main()
