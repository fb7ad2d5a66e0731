"""The shards of a sharded commit: PyTorch Distributed Checkpoint (DCP) over a storage layer of
aikit's own that holds data, never code.

A model sharded with FSDP2 (or any DTensor) has no rank that holds all of it, so every rank
writes its own shards: :func:`save` runs ``torch.distributed.checkpoint.save`` with
:class:`ShardWriter`, and :func:`load` runs ``torch.distributed.checkpoint.load`` with
:class:`ShardReader`. DCP's planner decides which rank writes which chunk (a replicated chunk
once) and, at load, which stored chunks fill each rank's part of each tensor in the world that
loads, of any size: that is the resharding.

DCP's own ``FileSystemWriter`` pickles its ``.metadata`` file and ``torch.save``\\ s every
non-tensor, and its reader unpickles both. Here nothing is pickled: each rank's shard file
(``rank-00001.<token>.bin``) holds the raw bytes of its chunks one after the other, and what DCP
needs to read them back (each tensor's global size and dtype, where each chunk lies, its
SHA-256) is JSON that the caller keeps in the commit's marker
(:mod:`aikit.elastic.Torch.checkpoint`). The reader rebuilds DCP's ``Metadata`` from that JSON,
checks a file's size and a chunk's SHA-256 before its bytes are used, and refuses any item
that is not a tensor before DCP's planner could ``torch.load`` it; the writer refuses them
before the planner could ``torch.save`` them. Every byte of a shard file belongs to one chunk,
so a changed byte anywhere is caught by a rank that reads it, and DCP's gather of every rank's
result makes every rank fail alike.

DCP takes any object with the storage methods; these classes do not subclass its ABCs, so that
``import aikit.elastic.Torch`` does not load DCP (0.2 s, 0.7 s with DTensor): it is imported by
the first sharded commit or restore, when the model's DTensors have loaded DTensor already.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

from aikit.core.errors import AikitError, CheckpointError, CommitError

FORMAT = "aikit-shards/1"


def dtensor_type() -> type | tuple:
    """DTensor's class, or ``()`` (an isinstance() that is always False) when no DTensor exists
    in this process: a sharded model has imported it, so it is never imported here."""
    module = sys.modules.get("torch.distributed.tensor")
    return module.DTensor if module is not None else ()


# ---- writing -------------------------------------------------------------------------------


class ShardWriter:
    """A DCP storage writer: this rank's chunks raw into one file of ``directory``.

    ``failure`` (an error this rank met before saving) stops every rank before anything is
    written; ``before_write()`` runs on the coordinator before any rank writes (a refusal
    there stops them all too); ``on_finish(index)`` runs on the coordinator once every rank's
    file is written, with the JSON index of every chunk: where the marker is written.
    """

    def __init__(self, directory: Path, token: str, *, fsync: bool, failure: BaseException | None = None,
                 before_write=None, on_finish=None):
        self.directory, self.token, self.fsync, self.failure = directory, token, fsync, failure
        self.before_write, self.on_finish = before_write, on_finish
        self.rank = 0

    def reset(self, checkpoint_id=None) -> None:
        pass

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.rank = kwargs.get("rank", 0)

    def storage_meta(self):
        return None

    def prepare_local_plan(self, plan):
        if self.failure is not None:
            raise self.failure
        return plan

    def prepare_global_plan(self, plans):
        if self.before_write is not None:
            self.before_write()
        return plans

    def write_data(self, plan, planner):
        from torch.distributed.checkpoint.planner import WriteItemType
        from torch.distributed.checkpoint.storage import WriteResult
        from torch.futures import Future

        name = f"rank-{self.rank:05d}.{self.token}.bin"
        results, offset, path = [], 0, self.directory / name
        for item in plan.items:
            if item.type == WriteItemType.BYTE_IO:  # DCP's planner would torch.save it
                raise CheckpointError(f"the sharded state holds a non-tensor at {item.index.fqn}: aikit keeps "
                                      "those in the commit's JSON, never pickled")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as f:
                for item in plan.items:
                    raw = _raw_bytes(planner.resolve_data(item))
                    f.write(raw)
                    results.append(WriteResult(index=item.index, size_in_bytes=len(raw), storage_data={
                        "file": name, "offset": offset, "nbytes": len(raw),
                        "sha256": hashlib.sha256(raw).hexdigest()}))
                    offset += len(raw)
                if self.fsync:
                    f.flush()
                    os.fsync(f.fileno())
        except OSError as error:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
            raise CommitError(f"rank {self.rank} could not write its shards to {path}: {error.strerror or error}") \
                from error
        future = Future()
        future.set_result(results)
        return future

    def finish(self, metadata, results) -> None:
        storage = {result.index: result.storage_data for rank in results for result in rank}
        sizes: dict[str, int] = {}
        for data in storage.values():
            sizes[data["file"]] = sizes.get(data["file"], 0) + data["nbytes"]
        if self.fsync:
            fsync_directory(self.directory)
        index = {"format": FORMAT, "directory": self.directory.name, "files": dict(sorted(sizes.items())),
                 "tensors": _metadata_to_json(metadata, storage)}
        if self.on_finish is not None:
            self.on_finish(index)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return False  # chosen explicitly, never by DCP's guess


def _raw_bytes(tensor: torch.Tensor) -> bytes:
    """The bytes of ``tensor`` (any dtype, any layout in memory), in C order."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def fsync_directory(directory: Path) -> None:
    """Make a rename or a new file in ``directory`` survive a crash of the host."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _metadata_to_json(metadata, storage: dict) -> dict[str, dict]:
    from torch.distributed.checkpoint.metadata import MetadataIndex, TensorStorageMetadata

    tensors = {}
    for key, meta in metadata.state_dict_metadata.items():
        if not isinstance(meta, TensorStorageMetadata):
            raise CheckpointError(f"the sharded state holds a non-tensor at {key}")
        chunks = [{"offsets": list(chunk.offsets), "sizes": list(chunk.sizes),
                   **storage[MetadataIndex(key, chunk.offsets)]} for chunk in meta.chunks]
        tensors[key] = {"dtype": str(meta.properties.dtype).removeprefix("torch."), "size": list(meta.size),
                        "chunks": chunks}
    return tensors


def save(tensors: dict[str, torch.Tensor], directory: Path, token: str, *, fsync: bool,
         failure: BaseException | None = None, before_write=None, on_finish=None) -> None:
    """Every rank's part of ``tensors`` (the same keys on every rank) into ``directory``, files
    named with ``token``; a collective. See :class:`ShardWriter` for the rest. An error on any
    rank is raised on every rank, as aikit's error when it is one."""
    import torch.distributed.checkpoint as dcp

    writer = ShardWriter(directory, token, fsync=fsync, failure=failure, before_write=before_write,
                         on_finish=on_finish)
    with _same_error_everywhere():
        dcp.save(tensors, storage_writer=writer)


# ---- reading -------------------------------------------------------------------------------


class ShardReader:
    """A DCP storage reader of the chunks ``index`` (the JSON :class:`ShardWriter` made) names,
    from the files in ``directory``: each file's size and each chunk's SHA-256 checked before
    its bytes are used."""

    def __init__(self, directory: Path, index: dict):
        self.directory, self.index = directory, index
        self.metadata, self.storage = _metadata_from_json(index)
        self.checked: set[str] = set()

    def reset(self, checkpoint_id=None) -> None:
        pass

    def read_metadata(self):
        return self.metadata

    def set_up_storage_reader(self, metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def read_data(self, plan, planner):
        from torch.distributed.checkpoint.planner import LoadItemType
        from torch.futures import Future

        by_chunk: dict[Any, list] = {}
        for item in plan.items:
            if item.type != LoadItemType.TENSOR:  # DCP's planner would torch.load it
                raise CheckpointError(f"the sharded checkpoint holds bytes at {item.storage_index.fqn}: aikit "
                                      "never unpickles them")
            by_chunk.setdefault(item.storage_index, []).append(item)
        for where, items in by_chunk.items():
            stored = self._chunk(where)
            for item in items:
                part = stored
                for dim, (start, length) in enumerate(zip(item.storage_offsets, item.lengths, strict=True)):
                    part = part.narrow(dim, start, length)
                target = planner.resolve_tensor(item).detach()
                target.copy_(part)
                planner.commit_tensor(item, target)
        future = Future()
        future.set_result(None)
        return future

    def _chunk(self, where) -> torch.Tensor:
        """One stored chunk, whole, after its file's size and its SHA-256 are checked."""
        info = self.storage[where]
        path = self.directory / info["file"]
        try:
            if info["file"] not in self.checked:
                size, wrote = path.stat().st_size, self.index["files"][info["file"]]
                if size != wrote:
                    raise CheckpointError(f"shard {path} has {size} bytes, its commit wrote {wrote} (a truncated "
                                          "or partial copy)")
                self.checked.add(info["file"])
            with open(path, "rb") as f:
                f.seek(info["offset"])
                raw = f.read(info["nbytes"])
        except OSError as error:
            raise CheckpointError(f"shard {path} cannot be read: {error.strerror or error}") from error
        if len(raw) != info["nbytes"] or hashlib.sha256(raw).hexdigest() != info["sha256"]:
            raise CheckpointError(f"shard {path} is corrupt: the SHA-256 of its chunk of {where.fqn} at offsets "
                                  f"{list(where.offset)} does not match its content (a changed byte or a partial copy)")
        if not raw:
            return torch.empty(info["sizes"], dtype=info["dtype"])
        return torch.frombuffer(bytearray(raw), dtype=info["dtype"]).reshape(info["sizes"])

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return False


def dtype_named(name: object) -> torch.dtype:
    """The torch dtype a checkpoint names (``"float64"``), or a :class:`CheckpointError`."""
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"the sharded checkpoint names an unknown dtype {name!r:.60}")
    return dtype


def _metadata_from_json(index: dict):
    """DCP's ``Metadata`` and every chunk's place, from the JSON index (checked as it is read)."""
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    state, storage = {}, {}
    try:
        for key, meta in index["tensors"].items():
            dtype = dtype_named(meta["dtype"])
            chunks = []
            for chunk in meta["chunks"]:
                offsets, sizes = torch.Size(chunk["offsets"]), torch.Size(chunk["sizes"])
                chunks.append(ChunkStorageMetadata(offsets=offsets, sizes=sizes))
                name = _file_name(chunk["file"], index["files"])
                storage[MetadataIndex(key, offsets)] = {
                    "file": name, "offset": int(chunk["offset"]), "nbytes": int(chunk["nbytes"]),
                    "sha256": str(chunk["sha256"]), "dtype": dtype, "sizes": sizes}
            state[key] = TensorStorageMetadata(properties=TensorProperties(dtype=dtype), size=torch.Size(meta["size"]),
                                               chunks=chunks)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise CheckpointError(f"the sharded checkpoint's index is malformed: {error!r:.200}") from error
    return Metadata(state_dict_metadata=state), storage


def _file_name(name: object, files: dict) -> str:
    """A shard file's name, listed in the index and never a path out of the shard directory."""
    if not isinstance(name, str) or name not in files or os.sep in name or "/" in name or name in ("", ".", ".."):
        raise CheckpointError(f"the sharded checkpoint names a shard file {name!r:.80} it does not list")
    return name


def load(destinations: dict[str, torch.Tensor], directory: Path, index: dict) -> None:
    """Fill ``destinations`` (this rank's tensors in the world that loads: DTensors, or whole
    tensors for an unsharded model; the same keys on every rank) from one commit's shards; a
    collective. A corrupt, truncated or missing shard on any rank is a :class:`CheckpointError`
    on every rank."""
    import torch.distributed.checkpoint as dcp

    reader = ShardReader(directory, index)
    with _same_error_everywhere():
        dcp.load(destinations, storage_reader=reader)


@contextlib.contextmanager
def _same_error_everywhere():
    """DCP gathers every rank's failure into one ``CheckpointException`` raised on every rank:
    raise instead the lowest failing rank's own error when it is aikit's (the same on every
    rank, naming the other ranks that failed), else a :class:`CheckpointError` with DCP's report.
    DCP's warning that it runs in one process is silenced: a commit loaded without a process
    group (one process evaluating a sharded run's commit) is meant."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
            yield
    except CheckpointException as exception:
        failures = sorted(exception.failures.items())
        for rank, (error, _) in failures:
            if isinstance(error, AikitError):
                others = [r for r, _ in failures if r != rank]
                also = f" (ranks {others} failed too)" if others else ""
                raise type(error)(f"{error}{also}") from None
        raise CheckpointError(f"a sharded checkpoint failed on ranks {[r for r, _ in failures]}: "
                              f"{exception}") from None
