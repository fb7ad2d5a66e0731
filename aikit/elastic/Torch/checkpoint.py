"""ElasticState's commit files in a directory: data, never code.

One commit is one file, ``aikit_state.<commit>.safetensors``, whose bytes
:mod:`aikit.elastic.Torch.encoding` makes and reads (safetensors + JSON + SHA-256, no pickle); a
sharded commit's shards lie beside it in ``aikit_state.<commit>.shards``
(:mod:`aikit.elastic.Torch.sharded`).

``write`` is atomic (a temporary file, then ``os.replace``) and keeps the new commit and the one
before; a commit that fails changes nothing and says why. ``read_latest`` checks the digest and
falls back, loudly, to the previous commit when the newest one is corrupt or truncated.
``commit_listing`` and ``unknown_commits`` tell a run which commits there it does not know.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import NamedTuple

from aikit.core.errors import CheckpointError, CommitError
from aikit.elastic.Torch.encoding import Encoded, encode, parse, serialize
from aikit.elastic.Torch.sharded import fsync_directory

LEGACY = "aikit_state.pt"  # aikit 0.1 pickled here; never loaded
_NAME = re.compile(r"aikit_state\.(\d+)\.safetensors")
_SHARDS = re.compile(r"aikit_state\.(\d+)\.shards")


class CorruptCheckpointWarning(UserWarning):
    """The newest commit could not be read; an earlier one was restored instead."""


def commit_path(directory: str | os.PathLike, number: int) -> Path:
    return Path(directory) / f"aikit_state.{number:09d}.safetensors"


def shard_directory(directory: str | os.PathLike, number: int) -> Path:
    """Where the shards of a sharded commit ``number`` lie (one file per rank that holds any),
    beside its marker, the commit file, which is written last."""
    return Path(directory) / f"aikit_state.{number:09d}.shards"


def commit_files(directory: str | os.PathLike) -> list[tuple[int, Path]]:
    """``(commit, path)`` of every commit file in ``directory``, newest first."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = [(int(m.group(1)), Path(directory) / n) for n in names if (m := _NAME.fullmatch(n))]
    return sorted(found, reverse=True)


def newest_file(directory: str | os.PathLike) -> Path | None:
    """The newest commit file in ``directory``, intact or not (None when there is none)."""
    found = commit_files(directory)
    return found[0][1] if found else None


# ---- writing -------------------------------------------------------------------------------


def write(directory: str | os.PathLike, number: int, payload: dict, *, fsync: bool = True) -> Path:
    """Write ``payload`` as commit ``number``; keep it and the commit before, remove the rest.

    An unsupported value is refused before anything touches the disk; a write that fails (disk
    full, read-only, ...) removes its temporary file and raises :class:`CommitError`, so the
    directory holds exactly what it held before.
    """
    return write_encoded(directory, number, encode(payload), fsync=fsync)


def write_encoded(directory: str | os.PathLike, number: int, encoded: Encoded, *, fsync: bool = True,
                  shards: tuple[str, set[str]] | None = None) -> Path:
    """Write an encoded payload as commit ``number`` (see :func:`write`). ``shards``: the
    commit's shard directory and the files in it that it uses (what else is there is left by a
    commit attempt that failed, and goes)."""
    blob = serialize(encoded)
    directory = Path(directory)
    path = commit_path(directory, number)
    tmp = directory / f".{path.name}.{os.getpid()}.tmp"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(blob)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if fsync:
            fsync_directory(directory)
    except OSError as error:
        with contextlib.suppress(OSError):  # a read-only or vanished directory holds no temporary file
            tmp.unlink(missing_ok=True)
        raise CommitError(f"commit {number} could not be written to {path}: {_cause(error)}") from error
    _prune(directory, number, shards)
    return path


def _cause(error: OSError) -> str:
    fixes = {
        errno.ENOSPC: "the disk is full: free space there or give ElasticState another directory",
        errno.EDQUOT: "the disk quota is used up: free space there or give ElasticState another directory",
        errno.EROFS: "the file system is read-only: give ElasticState a writable directory",
        errno.EACCES: "permission denied: give ElasticState a directory this process may write",
        errno.EPERM: "permission denied: give ElasticState a directory this process may write",
    }
    return fixes.get(error.errno, f"{error.strerror or error} ({type(error).__name__})")


def _prune(directory: Path, number: int, shards: tuple[str, set[str]] | None = None) -> None:
    """Keep commit ``number`` and the newest one before it; remove older commits and newer ones
    (only ever ones its run was allowed to replace: :func:`unknown_commits`), temporary files of
    commits killed half way, and shard directories of commits not kept (with the files of
    failed attempts in the one of ``number``)."""
    found = commit_files(directory)
    kept = {number, *sorted(n for n, _ in found if n < number)[-1:]}
    doomed = [path for n, path in found if n not in kept]
    names = os.listdir(directory)
    doomed += [directory / n for n in names if n.startswith(".aikit_state.") and n.endswith(".tmp")]
    for name in names:
        match = _SHARDS.fullmatch(name)
        if match and int(match.group(1)) not in kept:
            doomed.append(directory / name)
    if shards is not None:
        folder, used = shards
        with contextlib.suppress(OSError):
            doomed += [directory / folder / n for n in os.listdir(directory / folder) if n not in used]
    for path in doomed:
        try:
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
        except OSError as error:
            warnings.warn(f"aikit: could not remove the old checkpoint file {path}: {error}", stacklevel=3)


# ---- reading -------------------------------------------------------------------------------


def read(path: str | os.PathLike) -> dict:
    """The payload of one commit file; :class:`CheckpointError` naming the file and why if it
    is not an intact aikit commit. Only JSON is parsed and bytes copied: nothing runs."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise CheckpointError(f"checkpoint {path} cannot be read: {error.strerror or error}") from error
    return parse(raw, path)


def folder_name(name: object) -> str:
    """A sharded commit's shard directory as its marker names it: a name in the commit's
    directory, never a path elsewhere."""
    if not isinstance(name, str) or not _SHARDS.fullmatch(name):
        raise CheckpointError(f"a sharded commit names its shard directory {name!r:.80}, not an aikit one")
    return name


class Latest(NamedTuple):
    """What :func:`latest` found: the newest intact commit's payload (None: none at all), the
    warnings about newer commits passed over, and every commit file there with its identity."""

    payload: dict | None
    notes: list[str]
    listing: dict[int, tuple[int, int, int]]


def latest(directory: str | os.PathLike, passed_over: dict[int, str] | None = None) -> Latest:
    """The newest intact commit in ``directory`` but those in ``passed_over`` (commit number:
    why, e.g. a corrupt shard), with a warning for each newer commit passed over; if no
    commit is intact, :class:`CheckpointError` lists why for each. Warns nothing itself: every
    rank warns the same (``ElasticState.restore()``)."""
    passed_over = passed_over or {}
    listing = commit_listing(directory)
    found = commit_files(directory)
    legacy = Path(directory) / LEGACY
    if not found and legacy.exists():
        raise CheckpointError(
            f"checkpoint {legacy} is in aikit 0.1's pickle format, which aikit no longer loads: unpickling a file "
            "runs whatever code it names. Start from an empty directory (or load it yourself with "
            "torch.load(weights_only=True) if you trust its author)"
        )
    failures = []
    for number, path in found:
        if number in passed_over:
            failures.append(f"commit {number} ({path}) cannot be restored: {passed_over[number]}")
            continue
        try:
            payload = read(path)
        except CheckpointError as error:
            failures.append(str(error))
            continue
        notes = [f"aikit: {failure}; restoring the previous commit {path}" for failure in failures]
        return Latest(payload, notes, listing)
    if failures:
        raise CheckpointError("no intact commit to restore:\n  " + "\n  ".join(failures)
                              + "\nremove the directory's aikit_state.* files to start over")
    return Latest(None, [], listing)


def read_latest(directory: str | os.PathLike) -> dict | None:
    """The newest intact commit in ``directory`` (None when there is none). A corrupt newer
    commit is reported with a :class:`CorruptCheckpointWarning` (path and reason) and passed
    over; if no commit is intact, :class:`CheckpointError` lists why for each."""
    found = latest(directory)
    for note in found.notes:
        warnings.warn(CorruptCheckpointWarning(note), stacklevel=2)
    return found.payload


# ---- who else writes here ------------------------------------------------------------------


def commit_listing(directory: str | os.PathLike) -> dict[int, tuple[int, int, int]]:
    """Every commit file in ``directory`` with its identity (inode, size, modification time):
    a file another writer put there, even under a number seen before, has another identity."""
    listing = {}
    for number, path in commit_files(directory):
        with contextlib.suppress(FileNotFoundError):  # pruned meanwhile
            stat = path.stat()
            listing[number] = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
    return listing


def unknown_commits(directory: str | os.PathLike, number: int, known: dict[int, tuple] | None,
                    since: int) -> list[int]:
    """The commits in ``directory`` that committing ``number`` would replace or delete, or that
    are newer than commit ``since``, and that the committing run does not know (``known``: what
    its restore saw and what it wrote since; None: it never restored). Never-restored runs may
    only add commits newer than every commit there."""
    listing = commit_listing(directory)
    if known is None:
        return sorted(n for n in listing if n >= number)
    return sorted(n for n, identity in listing.items() if n >= min(number, since) and known.get(n) != identity)
