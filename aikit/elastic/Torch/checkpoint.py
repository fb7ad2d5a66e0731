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
import warnings
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch

from aikit.core.errors import CheckpointError, CommitError, InvalidType

FORMAT = "aikit-state/2"
LEGACY = "aikit_state.pt"  # aikit 0.1 pickled here; never loaded
_NAME = re.compile(r"aikit_state\.(\d+)\.safetensors")
_DIGEST = "aikit_sha256"
_PLAIN = (type(None), bool, int, float, str)


class CorruptCheckpointWarning(UserWarning):
    """The newest commit could not be read; an earlier one was restored instead."""


def commit_path(directory: str | os.PathLike, number: int) -> Path:
    return Path(directory) / f"aikit_state.{number:09d}.safetensors"


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
    tensors: dict[str, torch.Tensor] = {}
    structure = json.dumps(_encode(payload, "", tensors), separators=(",", ":"))
    blob = _serialize(tensors, structure)
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
            _fsync_directory(directory)
    except OSError as error:
        with contextlib.suppress(OSError):  # a read-only or vanished directory holds no temporary file
            tmp.unlink(missing_ok=True)
        raise CommitError(f"commit {number} could not be written to {path}: {_cause(error)}") from error
    _prune(directory, number)
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


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself survive a crash of the host."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _prune(directory: Path, number: int) -> None:
    """Keep commit ``number`` and the newest one before it; remove older and abandoned newer
    commits (a run that started over) and temporary files of commits killed half way."""
    found = commit_files(directory)
    doomed = [path for n, path in found if n > number] + [path for n, path in found if n < number][1:]
    doomed += [directory / n for n in os.listdir(directory) if n.startswith(".aikit_state.") and n.endswith(".tmp")]
    for path in doomed:
        try:
            path.unlink(missing_ok=True)
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


def _encode(value, where: str, tensors: dict[str, torch.Tensor]):
    """``value`` as JSON: plain values as they are, the rest tagged (``{"tuple": [...]}``,
    ``{"dict": [[key, value], ...]}``, ``{"tensor": name}``, ``{"ndarray": name}``)."""
    if type(value) in _PLAIN:
        return value
    if type(value) is list:
        return [_encode(v, f"{where}[{i}]", tensors) for i, v in enumerate(value)]
    if type(value) is tuple:
        return {"tuple": [_encode(v, f"{where}[{i}]", tensors) for i, v in enumerate(value)]}
    if isinstance(value, dict):
        encoded = {"dict": [[_encode_key(k, where), _encode(v, f"{where}[{k!r}]" if where else str(k), tensors)]
                            for k, v in value.items()]}
        if isinstance(getattr(value, "_metadata", None), dict):  # a module state_dict's versions
            encoded["metadata"] = _encode(value._metadata, f"{where}._metadata", tensors)
        return encoded
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
    raise CheckpointError(f"unknown entry {str(value)[:80]!r} in the checkpoint's state")


def read_latest(directory: str | os.PathLike) -> dict | None:
    """The newest intact commit in ``directory`` (None when there is none). A corrupt newer
    commit is reported with a :class:`CorruptCheckpointWarning` (path and reason) and passed
    over; if no commit is intact, :class:`CheckpointError` lists why for each."""
    found = commit_files(directory)
    legacy = Path(directory) / LEGACY
    if not found and legacy.exists():
        raise CheckpointError(
            f"checkpoint {legacy} is in aikit 0.1's pickle format, which aikit no longer loads: unpickling a file "
            "runs whatever code it names. Start from an empty directory (or load it yourself with "
            "torch.load(weights_only=True) if you trust its author)"
        )
    failures = []
    for _, path in found:
        try:
            payload = read(path)
        except CheckpointError as error:
            failures.append(str(error))
            continue
        for failure in failures:
            warnings.warn(CorruptCheckpointWarning(f"aikit: {failure}; restoring the previous commit {path}"),
                          stacklevel=3)
        return payload
    if failures:
        raise CheckpointError("no intact commit to restore:\n  " + "\n  ".join(failures)
                              + "\nremove the directory's aikit_state.* files to start over")
    return None
