"""Where ElasticState's commits go, and whose commits it may replace.

A replicated commit (the replicas are equal after an update) is written by rank 0 alone, atomically
(:mod:`aikit.elastic.Torch.checkpoint`). A sharded one (a model sharded with FSDP2 holds no rank
with all of it) is written by every rank, its shards through PyTorch Distributed Checkpoint
(:mod:`aikit.elastic.Torch.sharded`), and rank 0, once every rank's are written, writes the
commit file that names them all: the marker, so a commit killed before it is no commit. A refusal
or a failure on any rank fails the commit on every rank, before the marker.

A commit never replaces or deletes a commit its run does not know: ``restore()`` learns the
directory's commits, and a commit is refused when another run wrote there since (or when a run
that never restored would write over newer commits); ``overwrite=True`` starts over there.
Where the engine checks for a resize after every commit with every worker (Horovod elastic),
every worker must commit equally often (:func:`check_every_worker_commits`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from aikit.core.errors import AikitError, CommitError, InvalidValue
from aikit.elastic.Torch import checkpoint, sharded
from aikit.elastic.Torch.encoding import encode, with_entry
from aikit.runtime.Torch import distributed


class CommitStorage:
    """ElasticState's writing of its commits into its ``directory`` (with its ``fsync`` and
    ``overwrite`` settings, and its ``restored_commit`` named in a refusal), and the directory's
    commits it knows: on rank 0, what ``restore()`` saw and what it wrote since. A mixin: the
    directory and the settings are the state's own attributes."""

    _known: dict[int, tuple] | None = None  # None: this run never restored
    _since = 0  # the commit this run last restored or wrote

    def _learn_commits(self, listing: dict[int, tuple], since: int) -> None:
        """What ``restore()`` found in the directory: these commits, ``since`` the newest restored."""
        self.__dict__.update(_known=listing, _since=since)

    def _write_commit(self, number: int, payload: Callable[[], dict], sharded: bool) -> None:
        """Write commit ``number``: ``payload()`` made and written by rank 0, or, ``sharded``,
        by every rank (a collective)."""
        if sharded:
            self._write_shards(number, payload)
        elif distributed.rank() == 0:
            encoded = encode(payload())
            self._refuse_unknown_commits(number)
            self._wrote(number, checkpoint.write_encoded(self.directory, number, encoded, fsync=self.fsync))

    def _write_shards(self, number: int, payload: Callable[[], dict]) -> None:
        """Every rank writes its shards; rank 0, once every rank's are written, the commit file
        that names them all (the marker: a commit killed before it is no commit). A refusal or
        a failure on any rank fails the commit on every rank, before the marker."""
        shards, failure, encoded = {}, None, None
        try:
            encoded = encode(payload(), sharded=shards)
        except AikitError as error:  # every rank must hear of it: DCP's first gather carries it
            failure = error
        folder = checkpoint.shard_directory(self.directory, number)

        def write_marker(index: dict) -> None:
            marker = with_entry(encoded, "sharded", index)
            path = checkpoint.write_encoded(self.directory, number, marker, fsync=self.fsync,
                                            shards=(folder.name, set(index["files"])))
            self._wrote(number, path)

        sharded.save(shards, folder, f"{time.time_ns():x}", fsync=self.fsync, failure=failure,
                     before_write=lambda: self._refuse_unknown_commits(number), on_finish=write_marker)

    def _refuse_unknown_commits(self, number: int) -> None:
        """Refuse to write commit ``number`` over commits this state does not know (rank 0):
        a second run that forgot ``restore()``, or another live ElasticState on the directory."""
        if self.overwrite:
            return
        unknown = checkpoint.unknown_commits(self.directory, number, self._known, self._since)
        if not unknown:
            return
        listed = ", ".join(map(str, unknown))
        if self._known is None:
            raise CommitError(
                f"commit {number} would replace or delete commit(s) {listed} in {self.directory}, which this "
                "ElasticState did not restore: call state.restore() before training to go on from them, pass "
                "ElasticState(..., overwrite=True) to start over there, or give it another directory")
        raise CommitError(
            f"commit(s) {listed} in {self.directory} were written by another ElasticState after this one "
            f"{'restored' if self._since == self.restored_commit else 'committed'} commit {self._since}: two runs "
            "cannot share a directory. Stop one of them; to go on from the other's commits, restore() again")

    def _wrote(self, number: int, path: Path) -> None:
        """Rank 0 wrote commit ``number``: it is known, and the next commit goes on from it."""
        known = {n: identity for n, identity in (self._known or {}).items() if n >= number - 1}
        known.update({n: identity for n, identity in checkpoint.commit_listing(self.directory).items()
                      if n == number})
        self.__dict__.update(_known=known, _since=number)


def refuse_a_file(directory: Path) -> None:
    """A checkpoint directory that is a file (or lies under one) is refused when the state is
    built: read-only, no file is made."""
    for path in (directory, *directory.parents):
        if path.exists():
            if not path.is_dir():
                where = "is a file" if path == directory else f"lies under {path}, a file"
                raise InvalidValue(f"ElasticState's directory {directory} {where}, not a directory: give a "
                                   "directory (it is created at the first commit)")
            return


def check_every_worker_commits(optimizer) -> None:
    """Where the engine's host check after a commit is a collective (Horovod elastic), every worker
    must commit equally often; a worker with no micro-batch in a step makes that update inside
    another ``step()`` call and would commit less often than the others (``optimizer``: the
    trace optimizer, or None)."""
    if optimizer is None:
        return
    plan, workers = optimizer.epoch_schedule, distributed.world_size()
    short = np.flatnonzero(plan.micro_batches_per_step < workers)
    if short.size:
        step = int(short[0])
        raise InvalidValue(
            f"under Horovod elastic every worker must get a micro-batch in every step, but step {step} of "
            f"epoch {plan.epoch} (global batch {int(plan.batch_sizes[step])}) has "
            f"{int(plan.micro_batches_per_step[step])} micro-batch(es) of {plan.micro_size(step)} for {workers} "
            f"workers: use a micro_batch that divides every batch size and is at most "
            f"{int(plan.batch_sizes.min())} / (--max-np)"
        )
