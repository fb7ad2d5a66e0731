"""Horovod elastic across two hosts (network namespaces, tests/multihost.py): ``horovodrun`` on
host a runs the command docs/resize.md ("Several hosts") shows, read from it, with a discovery
script that lists hosts a and b; a's worker is started locally and b's over "ssh" (the network's
stand-in, which runs the command inside b), and Horovod's gloo runs over the hosts' own
interface. Host b is taken out of the discovery script mid-run and put back: the run goes
2 -> 1 -> 2 workers with ``hvd.elastic.TorchState`` and aikit's GA ``DistributedOptimizer``
(tests/horovod/elastic_ga_worker.py), every update plans for the world it runs in, and the final
weights equal one process taking one big-batch step per window (float64).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import multihost
import pytest
from test_horovod_elastic_ga import drive_2_1_2, updates

pytestmark = [pytest.mark.slow, pytest.mark.horovod]

HERE = Path(__file__).resolve().parent
DOCS = HERE.parents[1] / "docs" / "resize.md"
DOCUMENTED = {"10.0.0.1": "a", "10.0.0.2": "b"}


def documented_horovodrun() -> list[str]:
    for host, _, argv in multihost.documented_commands(DOCS, "## Several hosts"):
        if argv[0] == "horovodrun":
            assert host == "A", f"docs/resize.md runs horovodrun on host {host}, the tests on host A"
            return argv
    raise AssertionError(f"{DOCS} (## Several hosts) shows no horovodrun command")


def set_hosts(run_dir: Path, *hosts: multihost.Host) -> None:
    """What the discovery script reports next: one slot on each of ``hosts``."""
    (run_dir / "hosts.tmp").write_text("".join(f"{host.address}:1\n" for host in hosts))
    os.replace(run_dir / "hosts.tmp", run_dir / "hosts.txt")


def test_a_host_removed_and_added_back_equals_the_big_batch_steps(require_horovod, network, tmp_path):
    net = network(names=["a", "b"])
    a, b = net
    (tmp_path / "logs").mkdir()
    set_hosts(tmp_path, a, b)
    discover = tmp_path / "hosts.sh"
    discover.write_text(f"#!/bin/sh\ncat {tmp_path / 'hosts.txt'}\n")
    discover.chmod(0o755)
    argv = documented_horovodrun()
    python = argv.index("python")
    assert argv[python:] == ["python", "train.py"], argv
    addresses = {address: net[name].address for address, name in DOCUMENTED.items()}
    fill = {"./hosts.sh": str(discover), "eth0": multihost.INTERFACE, **addresses}
    command = [str(Path(sys.executable).parent / "horovodrun"), *(fill.get(w, w) for w in argv[1:python]),
               "--elastic-timeout", "60",
               sys.executable, str(HERE / "elastic_ga_worker.py"), str(tmp_path), "0.5", "1.0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{HERE}{os.pathsep}{HERE.parents[1]}",
           "PATH": f"{net.ssh_bin}{os.pathsep}{os.environ['PATH']}"}
    proc = a.popen(command, log=tmp_path / "horovodrun.log", env=env, cwd=tmp_path)
    started = time.time()
    removed_at, alone, back = drive_2_1_2(proc, tmp_path, lambda slots: set_hosts(tmp_path, *(a, b)[:slots]), a.kill)
    hosts_seen = {r["host"] for r in updates(tmp_path)}
    assert hosts_seen == {a.address, b.address}, hosts_seen  # a worker ran in each host
    print(f"\nHorovod across hosts: b removed, alone after {alone - removed_at:.1f} s; b added back, a pair again "
          f"after {back - alone:.1f} s; {time.time() - started:.0f} s in all; equal to the big-batch steps")
