"""A probed adaptive run on two real replicas (torchrun, gloo, float64): each replica trains every
branch of a probe on the whole window alone, from the same all-reduced weights and the same
samples, so both take the same decisions with no collective of the probe's own: the same batches
at the same updates and the same LR, weights equal bit for bit across the ranks, and the run
equals the same probed run in one process (to float64's rounding of the all-reduce). Replicas
that probe on different data (each its own shard of the held-out set) decide differently, and are
refused by name at the next update's all-reduce, on both ranks, before they train apart."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
from adaptive_common import dataset
from probe_worker import EPOCHS
from test_probe_torch import BASE, make_model, probed, train

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def ranks(torchrun, tmp_path_factory):
    out = tmp_path_factory.mktemp("probe")
    torchrun(HERE / "probe_worker.py", out)
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


@pytest.fixture(scope="module")
def alone():
    """The same probed run in one process (rank 0's start)."""
    data, model = dataset(noise=0.1), make_model(seed=0)
    sampler, optimizer = probed(data, model)
    samples = []
    history = train(model, data, EPOCHS, sampler, optimizer,
                    on_batch=lambda y: samples.append((optimizer.updates, y[:, 1].long().tolist())))
    return {"history": history, "samples": samples, "batches": sampler.controller.batches,
            "lrs": [row["lr"] for row in optimizer.history],
            "rows": [{**row, "probe_seconds": 0} for row in sampler.controller.batch_policy.rows]}


def test_both_replicas_take_the_probes_decisions_of_the_run_in_one_process(ranks, alone):
    assert max(alone["batches"]) > BASE and alone["rows"]  # a probe grew the batch
    for rank in ranks:
        assert rank["batches"] == alone["batches"]  # the same batch at every update
        assert rank["lrs"] == alone["lrs"]  # the same LR (the probe's rule) at every update
        assert rank["rows"] == alone["rows"]  # every probe at the same samples, with the same estimate and cost


def test_the_replicas_weights_stay_equal_and_equal_the_run_in_one_process(ranks, alone):
    for a, b in zip(ranks[0]["history"], ranks[1]["history"], strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert len(ranks[0]["history"]) == len(alone["history"])
    for got, want in zip(ranks[0]["history"], alone["history"], strict=True):
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_every_update_trains_the_samples_it_trains_in_one_process_split_over_the_replicas(ranks, alone):
    def by_update(samples):
        found = {}
        for update, ids in samples:
            found.setdefault(update, []).extend(ids)
        return found

    mine = [by_update(rank["samples"]) for rank in ranks]
    for update, ids in by_update(alone["samples"]).items():
        assert sorted(mine[0][update] + mine[1][update]) == sorted(ids)
        assert not set(mine[0][update]) & set(mine[1][update])


def test_replicas_probing_on_their_own_shards_of_the_held_out_set_are_refused_by_name(torchrun, tmp_path):
    command, env = torchrun.command(HERE / "probe_worker.py", tmp_path, "shard")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode != 0 and not list(tmp_path.glob("rank*.pt"))  # neither replica trained on apart
    for rank in (0, 1):
        assert f"[rank{rank}]: aikit.core.errors.InvalidValue: the replicas' critical-batch probes decided " \
               "differently" in done.stderr
    assert "the whole held-out set on every replica (not this replica's shard)" in done.stderr
