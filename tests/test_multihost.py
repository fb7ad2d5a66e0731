"""The multi-host harness (tests/multihost.py): hosts that reach each other and nothing else, a
link that goes down silently and comes back, a lost host that takes every process with it, an
ssh that lands in the right host, and a teardown that always happens (a failed test, a crashed
fixture, Ctrl-C, a constructor that fails half way) and cleans what killed runs left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import multihost
import pytest

HERE = Path(__file__).resolve().parent
CONNECT = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))"
SERVE = ("import socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
         "s.bind(('0.0.0.0', 5000)); s.listen(); print('listening', flush=True)\n"
         "while True: s.accept()[0].close()")


def connects(host: multihost.Host, address: str, timeout: float = 2.0) -> str:
    """'ok', or the error a connection from ``host`` to ``address``:5000 ends with."""
    done = host.run([sys.executable, "-c", CONNECT, address, "5000", str(timeout)], timeout=timeout + 30)
    return "ok" if done.returncode == 0 else done.stderr.strip().splitlines()[-1]


def serve(host: multihost.Host) -> subprocess.Popen:
    server = host.popen([sys.executable, "-c", SERVE], stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "listening"
    return server


def test_hosts_reach_each_other_by_address_and_nothing_outside(network):
    net = network(3)
    a, b, c = net
    assert [h.address for h in net] == ["10.231.0.1", "10.231.0.2", "10.231.0.3"]
    serve(b)
    assert connects(a, b.address) == "ok"
    assert connects(c, b.address) == "ok"
    assert connects(b, "127.0.0.1") == "ok"  # loopback up
    assert "Network is unreachable" in connects(a, "8.8.8.8")  # no route out
    assert "refused" in connects(a, "127.0.0.1")  # b's server is not on a's loopback
    resolve = "import socket, sys; print(socket.gethostbyname(sys.argv[1] or socket.gethostname()))"
    for host in net:  # its own name is its address, as on a real machine; the others' names theirs
        assert host.run([sys.executable, "-c", resolve, ""]).stdout.strip() == host.address
        assert host.run([sys.executable, "-c", resolve, "c"]).stdout.strip() == c.address
    routes = a.run(["ip", "route"]).stdout.strip()
    assert routes == f"10.231.0.0/24 dev {multihost.INTERFACE} proto kernel scope link src 10.231.0.1"


def test_a_cut_link_drops_packets_silently_and_a_restored_one_carries_them_again(network):
    a, b = network(2)
    serve(b)
    b.cut()
    assert not b.linked()
    started = time.monotonic()
    assert connects(a, b.address, timeout=1.5) == "TimeoutError: timed out"  # silence, not a refusal
    assert time.monotonic() - started >= 1.4
    assert connects(b, b.address) == "ok"  # the host itself goes on
    b.restore()
    assert b.linked()
    assert connects(a, b.address) == "ok"


def test_a_lost_host_takes_every_process_with_it_sessions_of_their_own_included(network):
    a, b = network(2)
    script = "import subprocess, time; subprocess.Popen(['setsid', 'sleep', '300']); time.sleep(300)"
    parent = b.popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 30
    while len(b.pids()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(b.pids()) == 2  # the python and the sleep it started in a session of its own
    sessions = {os.getsid(pid) for pid in b.pids()}
    assert len(sessions) == 2
    a_process = a.popen(["sleep", "300"])
    assert b.kill() == 2
    assert b.pids() == [] and parent.wait(timeout=10) == -signal.SIGKILL
    assert a.pids() == [a_process.pid]  # the other host is untouched


def test_ssh_runs_its_command_in_the_host_with_that_address_in_a_fresh_environment(network):
    net = network(2)
    ssh = str(net.ssh_bin / "ssh")
    env = {**os.environ, "SECRET_OF_THE_CALLER": "1"}
    done = subprocess.run([ssh, "-o", "StrictHostKeyChecking=no", net[1].address, "-o", "ConnectTimeout=5",
                           "ip -br addr show aikit0; echo ${SECRET_OF_THE_CALLER:-unset}"],
                          capture_output=True, text=True, env=env, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "10.231.0.2/24" in done.stdout and done.stdout.split()[-1] == "unset"
    unknown = subprocess.run([ssh, "10.231.0.99", "true"], capture_output=True, text=True, timeout=30)
    assert unknown.returncode == 255 and "Could not resolve hostname 10.231.0.99" in unknown.stderr


def test_a_constructor_that_fails_half_way_leaves_nothing(require_netns):
    before = made_by(os.getpid())  # this process's only: another test process may be building its own
    with pytest.raises(OSError, match="netns add"):
        multihost.Network(2, names=["a", "no/such"])  # the second host's name is not a valid namespace
    assert made_by(os.getpid()) == before


def test_clean_stale_removes_what_dead_runs_left_and_nothing_else(require_netns):
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid no process has now (or, reused, with another start time)
    stale = f"{multihost.PREFIX}{dead.pid}x1-0-a"
    multihost._ip("netns", "add", stale)
    (multihost.ETC_NETNS / stale).mkdir(parents=True)
    (multihost.ETC_NETNS / stale / "hosts").write_text("10.231.0.1 a\n")
    with multihost.Network(1) as live:
        removed = multihost.clean_stale()
        names = multihost.namespaces()
        assert stale in removed and stale not in names and not (multihost.ETC_NETNS / stale).exists()
        assert (multihost.ETC_NETNS / live[0].namespace / "hosts").exists()
        assert live[0].namespace in names and live.switch in names


INNER = textwrap.dedent('''
    import time
    import pytest

    @pytest.fixture
    def crashing(network):
        network(2)
        raise RuntimeError("a fixture crashed")

    def test_fails(network):
        network(2)
        assert False

    def test_crashed_fixture(crashing):
        pass

    def test_interrupted(network, tmp_path_factory):
        network(2)
        print("made", flush=True)
        time.sleep(120)
''')


def made_by(pid: int) -> list[str]:
    return [name for name in multihost.namespaces() if name.startswith(f"{multihost.PREFIX}{pid}x")]


def test_teardown_happens_on_a_failure_a_crashed_fixture_and_ctrl_c(require_netns, tmp_path):
    (tmp_path / "test_inner.py").write_text(INNER)
    command = [sys.executable, "-m", "pytest", "-p", "multihost", "-p", "no:cacheprovider", "-q", "-s",
               str(tmp_path / "test_inner.py")]
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    failing = subprocess.Popen([*command, "-k", "not interrupted"], stdout=subprocess.PIPE, text=True, env=env,
                               cwd=tmp_path)
    assert "1 failed, 1 deselected, 1 error" in failing.communicate(timeout=120)[0]
    assert made_by(failing.pid) == []
    interrupted = subprocess.Popen([*command, "-k", "interrupted"], stdout=subprocess.PIPE, text=True, env=env,
                                   cwd=tmp_path)
    try:
        for line in interrupted.stdout:
            if "made" in line:
                break
        assert len(made_by(interrupted.pid)) == 3  # two hosts and the switch
        interrupted.send_signal(signal.SIGINT)  # Ctrl-C
        assert "KeyboardInterrupt" in interrupted.communicate(timeout=60)[0]
    finally:
        if interrupted.poll() is None:
            interrupted.kill()
            interrupted.wait()
    assert made_by(interrupted.pid) == []


def test_without_namespaces_the_reason_is_said(tmp_path):
    """Where ``ip`` is missing (or namespaces are refused), the tests skip with the reason, or
    fail under AIKIT_REQUIRE_NETNS=1."""
    code = "import multihost; print(multihost.unavailable())"
    env = {"PATH": str(tmp_path), "PYTHONPATH": str(HERE)}  # no ip on this PATH
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.stdout.strip() == "the ip command (iproute2) is not installed", done.stderr
    (tmp_path / "test_needs_hosts.py").write_text("def test_it(network):\n    network(2)\n")
    for required, outcome in (("0", "1 skipped"), ("1", "1 error")):
        run = subprocess.run([sys.executable, "-m", "pytest", "-p", "multihost", "-p", "no:cacheprovider", "-rsf",
                              str(tmp_path / "test_needs_hosts.py")],
                             capture_output=True, text=True, timeout=60, cwd=tmp_path,
                             env={**env, "AIKIT_REQUIRE_NETNS": required})
        assert outcome in run.stdout and "the ip command (iproute2) is not installed" in run.stdout, run.stdout
