"""A commit's bytes: a payload encoded as one safetensors file, and decoded back; data, never code.

The tensors (and NumPy arrays) are stored raw after safetensors' JSON header. Everything else in
the payload (numbers, strings, lists, tuples, dicts, and where each tensor sits in them) is JSON in
the header's metadata, beside a SHA-256 of the whole file but that digest. Decoding parses JSON
and copies bytes: nothing in the file can name a function to call, so a hostile file is refused,
never run (``torch.load`` unpickles, and even ``weights_only=True`` is an unpickler whose
allow-list has had holes). Where the bytes go on disk: :mod:`aikit.elastic.Torch.checkpoint`.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from aikit.core.errors import CheckpointError, InvalidType
from aikit.elastic.Torch.sharded import dtensor_type, dtype_named
from aikit.optional import require

FORMAT = "aikit-state/2"
_DIGEST = "aikit_sha256"
_PLAIN = (type(None), bool, int, float, str)


# ---- encoding ------------------------------------------------------------------------------


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


def serialize(encoded: Encoded) -> bytearray:
    """The safetensors bytes of ``encoded``: its metadata holds the JSON and the digest of all the rest."""
    placeholder = "0" * 64
    blob = bytearray(_safetensors().torch.save(encoded.tensors, metadata={
        "format": FORMAT, "state": encoded.structure, _DIGEST: placeholder}))
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


# ---- decoding ------------------------------------------------------------------------------


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


def _safetensors():
    """safetensors, imported when a commit is written or read (``import aikit.elastic.Torch``
    works without it, e.g. in an XLA environment that never checkpoints)."""
    require("safetensors.torch", "ElasticState's checkpoints (safetensors files)")
    return sys.modules["safetensors"]


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
