"""The copy of the model and optimizer a finder takes so that ``reset()`` can restore them.

torch-lr-finder's ``StateCacher``, framework-free: deep copies in memory, or files under
``cache_dir`` (removed when the cache goes) written and read by the framework's subclass.
"""

from __future__ import annotations

import copy
import os
import tempfile
import weakref

from aikit.core.errors import InvalidState, InvalidValue


class StateCache:
    """Copies of state by key, in memory or as files ``state_<key>_<id>.<suffix>`` in ``cache_dir``
    (the system's temporary folder by default) that subclasses write and read."""

    suffix = ""

    def __init__(self, in_memory: bool, cache_dir: str | None = None):
        self.in_memory = in_memory
        self.cache_dir = tempfile.gettempdir() if cache_dir is None else cache_dir
        if not os.path.isdir(self.cache_dir):
            raise InvalidValue(f"Given `cache_dir` is not a valid directory: {self.cache_dir!r}")
        self.cached: dict = {}
        weakref.finalize(self, _remove_files, self.cached, in_memory)

    def store(self, key: str, state) -> None:
        if self.in_memory:
            self.cached[key] = copy.deepcopy(state)
        else:
            path = os.path.join(self.cache_dir, f"state_{key}_{id(self)}{self.suffix}")
            self._write(state, path)
            self.cached[key] = path

    def retrieve(self, key: str):
        if key not in self.cached:
            raise KeyError(f"Target {key} was not cached.")
        if self.in_memory:
            # A copy: torch's optimizer.load_state_dict keeps the very tensors it is given and
            # updates them in place, which would corrupt the cache for the next reset().
            return copy.deepcopy(self.cached[key])
        path = self.cached[key]
        if not os.path.exists(path):
            raise InvalidState(f"Failed to load state in {path}. File doesn't exist anymore.")
        return self._read(path)

    def _write(self, state, path: str) -> None:
        raise NotImplementedError

    def _read(self, path: str):
        raise NotImplementedError


def _remove_files(cached: dict, in_memory: bool) -> None:
    if not in_memory:
        for path in cached.values():
            if os.path.exists(path):
                os.remove(path)
