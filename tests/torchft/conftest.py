"""A TorchFT lighthouse in this process (``torchft.coordination.LighthouseServer`` on 127.0.0.1:0,
heartbeat 1 s) and replica groups as real processes (``ft_worker.py``, one process each, gloo,
float64), started, paused, killed and relaunched by PID.

Without ``torchft`` the tests skip, unless ``AIKIT_REQUIRE_TORCHFT=1``, where they fail. The cases
that take longest (three groups, a full-job restart, a short heartbeat) run only with
``AIKIT_TORCHFT_ALL=1`` (docs/resize.md, No restart: TorchFT).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from capabilities import skip_or_fail

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
HEARTBEAT_MS, JOIN_MS = 1000, 2000
ALL = os.environ.get("AIKIT_TORCHFT_ALL") == "1"
every_case = pytest.mark.skipif(not ALL, reason="one of the longer TorchFT cases: AIKIT_TORCHFT_ALL=1 runs it")


def require_torchft():
    try:
        from torchft.coordination import LighthouseServer
    except ImportError as error:
        skip_or_fail("TORCHFT", f"torchft is not installed ({error}): pip install -r requirements/test.txt")
    return LighthouseServer


@pytest.fixture
def lighthouse(monkeypatch):
    """A lighthouse of ``min_replicas=1`` in this process; its address. ``lighthouse.start(...)``
    makes another with other settings."""
    monkeypatch.setenv("RUST_LOG", "error")  # TorchFT's Rust side logs every quorum at INFO
    server = require_torchft()

    def start(heartbeat_ms: int = HEARTBEAT_MS, join_ms: int = JOIN_MS, min_replicas: int = 1):
        made = server(bind="127.0.0.1:0", min_replicas=min_replicas, join_timeout_ms=join_ms,
                      heartbeat_timeout_ms=heartbeat_ms, quorum_tick_ms=50)
        servers.append(made)
        return made.address()

    servers: list = []
    start.address = start()
    yield start
    for made in servers:
        made.shutdown()


class Groups:
    """Replica-group processes of one run, each writing its events to ``<id>.jsonl``."""

    def __init__(self, directory: Path, lighthouse: str, path: str) -> None:
        self.directory, self.lighthouse, self.path = directory, lighthouse, path
        self.processes: dict[str, subprocess.Popen] = {}
        self.go = directory / "go"
        self.kills: dict[str, float] = {}  # id -> when it was killed or stopped

    def start(self, group: str, *args: object, together: bool = True) -> subprocess.Popen:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "RUST_LOG": "error", "PYTHONPATH": str(ROOT)}
        for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(name, None)
        command = [sys.executable, str(HERE / "ft_worker.py"), "--lighthouse", self.lighthouse, "--id", group,
                   "--log", str(self.log(group)), "--path", self.path, "--directory", str(self.directory / "commits"),
                   *(["--go", str(self.go)] if together else []), *map(str, args)]
        out = (self.directory / f"{group}.out").open("w")
        self.processes[group] = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        return self.processes[group]

    def log(self, group: str) -> Path:
        return self.directory / f"{group}.jsonl"

    def events(self, group: str) -> list[dict]:
        if not self.log(group).exists():
            return []
        lines = self.log(group).read_text().splitlines()
        return [json.loads(line) for line in lines if line.endswith("}")]

    def output(self, group: str) -> str:
        path = self.directory / f"{group}.out"
        return path.read_text()[-6000:] if path.exists() else ""

    def wait_for(self, group: str, event: str, timeout: float = 120, **fields) -> dict:
        """The first event of ``group`` named ``event`` with ``fields`` (a field's value may be a
        predicate), waiting for it; fails with the group's output if it ends or time runs out."""
        ends = time.monotonic() + timeout
        while time.monotonic() < ends:
            for row in self.events(group):
                if row["event"] == event and all(value(row.get(key)) if callable(value) else row.get(key) == value
                                                 for key, value in fields.items()):
                    return row
            if self.processes[group].poll() is not None:
                pytest.fail(f"group {group} ended ({self.processes[group].returncode}) before {event} {fields}:\n"
                            f"{self.output(group)}")
            time.sleep(0.05)
        pytest.fail(f"group {group}: no {event} {fields} within {timeout} s:\n{self.output(group)}")

    def begin(self, *groups: str) -> None:
        """Let ``groups`` (started with ``together``) take their first quorum once all have joined."""
        for group in groups:
            self.wait_for(group, "ready")
        self.go.touch()

    def signal(self, group: str, sig: signal.Signals) -> None:
        self.kills[group] = time.time()
        self.processes[group].send_signal(sig)

    def finish(self, *groups: str, timeout: float = 180) -> None:
        """Wait for ``groups`` to end; each must end well."""
        for group in groups:
            try:
                code = self.processes[group].wait(timeout)
            except subprocess.TimeoutExpired:
                self.stop_all()
                pytest.fail(f"group {group} did not end within {timeout} s:\n{self.output(group)}")
            assert code == 0, f"group {group} exited {code}:\n{self.output(group)}"

    def stop_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
                process.wait()


@pytest.fixture
def groups(tmp_path, lighthouse):
    """``groups(path)``: a :class:`Groups` of the trace or the GA path on the lighthouse."""
    made: list[Groups] = []

    def make(path: str, address: str | None = None) -> Groups:
        made.append(Groups(tmp_path, address or lighthouse.address, path))
        return made[-1]

    yield make
    for run in made:
        run.stop_all()
