"""ElasticState's checkpoint files: loading never runs code, every commit is checked, a corrupt
newest commit falls back loudly to the one before, and a failed commit changes nothing."""

from __future__ import annotations

import contextlib
import errno
import io
import math
import multiprocessing
import os
import pickle
import random
import signal
import subprocess
import time

import numpy as np
import pytest
import torch

from aikit.core.errors import AikitError, CheckpointError, CommitError, InvalidType
from aikit.elastic.Torch import checkpoint
from aikit.elastic.Torch.checkpoint import CorruptCheckpointWarning
from aikit.elastic.Torch.resize import ElasticState


def make_state(directory, fill: float = 0.0, **values) -> ElasticState:
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(fill)
    return ElasticState(directory, model=model, verbose=False, **values)


def commit_numbered(directory, number: int) -> None:
    """Commit ``number`` of a run whose weights and ``value`` are all ``number``."""
    state = make_state(directory, float(number), value=number)
    state.commits = number - 1
    state.commit()


def restored(directory) -> tuple[int, float, int]:
    """(commit, weight, value) of what restore() loads; the three agree for an intact commit."""
    state = make_state(directory, -1.0, value=None)
    assert state.restore()
    weights = {float(v) for p in state.model.parameters() for v in p.detach().flatten()}
    assert len(weights) == 1
    return state.commits, weights.pop(), state.value


# ---- loading is not executing ----------------------------------------------------------------


class Hostile:
    """What an attacker puts in a pickle: unpickling it creates the marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("name", [checkpoint.LEGACY, "aikit_state.000000007.safetensors"])
def test_a_hostile_pickle_is_refused_and_never_runs(tmp_path, name):
    marker = tmp_path / "marker"
    torch.save({"format": 1, "objects": Hostile(marker)}, tmp_path / name)
    with pytest.raises(CheckpointError, match=rf"checkpoint {tmp_path / name} .*(pickle|never unpickles)"):
        make_state(tmp_path).restore()
    assert not marker.exists()
    pickle.loads(pickle.dumps(Hostile(marker)))  # the payload does run when unpickled: the test can fail
    assert marker.exists()


# ---- what a commit can hold -------------------------------------------------------------------


def test_every_kind_of_value_comes_back_exactly(tmp_path):
    base = torch.arange(12.0).reshape(3, 4)
    shared = torch.randn(4)
    value = {
        "ints": [0, -1, 2**63 - 1, 2**63, 10**30], "floats": (0.1, -0.0, math.inf, -math.inf, 1e-310),
        "text": "ü\n\"sha\"", "flags": (True, False, None), 7: "int key", (1, "a"): "tuple key", 2.5: "float key",
        "numpy_rng": np.random.get_state(), "python_rng": random.getstate(),
        "arrays": [np.arange(5, dtype=np.uint32), np.array([1.5], dtype=">f8"), np.float32(0.25), np.int64(-3)],
        "tensors": [torch.tensor([1.0], dtype=torch.bfloat16), base[:, 1], base.t(), shared, shared,
                    torch.get_rng_state(), torch.tensor(True), torch.zeros(0, 3)],
    }
    checkpoint.write(tmp_path, 1, {"value": value})
    back = checkpoint.read_latest(tmp_path)["value"]
    assert list(back) == list(value)
    for key in ("ints", "floats", "text", "flags", 7, (1, "a"), 2.5, "python_rng"):
        assert back[key] == value[key] and type(back[key]) is type(value[key])
    assert math.copysign(1, back["floats"][1]) == -1
    state, again = value["numpy_rng"], back["numpy_rng"]
    assert type(again) is tuple and again[0] == state[0] and np.array_equal(again[1], state[1])
    assert again[1].dtype == np.uint32 and again[2:] == state[2:]
    for got, want in zip(back["arrays"], value["arrays"], strict=True):
        assert type(got) is type(want) and got.dtype == want.dtype and np.array_equal(got, want)
    for got, want in zip(back["tensors"], value["tensors"], strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_a_module_state_dict_keeps_its_version_metadata(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    checkpoint.write(tmp_path, 1, {"model": model.state_dict()})
    back = checkpoint.read_latest(tmp_path)["model"]
    assert back._metadata == model.state_dict()._metadata and list(back) == list(model.state_dict())


@pytest.mark.parametrize("value, what", [
    ({1, 2}, r"objects\['best'\]: a builtins.set .*; convert it to those, or keep an object with state_dict"),
    ([1, lambda: 0], r"objects\['best'\]\[1\]: a builtins.function"),
    ({"k": object()}, r"objects\['best'\]\['k'\]: a builtins.object"),
    ({frozenset(): 1}, r"objects\['best'\]: its key frozenset\(\) is a frozenset; keys must be"),
    (torch.zeros(3).to_sparse(), r"objects\['best'\]: a torch.sparse_coo tensor"),
    (np.array(["a"]), r"objects\['best'\]: a numpy.ndarray"),
])
def test_a_value_a_checkpoint_cannot_hold_is_refused_and_nothing_changes(tmp_path, value, what):
    state = make_state(tmp_path, best=0)
    state.commit()
    state.best = value
    with pytest.raises(InvalidType, match=what):
        state.commit()
    assert state.commits == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["aikit_state.000000001.safetensors"]


# ---- integrity and fallback ---------------------------------------------------------------


def test_the_last_two_commits_are_kept_and_stale_temporary_files_removed(tmp_path):
    (tmp_path / ".aikit_state.000000003.safetensors.4242.tmp").write_bytes(b"killed half way")
    for number in range(1, 6):
        commit_numbered(tmp_path, number)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "aikit_state.000000004.safetensors", "aikit_state.000000005.safetensors"]
    assert restored(tmp_path) == (5, 5.0, 5)


def corrupt_latest(directory, how: str) -> None:
    path = checkpoint.commit_files(directory)[0][1]
    raw = bytearray(path.read_bytes())
    if how == "truncated":
        raw = raw[: len(raw) // 2]
    elif how == "empty":
        raw = bytearray()
    elif how == "random":
        raw = bytearray(np.random.default_rng(0).bytes(len(raw)))
    else:  # flip one bit at a byte offset
        raw[int(how)] ^= 1 << (int(how) % 8)
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("how", ["truncated", "empty", "random"])
def test_a_corrupt_latest_commit_is_reported_and_the_previous_one_restored(tmp_path, how):
    commit_numbered(tmp_path, 1)
    commit_numbered(tmp_path, 2)
    corrupt_latest(tmp_path, how)
    with pytest.warns(CorruptCheckpointWarning, match=r"aikit_state.000000002.safetensors is (truncated|corrupt)"
                      r".*restoring the previous commit .*aikit_state.000000001.safetensors"):
        assert restored(tmp_path) == (1, 1.0, 1)


def test_a_bit_flip_anywhere_is_caught(tmp_path):
    """One flipped bit in any byte of a commit file: never restored silently."""
    commit_numbered(tmp_path, 1)
    commit_numbered(tmp_path, 2)
    path = checkpoint.commit_files(tmp_path)[0][1]
    good = path.read_bytes()
    assert checkpoint.parse(good)["commit"] == 2
    for offset in range(len(good)):
        raw = bytearray(good)
        raw[offset] ^= 1 << offset % 8
        with pytest.raises(CheckpointError, match=f"checkpoint {path} "):
            checkpoint.parse(bytes(raw), path)
    corrupt_latest(tmp_path, str(len(good) - 1))  # and restore() passes over it
    with pytest.warns(CorruptCheckpointWarning, match="aikit_state.000000002.safetensors is corrupt: its SHA-256"):
        assert restored(tmp_path) == (1, 1.0, 1)


def test_no_intact_commit_is_an_error_naming_each_file(tmp_path):
    commit_numbered(tmp_path, 1)
    commit_numbered(tmp_path, 2)
    for _, path in checkpoint.commit_files(tmp_path):
        path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=r"no intact commit to restore:\n  checkpoint .*000000002.safetensors "
                       r"is truncated.*\n  checkpoint .*000000001.safetensors is truncated"):
        make_state(tmp_path).restore()


def test_a_safetensors_file_of_someone_else_is_not_taken_for_a_commit(tmp_path):
    import safetensors.torch

    safetensors.torch.save_file({"w": torch.zeros(2)}, tmp_path / "aikit_state.000000001.safetensors")
    with pytest.raises(CheckpointError, match=r"is a safetensors file but not an aikit ElasticState commit"):
        make_state(tmp_path).restore()


# ---- SIGKILL in the middle of commits ---------------------------------------------------------


def _commit_for_ever(directory) -> None:
    """A worker that resumes and then commits as fast as it can, until killed."""
    state = make_state(directory, value=0)
    state.restore()
    while True:
        commit_numbered(directory, state.commits + 1)
        state.commits += 1


def test_sigkill_at_random_moments_always_leaves_a_complete_commit(tmp_path):
    fork = multiprocessing.get_context("fork")
    rng = random.Random(13)
    last = 0
    for _ in range(20):
        worker = fork.Process(target=_commit_for_ever, args=(tmp_path,))
        worker.start()
        time.sleep(rng.uniform(0.05, 0.3))
        os.kill(worker.pid, signal.SIGKILL)
        worker.join()
        commit, weight, value = restored(tmp_path)  # any torn file would raise or warn here
        assert commit == weight == value >= last
        last = commit
    assert last > 20  # the workers did commit between kills
    commit_numbered(tmp_path, last + 1)  # the next whole commit removes what the kills left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"aikit_state.{last:09d}.safetensors", f"aikit_state.{last + 1:09d}.safetensors"]


# ---- a commit that cannot be written ---------------------------------------------------------


def mount_tmpfs(directory, size: str = "64k") -> bool:
    """A real tmpfs of ``size`` at ``directory``; False where mounting is impossible (not root)."""
    directory.mkdir()
    try:
        return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
                              capture_output=True).returncode == 0
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def small_file_system(directory, monkeypatch=None):
    """A 64 KiB file system at ``directory``: a real tmpfs, or, where mounting is impossible and
    ``monkeypatch`` is given, a stand-in whose writes past 64 KiB fail with ENOSPC."""
    if mount_tmpfs(directory):
        try:
            yield directory
        finally:
            subprocess.run(["umount", "-l", str(directory)], check=True)
        return
    if monkeypatch is None:
        pytest.skip("cannot mount a tmpfs here (needs root)")

    class SmallFile(io.FileIO):
        def write(self, data):
            if len(data) > 64 * 1024:
                super().write(bytes(data)[: 64 * 1024])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return super().write(data)

    monkeypatch.setattr(checkpoint, "open", SmallFile, raising=False)
    yield directory


def test_a_full_disk_fails_the_commit_and_changes_nothing(tmp_path, monkeypatch):
    with small_file_system(tmp_path / "small", monkeypatch) as directory:
        state = make_state(directory, best=np.zeros(10))
        state.commit()
        before = sorted(p.name for p in directory.iterdir())
        state.best = np.zeros(100_000)  # 800 kB on a 64 kB disk
        with pytest.raises(CommitError, match=rf"commit 2 could not be written to {directory}/aikit_state.000000002."
                           r"safetensors: the disk is full: free space there or give ElasticState another directory"):
            state.commit()
        assert state.commits == 1
        assert sorted(p.name for p in directory.iterdir()) == before  # no partial temporary file
        again = make_state(directory, best=None)
        assert again.restore() and again.commits == 1 and again.best.shape == (10,)


def test_a_read_only_directory_fails_the_commit_and_changes_nothing(tmp_path):
    with small_file_system(tmp_path / "ro") as directory:
        state = make_state(directory)
        state.commit()
        subprocess.run(["mount", "-o", "remount,ro", str(directory)], check=True)
        with pytest.raises(CommitError, match=r"commit 2 could not be written to .*: the file system is read-only"):
            state.commit()
        assert state.commits == 1 and isinstance(CommitError("x"), (AikitError, OSError))
