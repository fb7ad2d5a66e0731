"""Real faults under torchrun's c10d rendezvous: two elastic agents on this machine
(``--nnodes=1:2``, one worker each, gloo). A node is killed mid-epoch (SIGKILL of its agent and
its worker) and the survivor re-rendezvous alone; or a second node joins mid-run. Either way
the finished run trained every step of every epoch once, on exactly its global batch, and ends
at the weights of the uninterrupted big-batch run (float64)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ports import free_port
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

pytestmark = pytest.mark.slow

STEP_DELAY = 0.25  # seconds per update, so the faults land mid-epoch (epoch 0 has 7 steps)


def agent(run_dir, port: int, name: str, *worker_args: str) -> subprocess.Popen:
    """One elastic agent (a node). Agent "a" hosts the c10d store: on one machine both would
    otherwise think they are the endpoint's host."""
    is_host = int(name == "agent_a")
    command = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes=1:2", "--nproc-per-node=1", "--max-restarts=3", "--monitor-interval=0.1",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=aikit-resize-test",
        f"--rdzv-conf=last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=4,join_timeout=60,is_host={is_host}",
        str(WORKER), str(run_dir), f"--delay={STEP_DELAY}", *worker_args,
    ]  # fmt: skip
    log = open(run_dir / f"{name}.log", "w")  # noqa: SIM115 (the launcher writes to it)
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=worker_env())


def world_committed(world: int, at_least: int):
    return lambda recs: sum(r["world"] == world for r in commits(recs)) >= at_least


def finish(procs, run_dir, timeout: float = 90) -> None:
    for proc in procs:
        try:
            assert proc.wait(timeout=timeout) == 0, f"launcher exited with {proc.returncode}:\n{tail(run_dir)}"
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the run did not finish in {timeout}s:\n{tail(run_dir)}") from None


def test_a_node_killed_mid_epoch_the_survivor_finishes_alone_with_the_same_updates(tmp_path):
    x, y = prepare(tmp_path)
    port = free_port()
    a = agent(tmp_path, port, "agent_a")  # hosts the c10d store: the node that stays
    time.sleep(0.5)
    b = agent(tmp_path, port, "agent_b")
    procs = [a, b]
    try:
        recs = wait_for(world_committed(2, 2), tmp_path, 60, procs, "two committed steps by 2 workers")
        worker_b = next(r["pid"] for r in recs if r["ppid"] == b.pid)
        killed_at = time.time()
        os.kill(worker_b, signal.SIGKILL)  # the node goes: its worker and its agent
        os.kill(b.pid, signal.SIGKILL)
        b.wait()
        finish([a], tmp_path)
        recs = wait_for(lambda r: True, tmp_path, 1)
        last_before = max((c for c in commits(recs) if c["world"] == 2), key=lambda c: c["t"])
        assert last_before["t"] < killed_at and last_before["updates"] < 7, "the kill was not mid-epoch 0"
        resumed = min((c for c in commits(recs) if c["world"] == 1), key=lambda c: c["t"])
        starts = [r for r in recs if r["event"] == "start" and r["world"] == 1]
        assert starts and starts[0]["restored"]["world_size"] == 2  # resumed, not started over
        steps = check_accounting(recs)
        assert {entry["world"] for entry in steps.values()} == {1, 2}
        difference = check_final_weights(tmp_path, x, y, total_steps())
        print(f"\nscale-down: recovery {resumed['t'] - killed_at:.2f} s from SIGKILL to the first update "
              f"at world size 1 (restore done {starts[0]['t'] - killed_at:.2f} s after the kill); "
              f"final weights within {difference:.1e} of the big-batch run")
    finally:
        stop(procs)


def test_a_worker_killed_mid_epoch_is_restarted_and_the_pair_goes_on_with_the_same_updates(tmp_path):
    """Only the worker dies (its node is fine): its agent restarts it, both re-rendezvous at 2."""
    x, y = prepare(tmp_path)
    port = free_port()
    procs = [agent(tmp_path, port, "agent_a")]
    time.sleep(0.5)
    procs.append(agent(tmp_path, port, "agent_b"))
    try:
        recs = wait_for(world_committed(2, 2), tmp_path, 60, procs, "two committed steps by 2 workers")
        killed_at = time.time()
        os.kill(next(r["pid"] for r in recs if r["ppid"] == procs[1].pid), signal.SIGKILL)
        finish(procs, tmp_path)
        recs = wait_for(lambda r: True, tmp_path, 1)
        restarts = [r for r in recs if r["event"] == "start" and r["restored"]]
        assert restarts and {r["restored"]["world_size"] for r in restarts} == {2}
        assert min(r["restored"]["commit"] for r in restarts) < 7, "the kill was not mid-epoch 0"
        restarted = {r["inc"] for r in restarts}
        resumed = min((c for c in commits(recs) if c["inc"] in restarted), key=lambda c: c["t"])
        steps = check_accounting(recs)
        assert {entry["world"] for entry in steps.values()} == {2}
        difference = check_final_weights(tmp_path, x, y, total_steps())
        print(f"\nworker restart: {resumed['t'] - killed_at:.2f} s from SIGKILL to the first update after it; "
              f"final weights within {difference:.1e} of the big-batch run")
    finally:
        stop(procs)


def test_a_node_joins_mid_run_and_the_pair_finishes_with_the_same_updates(tmp_path):
    x, y = prepare(tmp_path)
    port = free_port()
    a = agent(tmp_path, port, "agent_a", "--solo-delay=4")  # slow alone: the second node must find it running
    procs = [a]
    try:
        wait_for(world_committed(1, 2), tmp_path, 60, procs, "two committed steps by 1 worker")
        joined_at = time.time()
        procs.append(agent(tmp_path, port, "agent_b"))
        finish(procs, tmp_path)
        recs = wait_for(lambda r: True, tmp_path, 1)
        first_pair = min((c for c in commits(recs) if c["world"] == 2), key=lambda c: c["t"])
        assert first_pair["updates"] < total_steps(), "the second node joined too late to train"
        steps = check_accounting(recs)
        assert {entry["world"] for entry in steps.values()} == {1, 2}
        difference = check_final_weights(tmp_path, x, y, total_steps())
        print(f"\nscale-up: {first_pair['t'] - joined_at:.2f} s from starting the second agent to the first "
              f"update at world size 2; final weights within {difference:.1e} of the big-batch run")
    finally:
        stop(procs)


def test_a_checkpoint_no_rank_can_use_fails_on_every_rank_without_a_hang(torchrun, tmp_path):
    """Rank 0 reads the directory; when no commit in it is intact, every rank must raise (the
    others used to wait in the broadcast until the gloo timeout)."""
    (tmp_path / "aikit_state.000000001.safetensors").write_bytes(b"not a checkpoint at all" * 10)
    done = torchrun(Path(__file__).with_name("corrupt_restore_worker.py"), tmp_path, timeout=120)
    for rank in (0, 1):
        assert f"rank {rank} raised CheckpointError" in done.stdout, done.stdout
    assert "aikit_state.000000001.safetensors" in done.stdout
