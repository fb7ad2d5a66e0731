"""Real faults under Horovod elastic (``horovodrun --min-np 1 --max-np 2 --host-discovery-script``,
gloo): two "hosts" on this machine, ``localhost`` and ``127.0.0.1``, one slot each. A worker is
SIGKILLed mid-epoch and its host leaves the discovery list, and the survivor goes on alone; or
a host is added mid-run and a new worker joins. The finished run trained every step of every
epoch once, on exactly its global batch, and ends at the big-batch run's weights (float64).

Skipped when Horovod is not built (scripts/install_horovod.sh), unless AIKIT_REQUIRE_HOROVOD=1.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from resize_checks import (
    WORKER,
    check_accounting,
    check_final_weights,
    commits,
    prepare,
    stop,
    tail,
    wait_for,
    worker_env,
)
from resize_common import total_steps

pytestmark = [pytest.mark.slow, pytest.mark.horovod]

HOROVODRUN = Path(sys.executable).parent / "horovodrun"
STEP_DELAY = 0.25


@pytest.fixture(autouse=True)
def _horovod(require_horovod):
    """Every test here needs Horovod (the fixture is in tests/conftest.py)."""


def set_hosts(run_dir: Path, *hosts: str) -> None:
    """What the discovery script reports: one slot on each host."""
    tmp = run_dir / "hosts.tmp"
    tmp.write_text("".join(f"{host}:1\n" for host in hosts))
    os.replace(tmp, run_dir / "hosts.txt")


def horovodrun(run_dir: Path, np: int, *worker_args: str) -> subprocess.Popen:
    script = run_dir / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {run_dir / 'hosts.txt'}\n")
    script.chmod(0o755)
    command = [
        str(HOROVODRUN), "-np", str(np), "--min-np", "1", "--max-np", "2", "--host-discovery-script", str(script),
        "--gloo", "--network-interface", "lo", "--elastic-timeout", "60",
        sys.executable, str(WORKER), str(run_dir), "--horovod", f"--delay={STEP_DELAY}", *worker_args,
    ]  # fmt: skip
    log = open(run_dir / "horovodrun.log", "w")  # noqa: SIM115 (the launcher writes to it)
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=worker_env(), cwd=run_dir)


def finish(proc: subprocess.Popen, run_dir: Path, timeout: float = 90) -> None:
    try:
        assert proc.wait(timeout=timeout) == 0, f"horovodrun exited with {proc.returncode}:\n{tail(run_dir)}"
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the run did not finish in {timeout}s:\n{tail(run_dir)}") from None


def test_a_worker_killed_mid_epoch_the_survivor_finishes_alone_with_the_same_updates(tmp_path):
    x, y = prepare(tmp_path)
    set_hosts(tmp_path, "localhost", "127.0.0.1")
    proc = horovodrun(tmp_path, 2)
    try:
        recs = wait_for(lambda r: sum(c["world"] == 2 for c in commits(r)) >= 2, tmp_path, 90, [proc],
                        "two committed steps by 2 workers")
        victim = next(r["pid"] for r in recs if r["host"] == "127.0.0.1")
        set_hosts(tmp_path, "localhost")  # the host goes away with its worker
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        finish(proc, tmp_path)
        recs = wait_for(lambda r: True, tmp_path, 1)
        last_before = max((c for c in commits(recs) if c["world"] == 2), key=lambda c: c["t"])
        assert last_before["updates"] < 7, "the kill was not mid-epoch 0"
        resumed = min((c for c in commits(recs) if c["world"] == 1), key=lambda c: c["t"])
        steps = check_accounting(recs)
        assert {entry["world"] for entry in steps.values()} == {1, 2}
        difference = check_final_weights(tmp_path, x, y, total_steps())
        print(f"\nHorovod scale-down: recovery {resumed['t'] - killed_at:.2f} s from SIGKILL to the first update "
              f"at world size 1; final weights within {difference:.1e} of the big-batch run")
    finally:
        stop([proc])


def test_a_host_added_mid_run_a_worker_joins_with_the_same_updates(tmp_path):
    x, y = prepare(tmp_path)
    set_hosts(tmp_path, "localhost")
    proc = horovodrun(tmp_path, 1, "--solo-delay=2.0")  # slow alone: the new worker must find it running
    try:
        wait_for(lambda r: sum(c["world"] == 1 for c in commits(r)) >= 2, tmp_path, 90, [proc],
                 "two committed steps by 1 worker")
        added_at = time.time()
        set_hosts(tmp_path, "localhost", "127.0.0.1")
        finish(proc, tmp_path)
        recs = wait_for(lambda r: True, tmp_path, 1)
        first_pair = min((c for c in commits(recs) if c["world"] == 2), key=lambda c: c["t"])
        steps = check_accounting(recs)
        assert {entry["world"] for entry in steps.values()} == {1, 2}
        difference = check_final_weights(tmp_path, x, y, total_steps())
        print(f"\nHorovod scale-up: {first_pair['t'] - added_at:.2f} s from adding the host to the first update "
              f"at world size 2; final weights within {difference:.1e} of the big-batch run")
    finally:
        stop([proc])
