"""How a TorchFT replica group that heals fetches the live state: as the bytes of a commit, never pickled.

TorchFT's own ``HTTPTransport`` (torchft 0.2.0, ``checkpointing/http_transport.py``) sends a state
with ``torch.distributed._serialization._streaming_save`` and reads it with ``_streaming_load(...,
weights_only=False)``: ``torch.load``'s full unpickler, which runs whatever the bytes name. aikit
hands the manager :class:`CommitTransport` instead. When a quorum says a group must heal from this
one, the state asked for (aikit's :meth:`~aikit.elastic.Torch.ElasticState.snapshot`, and the
manager's own step count) is encoded once, as an ``ElasticState`` commit is: tensors raw in a
safetensors file, everything else JSON, a SHA-256 over all of it
(:mod:`aikit.elastic.Torch.encoding`). Those bytes are served over HTTP until the update is
decided; the group that heals parses them: data, nothing to run, a changed byte refused.

It provides what ``torchft.manager.Manager`` calls on a checkpoint transport (``metadata``,
``send_checkpoint``, ``disallow_checkpoint``, ``recv_checkpoint``, ``shutdown``), so it needs no
part of TorchFT itself.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from aikit.core.errors import CheckpointError
from aikit.elastic.Torch.encoding import encode, parse, serialize


class CommitTransport:
    """Serves this group's state to a group that heals, as commit bytes over HTTP on ``host``."""

    def __init__(self, host: str, timeout: timedelta) -> None:
        self.host, self.timeout = host, timeout
        self._served: tuple[int, bytes] | None = None  # (step, bytes) while a quorum may fetch them
        self._changed = threading.Condition()
        transport = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                wanted = self.path.rsplit("/", 1)[-1]
                served = transport.served(int(wanted) if wanted.isdigit() else -1)
                if served is None:
                    self.send_error(404, f"no state of step {wanted} here")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(served)))
                self.end_headers()
                self.wfile.write(served)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # a request per heal: nothing to log

        Handler.timeout = timeout.total_seconds()  # a stuck peer cannot hold a serving thread for ever
        self._server = ThreadingHTTPServer(("", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="aikit-heal", daemon=True)
        self._thread.start()

    def metadata(self) -> str:
        """Where a group that heals fetches this one's state (the step follows)."""
        return f"http://{self.host}:{self._server.server_address[1]}/aikit/"

    def served(self, step: int) -> bytes | None:
        """The bytes of ``step``'s state, waiting (up to the timeout) while this group's quorum has
        not made them yet, as TorchFT's transport holds a request until it serves; None if not made."""
        with self._changed:
            self._changed.wait_for(lambda: self._served is not None and self._served[0] >= step,
                                   self.timeout.total_seconds())
            served = self._served
        return served[1] if served is not None and served[0] == step else None

    def send_checkpoint(self, dst_ranks: list[int], step: int, state_dict: Any, timeout: timedelta) -> None:
        """Encode ``state_dict`` once (tensors and JSON) and serve it for ``step``."""
        served = step, bytes(serialize(encode(state_dict)))
        with self._changed:
            self._served = served
            self._changed.notify_all()

    def disallow_checkpoint(self) -> None:
        """The update is decided: whoever healed from it has fetched it, the bytes go."""
        with self._changed:
            self._served = None

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> Any:
        """The state of ``step`` from the live group at ``metadata``, parsed (never unpickled)."""
        address = f"{metadata}{step}"
        try:
            with urllib.request.urlopen(address, timeout=timeout.total_seconds()) as reply:
                raw = reply.read()
        except (urllib.error.URLError, OSError) as error:
            raise CheckpointError(f"the live replica group's state at {address} could not be fetched: "
                                  f"{error}") from error
        return parse(raw, address)

    def shutdown(self, wait: bool = True) -> None:
        self._served = None
        self._server.shutdown()
        self._server.server_close()
        if wait:
            self._thread.join()
