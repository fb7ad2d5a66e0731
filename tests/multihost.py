"""Several hosts on one machine: Linux network namespaces joined by a switch, for tests.

A :class:`Network` is N "hosts", each a network namespace with its own network stack, its
loopback up and one interface, ``aikit0``, with a private address of its own (``10.231.0.1``,
``10.231.0.2``, ...). Every host's ``aikit0`` is one end of a veth pair whose other end is a
port of a bridge (the switch) that lives in a namespace of its own. Nothing is bridged or
routed to this machine's own interfaces: the hosts have no default route, and the switch
namespace has no address at all, so the only traffic is between the test's hosts.

What a test does with it:

- ``host.popen(args)`` / ``host.run(args)``: a command inside the host (``ip netns exec``), in a
  session of its own. Files are shared: every host sees this machine's file system, so a
  temporary directory is "shared storage". Only /etc/hosts differs (``/etc/netns/NAME/hosts``,
  which ``ip netns exec`` mounts over it): inside a host, this machine's host name resolves to
  that host's address, as a real machine's name resolves to its own, and each host's name
  (``a``, ``b``, ...) to its address.
- ``host.kill()``: the host is lost. That is every process in its namespace (``ip netns pids``),
  killed until none is left: torchrun starts its workers in sessions of their own, so killing a
  launcher's process group would leave its workers running.
- ``host.cut()`` / ``host.restore()``: the host's link goes down and comes back. The cut is made
  at the switch port, so the host's processes see no error, only silence (packets dropped, as
  when a cable or a switch fails): peers notice only through their timeouts.
- ``network.ssh_bin``: a directory with an ``ssh`` that runs its command in the namespace of
  the host whose address it is given (for launchers that start remote workers over ssh, e.g.
  ``horovodrun``), with a fresh minimal environment, as a login over ssh has.

Teardown (:meth:`Network.close`) kills every process in every namespace of the network and
deletes the namespaces (their veths go with them) and their /etc/netns files. It runs when the
``with`` block or the pytest fixture ends (a failed test, a crashed fixture, KeyboardInterrupt),
when a constructor fails half way, and at interpreter exit. Names carry a prefix unique to the
creating process (its pid and start time), so parallel pytest-xdist workers never collide, and
:func:`clean_stale` (run by the fixtures) removes what a killed run left behind (namespaces and
/etc/netns files whose creating process is gone). The veths are created inside the
namespaces, never in the machine's own, so their names cannot collide with anything.

Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) and ``ip`` from iproute2; :func:`unavailable`
says why namespaces cannot be created here, or None.

Fixtures (tests/conftest.py imports them, so every test can ask for them): ``network``, a
factory ``network(count=2, names=None) -> Network`` whose networks are torn down when the test
ends, and ``require_netns``, which skips with the reason where namespaces cannot be created,
or fails when ``AIKIT_REQUIRE_NETNS=1`` (scripts/test.sh sets it).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from capabilities import skip_or_fail

from aikit.core.errors import InvalidValue

PREFIX = "aikit-net-"
INTERFACE = "aikit0"  # each host's interface: the name GLOO_SOCKET_IFNAME and --network-interface give
SUBNET = "10.231.0"  # hosts are SUBNET.1, SUBNET.2, ... (/24); private, and only inside the namespaces
ETC_NETNS = Path("/etc/netns")  # per-namespace files that ip netns exec mounts over /etc

_counter = itertools.count()
_live: list[Network] = []


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or None
    when there is no such process: with the pid it identifies a process, even after pid reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _owner_prefix() -> str:
    return f"{PREFIX}{os.getpid()}x{_start_time(os.getpid())}-"


def _ip(*args: str, namespace: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    command = ["ip", *(["-n", namespace] if namespace else []), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if check and done.returncode:
        raise OSError(f"{shlex.join(command)} exited {done.returncode}: {done.stderr.strip()}")
    return done


def namespaces() -> list[str]:
    """Names of this machine's network namespaces (``ip netns list``)."""
    listed = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in listed.splitlines() if line.strip()]


def pids_in(namespace: str) -> list[int]:
    """Every process in ``namespace`` (``ip netns pids``)."""
    return [int(pid) for pid in _ip("netns", "pids", namespace, check=False).stdout.split()]


def kill_namespace(namespace: str, sig: int = signal.SIGKILL, timeout: float = 10) -> int:
    """Send ``sig`` to every process in ``namespace`` until none is left (SIGKILL) or once
    (another signal); returns how many processes were signalled. Processes that fork while it
    runs are caught by the next pass."""
    signalled: set[int] = set()
    deadline = time.monotonic() + timeout
    while True:
        pids = pids_in(namespace)
        if not pids or (sig != signal.SIGKILL and signalled):
            return len(signalled)
        if time.monotonic() > deadline:
            raise TimeoutError(f"processes {pids} are still in namespace {namespace} after {timeout} s")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            signalled.add(pid)
        time.sleep(0.02)


def delete_namespace(namespace: str) -> None:
    """Kill what runs in ``namespace`` and delete it (its interfaces go with it) and its files
    in /etc/netns."""
    kill_namespace(namespace)
    _ip("netns", "delete", namespace, check=False)
    shutil.rmtree(ETC_NETNS / namespace, ignore_errors=True)


def _write_hosts_file(host: Host, hosts: list[Host]) -> None:
    """The host's own /etc/hosts (``ip netns exec`` mounts /etc/netns/NAME/hosts over /etc/hosts):
    this machine's host name resolves to the host's own address, as a real machine's name
    resolves to its address, and every host's name to its address. (Horovod 0.28.1 binds the
    gloo contexts of its process sets to the address the host name resolves to, whatever
    ``--network-interface`` says.)"""
    directory = ETC_NETNS / host.namespace
    directory.mkdir(parents=True, exist_ok=True)
    lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback",
             f"{host.address} {socket.gethostname()} {host.name}"]
    lines += [f"{other.address} {other.name}" for other in hosts if other is not host]
    (directory / "hosts").write_text("\n".join(lines) + "\n")


def clean_stale() -> list[str]:
    """Delete the namespaces a run that no longer exists left behind (a pytest killed before its
    teardown); returns their names. Namespaces of live processes are left alone."""
    removed = []
    leftovers = {path.name for path in ETC_NETNS.glob(f"{PREFIX}*")} if ETC_NETNS.is_dir() else set()
    for name in sorted(set(namespaces()) | leftovers):
        found = re.match(rf"{re.escape(PREFIX)}(\d+)x(\d+)-", name)
        if found and _start_time(int(found[1])) != found[2]:
            delete_namespace(name)
            removed.append(name)
    return removed


def unavailable() -> str | None:
    """Why network namespaces cannot be created here, or None when they can."""
    if sys.platform != "linux":
        return f"network namespaces are Linux's ({sys.platform} here)"
    probe = f"{_owner_prefix()}probe{next(_counter)}"
    try:
        _ip("netns", "add", probe)
        _ip("link", "set", "lo", "up", namespace=probe)
        _ip("link", "add", "p0", "type", "veth", "peer", "name", "p1", namespace=probe)
    except FileNotFoundError:
        return "the ip command (iproute2) is not installed"
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"cannot create a network namespace and a veth pair (needs root or CAP_NET_ADMIN): {error}"
    finally:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            _ip("netns", "delete", probe, check=False)
    return None


class Host:
    """One host of a :class:`Network`: a namespace with ``address`` on interface ``aikit0``."""

    def __init__(self, network: Network, name: str, namespace: str, address: str, port: str):
        self.network, self.name, self.namespace, self.address, self._port = network, name, namespace, address, port
        self.interface = INTERFACE

    def __repr__(self) -> str:
        return f"Host({self.name!r}, {self.address}, namespace {self.namespace!r})"

    def command(self, args: list[str]) -> list[str]:
        """``args`` as a command line that runs inside this host."""
        return ["ip", "netns", "exec", self.namespace, *map(str, args)]

    def popen(self, args: list, *, log: Path | None = None, **kwargs) -> subprocess.Popen:
        """Start ``args`` inside this host, in a session of its own; its output goes to ``log``
        (appended) when given. Other keyword arguments go to :class:`subprocess.Popen`."""
        if log is not None:
            with open(log, "a") as out:
                return subprocess.Popen(self.command(args), stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True, **kwargs)
        return subprocess.Popen(self.command(args), start_new_session=True, **kwargs)

    def run(self, args: list, *, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        """Run ``args`` inside this host to the end; its output captured as text."""
        return subprocess.run(self.command(args), capture_output=True, text=True, timeout=timeout, **kwargs)

    def pids(self) -> list[int]:
        """Every process running in this host."""
        return pids_in(self.namespace)

    def kill(self, sig: int = signal.SIGKILL) -> int:
        """Lose this host: ``sig`` to every process in it (see :func:`kill_namespace`)."""
        return kill_namespace(self.namespace, sig)

    def cut(self) -> None:
        """Take this host's link down at the switch: its packets are dropped both ways, silently."""
        _ip("link", "set", self._port, "down", namespace=self.network.switch)

    def restore(self) -> None:
        """Bring this host's link back up."""
        _ip("link", "set", self._port, "up", namespace=self.network.switch)

    def linked(self) -> bool:
        """Whether this host's switch port is up."""
        shown = _ip("-o", "link", "show", self._port, namespace=self.network.switch).stdout
        return "state UP" in shown or ",UP" in shown.split(">")[0]


class Network:
    """``count`` hosts named ``names`` (a, b, c, ... by default) on one switch; see the module's
    docstring. Use it as a context manager, or call :meth:`close`."""

    def __init__(self, count: int = 2, *, names: list[str] | None = None, subnet: str = SUBNET):
        names = list(names or "abcdefghij"[:count])
        if len(names) != count or not 1 <= count <= 250:
            raise InvalidValue(f"a network of {count} hosts needs 1 to 250 hosts and {count} names, got {names}")
        self.prefix = f"{_owner_prefix()}{next(_counter)}-"
        self.switch = f"{self.prefix}switch"
        self.hosts: list[Host] = []
        self._ssh_dir: Path | None = None
        _live.append(self)
        try:
            _ip("netns", "add", self.switch)
            _ip("link", "set", "lo", "up", namespace=self.switch)
            _ip("link", "add", "switch", "type", "bridge", namespace=self.switch)
            _ip("link", "set", "switch", "up", namespace=self.switch)
            for index, name in enumerate(names):
                namespace, port, address = f"{self.prefix}{name}", f"port{index}", f"{subnet}.{index + 1}"
                _ip("netns", "add", namespace)
                self.hosts.append(Host(self, name, namespace, address, port))
                _ip("link", "set", "lo", "up", namespace=namespace)
                _ip("link", "add", port, "type", "veth", "peer", "name", INTERFACE, "netns", namespace,
                    namespace=self.switch)
                _ip("link", "set", port, "master", "switch", namespace=self.switch)
                _ip("link", "set", port, "up", namespace=self.switch)
                _ip("addr", "add", f"{address}/24", "dev", INTERFACE, namespace=namespace)
                _ip("link", "set", INTERFACE, "up", namespace=namespace)
            for host in self.hosts:
                _write_hosts_file(host, self.hosts)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getitem__(self, key: int | str) -> Host:
        if isinstance(key, int):
            return self.hosts[key]
        for host in self.hosts:
            if host.name == key:
                return host
        raise KeyError(f"no host {key!r} in {[h.name for h in self.hosts]}")

    def __iter__(self):
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    @property
    def ssh_bin(self) -> Path:
        """A directory holding an ``ssh`` for this network: ``ssh [options] ADDRESS COMMAND...``
        runs COMMAND with ``bash -c`` inside the host with that address, in a minimal
        environment; an unknown address fails as ssh does (exit 255). Put it first on a
        launcher's PATH."""
        if self._ssh_dir is None:
            self._ssh_dir = Path(tempfile.mkdtemp(prefix=self.prefix))
            hosts = " ".join(f"{h.address}={h.namespace}" for h in self.hosts)
            script = self._ssh_dir / "ssh"
            script.write_text(_FAKE_SSH.format(python=sys.executable, hosts=hosts))
            script.chmod(0o755)
        return self._ssh_dir

    def close(self) -> None:
        """Kill every process in every host and delete every namespace; safe to call twice."""
        for namespace in [h.namespace for h in self.hosts] + [self.switch]:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired, TimeoutError):
                delete_namespace(namespace)
        self.hosts = []
        if self._ssh_dir is not None:
            for path in self._ssh_dir.iterdir():
                path.unlink()
            self._ssh_dir.rmdir()
            self._ssh_dir = None
        if self in _live:
            _live.remove(self)


_FAKE_SSH = r'''#!{python}
"""ssh for a network of namespaces (tests/multihost.py): ssh [-o OPT] [-p PORT] [-i FILE] HOST CMD..."""
import os, sys
hosts = dict(pair.split("=") for pair in "{hosts}".split())
args, words = sys.argv[1:], []
while args:  # options may come before and after the host, as ssh allows
    arg = args.pop(0)
    if words and len(words) > 1 or not arg.startswith("-"):
        words.append(arg)
    elif arg in ("-o", "-p", "-i", "-l") and args:
        args.pop(0)
if not words:
    sys.exit("usage: ssh [options] HOST COMMAND")
host, command = words[0], " ".join(words[1:])
if host not in hosts:
    print(f"ssh: Could not resolve hostname {{host}}: not a host of this test network", file=sys.stderr)
    sys.exit(255)
env = {{"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}}
os.execvpe("ip", ["ip", "netns", "exec", hosts[host], "bash", "-c", command or "true"], env)
'''


@atexit.register
def _close_all() -> None:
    for network in list(_live):
        network.close()


# ---- pytest fixtures (tests/conftest.py imports them; `-p multihost` loads them elsewhere) ----


@pytest.fixture(scope="session")
def require_netns() -> None:
    """Skip the test, saying why, where network namespaces cannot be created; fail it instead
    when ``AIKIT_REQUIRE_NETNS=1`` (scripts/test.sh sets it: CI can create them, so a missing
    capability there is a failure, not a skip). Removes what killed runs left behind first."""
    missing = unavailable()
    if missing:
        skip_or_fail("NETNS", f"this test needs Linux network namespaces to run several hosts on one machine: "
                              f"{missing}")
    clean_stale()


@pytest.fixture
def network(require_netns):
    """``network(count=2, names=None)``: a :class:`Network` of that many hosts, torn down when
    the test ends, however it ends."""
    made: list[Network] = []

    def make(count: int = 2, **kwargs) -> Network:
        made.append(Network(count, **kwargs))
        return made[-1]

    try:
        yield make
    finally:
        for net in made:
            net.close()


# ---- the commands a document shows, to run on the test's hosts ----------------------------------


def documented_commands(markdown: Path, heading: str) -> list[tuple[str, dict[str, str], list[str]]]:
    """The commands of the ```bash blocks in the section ``heading`` of ``markdown``, in order, as
    ``(host, environment, argv)``: the host is the letter of the last ``# on host X`` comment
    above the command, the environment what the ``export`` lines after that comment set, and
    ``argv`` the command split as bash would (continuation lines joined). Tests run a guide's
    commands on their hosts with this, so the guide shows what the tests run."""
    text = markdown.read_text()
    start = text.index(f"\n{heading}\n")
    following = re.search(r"\n## ", text[start + 1:])
    section = text[start:start + 1 + following.start()] if following else text[start:]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", section, re.S):
        host, env = None, {}
        for line in block.replace("\\\n", " ").splitlines():
            found = re.match(r"\s*# on host (\w)\b", line)
            if found:
                host, env = found[1], {}
            words = shlex.split(line, comments=True)
            if not words:
                continue
            if words[0] == "export":
                env.update(word.split("=", 1) for word in words[1:])
            else:
                commands.append((host, dict(env), words))
    return commands
