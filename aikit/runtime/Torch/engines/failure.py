"""A collective that failed on a peer, named: what it was, this rank, the time it waited and the
setting that bounds the wait.

A collective waits for every peer. When one is gone (its process killed, its host down) or
cannot be reached (its link down), the engine's wait ends after at most its timeout (at once
when the peer's connection closes) with the engine's own error; :func:`named_failure` raises it
as a :class:`~aikit.core.errors.CollectiveError` that says so, with the engine's error as its
cause. Horovod's errors are not named: ``hvd.elastic.run`` acts on its own
``HorovodInternalError``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

from aikit.core.errors import AikitError, CollectiveError


def _reason(error: BaseException) -> str:
    text = str(error)
    if "Timed out" in text or "timed out" in text or "Timeout" in text:
        return "no answer within the timeout: a peer is stuck, or its host or its link is down"
    if any(words in text for words in ("closed by peer", "Connection reset", "Broken pipe", "Connection refused")):
        return "a peer's connection closed: its process or its host died"
    return "a peer failed"


@contextlib.contextmanager
def named_failure(what: str, timeout: timedelta | None, setting: str,
                  place: Callable[[], tuple[int, int]]) -> Iterator[None]:
    """Raise a failure of the collective ``what`` inside the block as a :class:`CollectiveError`
    that names it, this process's place among those it waited for (``place()``: rank and world, as
    the engine that ran it counts them), the time it waited, the ``timeout`` bounding the wait and
    the ``setting`` that sets it (the engine's error is its cause)."""
    started = time.monotonic()
    try:
        yield
    except RuntimeError as error:
        if isinstance(error, AikitError):
            raise
        waited = time.monotonic() - started
        bound = f"{timeout.total_seconds():g} s" if timeout is not None else "not known"
        rank, world = place()
        raise CollectiveError(
            f"{what} failed on rank {rank} of {world} after {waited:.1f} s: "
            f"{_reason(error)} (the wait is bounded by {setting}, {bound} here; docs/resize.md, Several hosts). "
            f"The engine said: {str(error).strip()[:500]}"
        ) from error
