"""A Horovod elastic run going 2 -> 1 -> 2 workers with the GA wrapper's ``accumulate(samples=)``
(``horovodrun --min-np 1 --max-np 2 --host-discovery-script``, gloo, on localhost, the test
changing the host's slot count): ``hvd.elastic.TorchState`` saves, restores and syncs aikit's
``DistributedOptimizer`` whole, every update plans for the world it runs in, and the run ends at
the weights of one process taking one big-batch step per window (float64).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hvd_case import ELASTIC, reference

pytestmark = [pytest.mark.slow, pytest.mark.horovod]

HERE = Path(__file__).resolve().parent
HOROVODRUN = Path(sys.executable).parent / "horovodrun"


def set_slots(run_dir: Path, slots: int) -> None:
    """What the discovery script reports next: ``localhost:<slots>``."""
    (run_dir / "hosts.tmp").write_text(f"localhost:{slots}\n")
    os.replace(run_dir / "hosts.tmp", run_dir / "hosts.txt")


def updates(run_dir: Path) -> list[dict]:
    out = []
    for path in sorted((run_dir / "logs").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.endswith("}"):  # a worker killed mid-write leaves a cut line
                out.append(json.loads(line))
    return sorted(out, key=lambda r: r["t"])


def wait_until(predicate, run_dir: Path, proc: subprocess.Popen, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate(updates(run_dir)):
        if proc.poll() is not None:
            raise AssertionError(f"horovodrun exited with {proc.returncode} before {what}:\n{tail(run_dir)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {timeout} s:\n{tail(run_dir)}")
        time.sleep(0.1)


def tail(run_dir: Path) -> str:
    return (run_dir / "horovodrun.log").read_text()[-4000:]


def drive_2_1_2(proc: subprocess.Popen, run_dir: Path, allow: Callable[[int], None],
                kill: Callable[[], None]) -> list[float]:
    """Take the elastic run ``proc`` writes to ``run_dir`` from 2 workers to 1 and back
    (``allow(n)``: the discovery now offers ``n`` slots), let it finish without delays and check
    it (:func:`check_2_1_2_run`); ``kill`` stops it if it does not end. Returns when 1 worker was
    allowed, when 1 worker had trained 2 updates (and 2 were allowed again), and when 2 trained
    again."""
    marks = []
    try:
        wait_until(lambda u: sum(r["world"] == 2 and r["rank"] == 0 for r in u) >= 2, run_dir, proc,
                   "two updates by 2 workers")
        marks.append(time.time())
        allow(1)
        wait_until(lambda u: sum(r["world"] == 1 for r in u) >= 2, run_dir, proc, "two updates by 1 worker")
        marks.append(time.time())
        allow(2)
        wait_until(lambda u: u[-1]["world"] == 2, run_dir, proc, "an update by 2 workers again")
        marks.append(time.time())
        (run_dir / "fast").touch()  # the rest without delays
        assert proc.wait(timeout=120) == 0, tail(run_dir)
    finally:
        if proc.poll() is None:
            kill()
            proc.wait()
    check_2_1_2_run(run_dir)
    return marks


def check_2_1_2_run(run_dir: Path) -> None:
    """Every update made once (an update redone after a restore: its last record counts), by 2,
    then 1, then 2 workers, re-planned for 1, and the final weights equal the big-batch steps."""
    done: dict[int, dict] = {}
    for record in updates(run_dir):
        if record["rank"] == 0:
            done[record["update"]] = record
    assert sorted(done) == list(range(1, len(ELASTIC.windows) + 1))
    worlds = [done[u]["world"] for u in sorted(done)]
    phases = [w for i, w in enumerate(worlds) if i == 0 or w != worlds[i - 1]]
    assert phases == [2, 1, 2], f"worlds by update: {worlds}"
    assert {done[u]["steps"] for u in done if done[u]["world"] == 1} == {4}  # re-planned: [3, 3, 3, 2]
    final = torch.load(run_dir / "final.pt")
    for got, want in zip(final, reference(ELASTIC), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


def test_an_elastic_run_2_1_2_workers_equals_the_big_batch_steps(require_horovod, tmp_path):
    (tmp_path / "logs").mkdir()
    set_slots(tmp_path, 2)
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {tmp_path / 'hosts.txt'}\n")
    discover.chmod(0o755)
    command = [str(HOROVODRUN), "-np", "2", "--min-np", "1", "--max-np", "2", "--host-discovery-script",
               str(discover), "--gloo", "--network-interface", "lo", "--elastic-timeout", "60",
               sys.executable, str(HERE / "elastic_ga_worker.py"), str(tmp_path), "0.5", "1.0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{HERE}{os.pathsep}{HERE.parent.parent}"}
    with open(tmp_path / "horovodrun.log", "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    drive_2_1_2(proc, tmp_path, lambda slots: set_slots(tmp_path, slots), proc.kill)
