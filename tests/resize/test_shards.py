"""The shard files of a sharded commit, in one process (DCP without a process group): what is
written comes back bit for bit in every dtype, the index is JSON, and a truncated, changed,
missing or misnamed shard, or an item that is not a tensor, is a CheckpointError that names it,
never a pickle read or written."""

from __future__ import annotations

import json

import pytest
import torch

from aikit.core.errors import CheckpointError
from aikit.elastic.Torch import sharded


def tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return {
        "w": torch.randn(5, 3, generator=gen, dtype=torch.float64),
        "half": torch.randn(4, generator=gen).to(torch.bfloat16),
        "count": torch.tensor(7, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 2),
        "strided": torch.arange(12.0).reshape(3, 4).t(),  # not contiguous in memory
    }


def saved(tmp_path) -> dict:
    """``tensors()`` saved into ``tmp_path / "shards"``: the index the marker would hold."""
    index = {}
    sharded.save(tensors(), tmp_path / "shards", "t0", fsync=False, on_finish=index.update)
    return index


def loaded(tmp_path, index: dict) -> dict[str, torch.Tensor]:
    into = {key: torch.full_like(value.contiguous(), 9) for key, value in tensors().items()}
    sharded.load(into, tmp_path / "shards", index)
    return into


def test_every_dtype_comes_back_bit_for_bit_and_the_index_is_json(tmp_path):
    index = saved(tmp_path)
    assert json.loads(json.dumps(index)) == index
    assert index["files"] == {"rank-00000.t0.bin": (tmp_path / "shards" / "rank-00000.t0.bin").stat().st_size}
    back = loaded(tmp_path, index)
    for key, value in tensors().items():
        assert back[key].dtype == value.dtype and torch.equal(back[key], value), key


def test_a_truncated_shard_is_refused_by_its_size(tmp_path):
    index = saved(tmp_path)
    path = tmp_path / "shards" / "rank-00000.t0.bin"
    raw = path.read_bytes()
    path.write_bytes(raw[:-1])
    with pytest.raises(CheckpointError, match=rf"shard {path} has {len(raw) - 1} bytes, its commit wrote {len(raw)} "
                                              r"\(a truncated or partial copy\)"):
        loaded(tmp_path, index)


@pytest.mark.parametrize("where", [0, "middle", -1])
def test_a_changed_byte_anywhere_is_refused_by_its_chunks_sha256(tmp_path, where):
    index = saved(tmp_path)
    path = tmp_path / "shards" / "rank-00000.t0.bin"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2 if where == "middle" else where] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=rf"shard {path} is corrupt: the SHA-256 of its chunk of \w+ at offsets "
                                              r"\[.*\] does not match its content"):
        loaded(tmp_path, index)


def test_a_missing_shard_is_refused(tmp_path):
    index = saved(tmp_path)
    path = tmp_path / "shards" / "rank-00000.t0.bin"
    path.unlink()
    with pytest.raises(CheckpointError, match=rf"shard {path} cannot be read"):
        loaded(tmp_path, index)


def test_an_index_naming_a_file_out_of_the_shard_directory_is_refused(tmp_path):
    index = saved(tmp_path)
    (tmp_path / "outside.bin").write_bytes((tmp_path / "shards" / "rank-00000.t0.bin").read_bytes())
    for meta in index["tensors"].values():
        for chunk in meta["chunks"]:
            chunk["file"] = "../outside.bin"
    index["files"] = {"../outside.bin": index["files"]["rank-00000.t0.bin"]}
    with pytest.raises(CheckpointError, match=r"names a shard file '\.\./outside\.bin' it does not list"):
        loaded(tmp_path, index)


def test_an_item_that_is_not_a_tensor_is_refused_before_it_could_be_pickled(tmp_path):
    with pytest.raises(CheckpointError, match=r"holds a non-tensor at step: aikit keeps those in the commit's JSON, "
                                              r"never pickled"):
        sharded.save({"w": torch.ones(2), "step": 3}, tmp_path / "shards", "t0", fsync=False)
    assert not (tmp_path / "shards").exists()  # refused before a file is made
