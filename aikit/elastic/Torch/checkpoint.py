"""ElasticState's checkpoint files: data, never code.

One commit is one `safetensors <https://huggingface.co/docs/safetensors>`_ file,
``aikit_state.<commit>.safetensors``: the tensors (and NumPy arrays) raw, after a JSON header. Everything
else in the state (numbers, strings, lists, tuples, dicts, and where each tensor sits in them) is
JSON in the header's metadata, beside a SHA-256 of the whole file but that digest. Reading a
commit parses JSON and copies bytes: nothing in the file can name a function to call, so a
hostile file is refused, never run (``torch.load`` unpickles, and even ``weights_only=True`` is
an unpickler whose allow-list has had holes).

``write`` is atomic (a temporary file, then ``os.replace``) and keeps the new commit and the one
before; a commit that fails changes nothing and says why. ``read_latest`` checks the digest and
falls back, loudly, to the previous commit when the newest one is corrupt or truncated.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from aikit.core.errors import CheckpointError, CommitError, InvalidType
from aikit.elastic.Torch.sharded import dtensor_type, dtype_named, fsync_directory

FORMAT = "aikit-state/2"
LEGACY = "aikit_state.pt"  # aikit 0.1 pickled here; never loaded
_NAME = re.compile(r"aikit_state\.(\d+)\.safetensors")
_SHARDS = re.compile(r"aikit_state\.(\d+)\.shards")
_DIGEST = "aikit_sha256"
_PLAIN = (type(None), bool, int, float, str)


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


# ---- writing -------------------------------------------------------------------------------


def write(directory: str | os.PathLike, number: int, payload: dict, *, fsync: bool = True) -> Path:
    """Write ``payload`` as commit ``number``; keep it and the commit before, remove the rest.

    An unsupported value is refused before anything touches the disk; a write that fails (disk
    full, read-only, ...) removes its temporary file and raises :class:`CommitError`, so the
    directory holds exactly what it held before.
    """
    return write_encoded(directory, number, encode(payload), fsync=fsync)


class Encoded(NamedTuple):
    """A payload made ready to write: its JSON and its tensors (safetensors' names for them)."""

    structure: str
    tensors: dict[str, torch.Tensor]


def encode(payload: dict, sharded: dict[str, torch.Tensor] | None = None) -> Encoded:
    """``payload`` as JSON and tensors, or :class:`InvalidType` naming what cannot be kept.

    With ``sharded`` (a dict), every DTensor (a shard of a sharded model's state) goes there
    under the key that stands for it in the JSON, with its global shape and dtype, for the
    caller to write through :mod:`aikit.elastic.Torch.sharded`; without, a DTensor is refused."""
    tensors: dict[str, torch.Tensor] = {}
    structure = json.dumps(_encode(payload, "", tensors, sharded), separators=(",", ":"))
    return Encoded(structure, tensors)


def with_entry(encoded: Encoded, key: str, value) -> Encoded:
    """``encoded`` with one more top-level entry (a sharded commit's index, known once its
    shards are written)."""
    structure, tensors = json.loads(encoded.structure), dict(encoded.tensors)
    structure["dict"].append([key, _encode(value, key, tensors)])
    return Encoded(json.dumps(structure, separators=(",", ":")), tensors)


def write_encoded(directory: str | os.PathLike, number: int, encoded: Encoded, *, fsync: bool = True,
                  shards: tuple[str, set[str]] | None = None) -> Path:
    """Write an encoded payload as commit ``number`` (see :func:`write`). ``shards``: the
    commit's shard directory and the files in it that it uses (what else is there is left by a
    commit attempt that failed, and goes)."""
    blob = _serialize(encoded.tensors, encoded.structure)
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


def _safetensors():
    """safetensors, imported when a commit is written or read (``import aikit.elastic.Torch``
    works without it, e.g. in an XLA environment that never checkpoints)."""
    try:
        import safetensors.torch
    except ImportError:
        raise ImportError("ElasticState's checkpoints are safetensors files: pip install safetensors") from None
    return safetensors


def _serialize(tensors: dict[str, torch.Tensor], structure: str) -> bytearray:
    """safetensors bytes whose metadata holds ``structure`` and the digest of all the rest."""
    placeholder = "0" * 64
    blob = bytearray(_safetensors().torch.save(tensors, metadata={"format": FORMAT, "state": structure,
                                                                _DIGEST: placeholder}))
    header, start = _header(memoryview(blob), len(blob))
    digest = _digest(header, memoryview(blob)[start:])
    at = blob.index(f'"{_DIGEST}":"{placeholder}"'.encode(), 8, start) + len(_DIGEST) + 4
    blob[at:at + 64] = digest.encode()
    return blob


def _digest(header: dict, data) -> str:
    """SHA-256 over the header's content (less the digest) and every data byte."""
    header = dict(header)
    header["__metadata__"] = {k: v for k, v in header["__metadata__"].items() if k != _DIGEST}
    sha = hashlib.sha256(json.dumps(header, sort_keys=True, separators=(",", ":")).encode())
    sha.update(data)
    return sha.hexdigest()


def _encode(value, where: str, tensors: dict[str, torch.Tensor], sharded: dict[str, torch.Tensor] | None = None):
    """``value`` as JSON: plain values as they are, the rest tagged (``{"tuple": [...]}``,
    ``{"dict": [[key, value], ...]}``, ``{"tensor": name}``, ``{"ndarray": name}``, and for a
    DTensor ``{"sharded": key, "shape": [...], "dtype": name}``)."""
    if type(value) in _PLAIN:
        return value
    if type(value) is list:
        return [_encode(v, f"{where}[{i}]", tensors, sharded) for i, v in enumerate(value)]
    if type(value) is tuple:
        return {"tuple": [_encode(v, f"{where}[{i}]", tensors, sharded) for i, v in enumerate(value)]}
    if isinstance(value, dict):
        encoded = {"dict": [[_encode_key(k, where),
                             _encode(v, f"{where}[{k!r}]" if where else str(k), tensors, sharded)]
                            for k, v in value.items()]}
        if isinstance(getattr(value, "_metadata", None), dict):  # a module state_dict's versions
            encoded["metadata"] = _encode(value._metadata, f"{where}._metadata", tensors, sharded)
        return encoded
    if isinstance(value, dtensor_type()):
        if sharded is None:
            raise InvalidType(f"commit() cannot keep {where}: a DTensor (a shard of a sharded model's state) "
                              "outside a kept model or optimizer; ElasticState writes those as shards")
        sharded[where] = value
        return {"sharded": where, "shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, torch.Tensor):
        return {"tensor": _add_tensor(value, where, tensors)}
    if isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind in "biufc":
        array = np.asarray(value)  # its bytes as they are: any dtype and byte order, any torch version
        raw = torch.from_numpy(np.frombuffer(bytearray(array.tobytes()), np.uint8))
        return {"ndarray": _add_tensor(raw, where, tensors), "dtype": array.dtype.str, "shape": list(array.shape),
                "scalar": isinstance(value, np.generic)}
    raise InvalidType(
        f"commit() cannot keep {where}: a {type(value).__module__}.{type(value).__qualname__} is not data a "
        "checkpoint holds (tensors, NumPy arrays, None, bool, int, float, str, and lists, tuples and dicts of "
        "them); convert it to those, or keep an object with state_dict()/load_state_dict()"
    )


def _encode_key(key, where: str):
    if type(key) in _PLAIN:
        return key
    if type(key) is tuple:
        return {"tuple": [_encode_key(k, where) for k in key]}
    raise InvalidType(f"commit() cannot keep {where}: its key {key!r} is a {type(key).__name__}; "
                      "keys must be None, bool, int, float, str or tuples of them")


def _add_tensor(tensor: torch.Tensor, where: str, tensors: dict[str, torch.Tensor]) -> str:
    if tensor.layout != torch.strided or tensor.is_quantized or tensor.is_nested or tensor.device.type == "meta":
        raise InvalidType(f"commit() cannot keep {where}: a {tensor.layout} "
                          f"{'quantized ' if tensor.is_quantized else ''}tensor on {tensor.device}; "
                          "keep a dense tensor (tensor.to_dense())")
    tensor = tensor.detach().to("cpu")
    if (not tensor.is_contiguous() or tensor.storage_offset()
            or tensor.untyped_storage().nbytes() != tensor.nbytes
            or any(t.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr() for t in tensors.values())):
        tensor = tensor.clone(memory_format=torch.contiguous_format)  # safetensors stores no views
    name = str(len(tensors))
    tensors[name] = tensor
    return name


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


def parse(raw: bytes, path: Path | str = "checkpoint") -> dict:
    """The payload in the bytes of a commit file (``path`` names it in errors)."""
    header, start = _header(raw, len(raw), path)
    metadata = header.get("__metadata__")
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT or not isinstance(metadata.get("state"), str):
        raise CheckpointError(f"checkpoint {path} is a safetensors file but not an aikit ElasticState commit "
                              f"(format {metadata.get('format') if isinstance(metadata, dict) else None!r})")
    if metadata.get(_DIGEST) != _digest(header, memoryview(raw)[start:]):
        raise CheckpointError(f"checkpoint {path} is corrupt: its SHA-256 does not match its content (a changed "
                              "byte, a partial copy or a truncated file)")
    safetensors = _safetensors()
    try:
        tensors = safetensors.torch.load(bytes(raw))
        return _decode(json.loads(metadata["state"]), tensors)
    except CheckpointError:
        raise
    except (ValueError, TypeError, KeyError, RecursionError, safetensors.SafetensorError) as error:
        raise CheckpointError(f"checkpoint {path} has a valid checksum but cannot be decoded: {error}") from error


def _header(raw: bytes, size: int, path: Path | str = "checkpoint") -> tuple[dict, int]:
    """The safetensors JSON header and where the data starts, checked against the file's size."""
    if size < 8:
        raise CheckpointError(f"checkpoint {path} is truncated: {size} bytes, not even a header")
    length = int.from_bytes(raw[:8], "little")
    if length > size - 8:
        kind = " (a zip/pickle file, as torch.save writes: aikit never unpickles)" if raw[:2] in (b"PK", b"\x80\x02") \
            else ""
        raise CheckpointError(f"checkpoint {path} is truncated or not a safetensors file{kind}: its header claims "
                              f"{length} bytes, the file has {size}")
    try:
        header = json.loads(bytes(raw[8:8 + length]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise CheckpointError(f"checkpoint {path} is corrupt: its header is not valid JSON") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"checkpoint {path} is corrupt: its header is not a JSON object")
    return header, 8 + length


class ShardedRef(NamedTuple):
    """Where a sharded commit's JSON stands for one tensor of its shards: the key the shards
    know it by, its global shape and dtype (what restore() checks before any shard is read)."""

    key: str
    shape: torch.Size
    dtype: torch.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)


def _decode(value, tensors: dict[str, torch.Tensor]):
    if type(value) in _PLAIN:
        return value
    if type(value) is list:
        return [_decode(v, tensors) for v in value]
    tag = next(iter(value)) if type(value) is dict and value else None
    if tag == "tuple":
        return tuple(_decode(v, tensors) for v in value["tuple"])
    if tag == "dict":
        items = {_decode(k, tensors): _decode(v, tensors) for k, v in value["dict"]}
        if "metadata" not in value:
            return items
        state_dict = OrderedDict(items)
        state_dict._metadata = _decode(value["metadata"], tensors)
        return state_dict
    if tag == "tensor":
        return tensors[value["tensor"]]
    if tag == "ndarray":
        raw = tensors[value["ndarray"]].numpy().tobytes()
        array = np.frombuffer(raw, np.dtype(value["dtype"])).reshape(value["shape"]).copy()
        return array[()] if value["scalar"] else array
    if tag == "sharded":
        return ShardedRef(str(value["sharded"]), torch.Size(value["shape"]), dtype_named(value["dtype"]))
    raise CheckpointError(f"unknown entry {str(value)[:80]!r} in the checkpoint's state")


def sharded_refs(value, path: tuple = ()) -> Iterator[tuple[tuple, ShardedRef]]:
    """Every :class:`ShardedRef` in a decoded state, with the keys that lead to it."""
    if isinstance(value, ShardedRef):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from sharded_refs(item, (*path, key))
    elif type(value) in (list, tuple):
        for index, item in enumerate(value):
            yield from sharded_refs(item, (*path, index))


def resolve_refs(value, tensors: dict[str, torch.Tensor]):
    """A decoded state with every :class:`ShardedRef` replaced by ``tensors[ref.key]``."""
    if isinstance(value, ShardedRef):
        return tensors[value.key]
    if isinstance(value, dict):
        resolved = type(value)((key, resolve_refs(item, tensors)) for key, item in value.items())
        if hasattr(value, "_metadata"):
            resolved._metadata = value._metadata
        return resolved
    if type(value) in (list, tuple):
        return type(value)(resolve_refs(item, tensors) for item in value)
    return value


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
