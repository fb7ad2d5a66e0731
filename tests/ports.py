"""Free TCP ports on loopback for the tests' rendezvous (torchrun's store, gloo, TF's cluster, JAX's
coordinator, XLA's hosts' groups): one helper, so that every test draws them the same way."""

from __future__ import annotations

import contextlib
import socket


def free_ports(count: int = 1, *, consecutive: bool = False, host: str = "127.0.0.1") -> list[int]:
    """``count`` ports free on ``host`` now, all held open while they are drawn (so they differ);
    ``consecutive``: ``p, p + 1, ...`` (a worker that listens on a port and the next: two ports
    drawn at random are not neighbours, and another test's process took ``p + 1`` once)."""
    for _ in range(100):
        with contextlib.ExitStack() as held:
            sockets = [held.enter_context(socket.socket()) for _ in range(count)]
            sockets[0].bind((host, 0))
            first = sockets[0].getsockname()[1]
            try:
                for offset, sock in enumerate(sockets[1:], 1):
                    sock.bind((host, first + offset if consecutive else 0))
            except OSError:
                continue  # a neighbour was taken: draw again
            return [sock.getsockname()[1] for sock in sockets]
    raise RuntimeError(f"no {count} {'consecutive ' if consecutive else ''}free ports on {host}")


def free_port() -> int:
    """One free port on loopback."""
    return free_ports(1)[0]
