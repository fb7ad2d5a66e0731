"""Reading a fault test's worker logs back: which samples each committed step trained on.

A step can be logged more than once: by an incarnation of the job that was killed before it
committed the step, and again by the next incarnation, which resumed from the last commit and
redid it. What the finished run trained on is, for each step, the records of the last
incarnation that logged it. Incarnations are ordered by the id rank 0 gave them at restore
(its clock at that moment), so a later one has a larger id.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from resize_common import EPOCHS, MINIBATCH, SEED, N, digits_subset, max_difference, reference, trace

from aikit.core.schedule import Schedule

HERE = Path(__file__).parent
WORKER = HERE / "resize_worker.py"


def prepare(run_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    x, y = digits_subset()
    run_dir.mkdir(parents=True, exist_ok=True)
    np.savez(run_dir / "data.npz", x=x, y=y)
    return x, y


def worker_env() -> dict[str, str]:
    """The launchers' environment. TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with torchrun's shared
    store a node joining a running job waits for ever for MASTER_ADDR (pytorch#135712)."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def records(run_dir: Path) -> list[dict]:
    out = []
    for path in sorted((run_dir / "logs").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):  # a killed worker's last line may be cut short
                out.append(json.loads(line))
    return out


def wait_for(predicate, run_dir: Path, timeout: float, procs=(), what: str = "") -> list[dict]:
    """Poll the logs until ``predicate(records)`` holds; fail early if a launcher died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        recs = records(run_dir)
        if predicate(recs):
            return recs
        for proc in procs:
            if proc.poll() is not None:
                raise AssertionError(f"launcher exited with {proc.returncode} while waiting for {what}:\n"
                                     f"{tail(run_dir)}")
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}:\n{tail(run_dir)}")


def tail(run_dir: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(run_dir.glob("*.log")))


def commits(recs: list[dict]) -> list[dict]:
    return [r for r in recs if r["event"] == "commit"]


def trained_steps(recs: list[dict]) -> dict[tuple[int, int], dict]:
    """For each (epoch, step): the world size and the sample ids per rank of the incarnation
    whose training of that step the finished run kept."""
    by_step: dict[tuple[int, int], dict[int, dict]] = defaultdict(dict)
    for r in recs:
        if r["event"] == "micro":
            entry = by_step[r["epoch"], r["step"]].setdefault(r["inc"], {"world": r["world"], "ids": defaultdict(list)})
            entry["ids"][r["rank"]].extend(r["ids"])
    return {key: incs[max(incs)] for key, incs in by_step.items()}


def check_accounting(recs: list[dict]) -> dict[tuple[int, int], dict]:
    """Every step of every epoch trained once on exactly its global batch, every sample of an
    epoch seen once, and every rank of the step's world took its share."""
    schedule = Schedule(trace(), N, 1, MINIBATCH, SEED)
    steps = trained_steps(recs)
    expected_keys = {(e, s) for e in range(EPOCHS) for s in range(len(schedule.epoch(e)))}
    assert set(steps) == expected_keys, f"steps trained {sorted(steps)} != {sorted(expected_keys)}"
    for epoch in range(EPOCHS):
        plan = schedule.epoch(epoch)
        seen: list[int] = []
        for step in range(len(plan)):
            entry = steps[epoch, step]
            ids = [i for rank_ids in entry["ids"].values() for i in rank_ids]
            assert sorted(ids) == sorted(plan.step_indices(step).tolist()), f"epoch {epoch} step {step}"
            expected_ranks = set(range(min(entry["world"], len(plan.step_indices(step)) // MINIBATCH)))
            assert set(entry["ids"]) == expected_ranks, f"epoch {epoch} step {step}: ranks {sorted(entry['ids'])}"
            seen += ids
        assert len(seen) == len(set(seen)) == plan.samples, f"epoch {epoch}: a sample lost or repeated"
    return steps


def check_final_weights(run_dir: Path, x: np.ndarray, y: np.ndarray, steps_total: int) -> float:
    final = torch.load(run_dir / "final.pt")
    assert final["updates"] == steps_total
    difference = max_difference(final["model"], reference(x, y))
    assert difference < 1e-8, f"final weights differ from the uninterrupted big-batch run by {difference}"
    return difference


def stop(procs: list[subprocess.Popen]) -> None:
    """Kill what a failed test left running (our own launchers and their workers only)."""
    for proc in procs:
        if proc.poll() is None:
            for child in _children(proc.pid):
                _kill(child)
            _kill(proc.pid)
            proc.wait(timeout=10)


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out] + [g for p in out for g in _children(int(p))]


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, 9)
