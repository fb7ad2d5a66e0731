"""How long a resize takes under Ray Train's elastic workers and under torchrun's elastic agent.

The same run (tests/resize/resize_worker.py: the digits MLP in float64, a trace optimizer, an
``ElasticState`` commit after every update) on two one-worker nodes of this machine, each fault
dealt the same way to both engines:

* **a node lost**: its worker SIGKILLed with its node (Ray: the node's raylet and agents;
  torchrun: the node's elastic agent), two updates into the run; timed from the kill to the first
  update of the worker left, alone;
* **a node added**: a new node (Ray: ``Cluster.add_node``; torchrun: a second agent started) while
  the worker left trains alone; timed from its start to the first update of the pair.

Ray runs ``ScalingConfig(num_workers=(1, 2))`` with tests/ray's settings
(``elastic_resize_monitor_interval_s=1``, ``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S=30``, node
health checks 3 x 1 s), torchrun ``--nnodes=1:2`` with tests/resize's rendezvous settings
(``last_call_timeout=1``, keep-alive 4 x 1 s). ``--ray-defaults`` runs Ray with its own defaults
instead (60 s start timeout and resize interval, 5 x 3 s health checks). Every run is checked
(each step once on its global batch, the weights of the big-batch run). Prints each run and the
medians side by side.

``--only report`` measures instead what one ``ray.train.report`` costs a worker next to one
``ElasticState.commit()`` (two workers on a local 2-CPU node, Ray's default settings): why the
commits are aikit's, in the run's storage, and Ray is handed one now and then.

    python benchmarks/resize_ray.py [--runs 3] [--ray-defaults] [--only ray|torchrun|report]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "resize"), str(ROOT / "tests" / "ray")]

from ray_cluster import (  # noqa: E402
    RAY_SETTINGS,
    WORKER_PATH,
    Fit,
    elastic_trainer,
    ray_settings,
    start_local,
    start_nodes,
)
from resize_checks import check_accounting, check_final_weights, commits, free_port, prepare, stop, wait_for  # noqa: E402
from resize_common import total_steps  # noqa: E402
from test_resize_torchrun import agent, finish  # noqa: E402  (its elastic agents, as the tests start them)


def committed(world: int, after: float):
    return lambda recs: any(c["world"] == world and c["t"] > after for c in commits(recs))


def first_update(recs: list[dict], world: int, after: float) -> float:
    return min(c["t"] for c in commits(recs) if c["world"] == world and c["t"] > after)


def checked(run_dir: Path, x, y) -> None:
    recs = wait_for(lambda r: True, run_dir, 1)
    steps = check_accounting(recs)
    assert {entry["world"] for entry in steps.values()} == {1, 2}, "the run did not train on 1 and on 2 workers"
    assert check_final_weights(run_dir, x, y, total_steps()) < 1e-9


def ray_run(nodes, run_dir: Path, monitor_s: float) -> tuple[float, float]:
    from ray_worker import trace_run

    x, y = prepare(run_dir)
    nodes.keep(2)
    fit = Fit(elastic_trainer(trace_run, run_dir, {"delay": 0.25, "solo_delay": 5.0 + monitor_s}, "bench",
                              monitor_s=monitor_s))
    recs = wait_for(lambda r: sum(c["world"] == 2 for c in commits(r)) >= 2, run_dir, 300, what="2 updates")
    rank1 = next(r["pid"] for r in recs if r["event"] == "start" and r["rank"] == 1 and r["world"] == 2)
    lost_at = time.time()
    nodes.lose(rank1)
    recs = wait_for(committed(1, lost_at), run_dir, 300, what="an update alone")
    down = first_update(recs, 1, lost_at) - lost_at
    added_at = time.time()
    nodes.add()
    recs = wait_for(committed(2, added_at), run_dir, 300, what="an update of the pair")
    up = first_update(recs, 2, added_at) - added_at
    fit.result(600)
    checked(run_dir, x, y)
    return down, up


def torchrun_run(run_dir: Path) -> tuple[float, float]:
    x, y = prepare(run_dir)
    port = free_port()
    procs = [agent(run_dir, port, "agent_a", "--solo-delay=4")]  # keeps the rendezvous; slow alone
    time.sleep(0.5)
    procs.append(agent(run_dir, port, "agent_b"))
    try:
        recs = wait_for(lambda r: sum(c["world"] == 2 for c in commits(r)) >= 2, run_dir, 120, procs, "2 updates")
        worker_b = next(r["pid"] for r in recs if r["ppid"] == procs[1].pid)
        lost_at = time.time()
        os.kill(worker_b, signal.SIGKILL)
        os.kill(procs[1].pid, signal.SIGKILL)
        procs.pop().wait()
        recs = wait_for(committed(1, lost_at), run_dir, 120, procs, "an update alone")
        down = first_update(recs, 1, lost_at) - lost_at
        added_at = time.time()
        procs.append(agent(run_dir, port, "agent_b2"))
        recs = wait_for(committed(2, added_at), run_dir, 120, procs, "an update of the pair")
        up = first_update(recs, 2, added_at) - added_at
        finish(procs, run_dir, timeout=180)
    finally:
        stop(procs)
    checked(run_dir, x, y)
    return down, up


def report_loop(config: dict) -> None:
    """Every worker: ``n`` times a commit, a bare ``ray.train.report`` and ``ElasticState.report``
    (a commit handed to Ray); rank 0 writes the seconds each took to ``config["out"]``."""
    import json

    import ray.train
    from resize_common import make_model, make_sgd

    from aikit.ga.Torch.optim import Optimizer
    from aikit.integrations.ray import ElasticState

    model = make_model()
    state = ElasticState(model=model, optimizer=Optimizer(make_sgd(model), 1), verbose=False)
    state.restore()
    seconds: dict[str, list[float]] = {"ElasticState.commit()": [], "ray.train.report(metrics)": [],
                                       "ElasticState.report(metrics)": []}
    for _ in range(config["n"]):
        for what, call in (("ElasticState.commit()", state.commit),
                           ("ray.train.report(metrics)", lambda: ray.train.report({"loss": 1.0})),
                           ("ElasticState.report(metrics)", lambda: state.report({"loss": 1.0}))):
            start = time.perf_counter()
            call()
            seconds[what].append(time.perf_counter() - start)
    if ray.train.get_context().get_world_rank() == 0:
        Path(config["out"]).write_text(json.dumps(seconds))


def report_cost(scratch: Path, n: int = 10) -> None:
    import json

    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    with ray_settings({"PYTHONPATH": WORKER_PATH, "OMP_NUM_THREADS": "1"}):
        start_local(2)
        try:
            TorchTrainer(report_loop, train_loop_config={"n": n, "out": str(scratch / "report.json")},
                         scaling_config=ScalingConfig(num_workers=2),
                         run_config=RunConfig(storage_path=str(scratch / "storage"), name="report")).fit()
        finally:
            ray.shutdown()
    seconds = json.loads((scratch / "report.json").read_text())
    print(f"\none call on rank 0 of 2 workers, Ray's default settings, medians of {n} (the first of each left out):")
    for what, each in seconds.items():
        print(f"{what:<30} {statistics.median(each[1:]) * 1000:8.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ray-defaults", action="store_true", help="Ray's own timeouts, not the tests'")
    parser.add_argument("--only", choices=("ray", "torchrun", "report"))
    args = parser.parse_args()
    os.environ["PYTHONPATH"] = WORKER_PATH  # torchrun's workers import the tests' helpers too
    times: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        if args.only == "report":
            report_cost(Path(scratch))
            return
        if args.only != "ray":
            times["torchrun c10d"] = []
            for run in range(args.runs):
                times["torchrun c10d"].append(torchrun_run(Path(scratch) / f"torchrun{run}"))
                print(f"torchrun run {run + 1}: node lost {times['torchrun c10d'][-1][0]:.1f} s, "
                      f"node added {times['torchrun c10d'][-1][1]:.1f} s", flush=True)
        if args.only != "torchrun":  # ray, or both
            label = "Ray Train (its defaults)" if args.ray_defaults else "Ray Train"
            settings = {k: v for k, v in RAY_SETTINGS.items() if not args.ray_defaults or not k.startswith("RAY_TRAIN")}
            with ray_settings(settings):
                nodes = start_nodes({}) if args.ray_defaults else start_nodes()
                times[label] = []
                try:
                    for run in range(args.runs):
                        times[label].append(ray_run(nodes, Path(scratch) / f"ray{run}", 60.0 if args.ray_defaults
                                                    else 1.0))
                        print(f"Ray run {run + 1}: node lost {times[label][-1][0]:.1f} s, "
                              f"node added {times[label][-1][1]:.1f} s", flush=True)
                finally:
                    nodes.shutdown()
    print(f"\nresize times on this machine ({os.cpu_count()} cores), medians of {args.runs} run(s), "
          "seconds to the first update in the new world:")
    print(f"{'engine':<26} {'node lost':>10} {'node added':>11}   each run (lost / added)")
    for label, runs in times.items():
        each = ", ".join(f"{down:.1f} / {up:.1f}" for down, up in runs)
        print(f"{label:<26} {statistics.median(d for d, _ in runs):>10.1f} "
              f"{statistics.median(u for _, u in runs):>11.1f}   {each}")


if __name__ == "__main__":
    main()
