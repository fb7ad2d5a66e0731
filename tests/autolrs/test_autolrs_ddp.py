"""AutoLRS under DDP on 2 real gloo processes (torchrun): rank 0 decides, rank 1 follows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("autolrs_ddp_worker.py")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ranks(torchrun, tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("autolrs_ddp")
    torchrun(WORKER, out)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_every_rank_steps_at_rank_0s_lrs(ranks):
    rank0, rank1 = ranks
    assert rank0["step_lrs"] == rank1["step_lrs"] == rank0["history_lrs"]
    assert len(set(rank0["step_lrs"])) >= 3  # the three trials of a stage really tried different LRs
    assert rank1["history_lrs"] == []  # rank 1's own (differently seeded) controller never decided


def test_every_rank_evaluates_together_and_restores_to_equal_weights(ranks):
    rank0, rank1 = ranks
    assert rank0["val_calls"] == rank1["val_calls"] and len(rank0["val_calls"]) == 3 * 4
    assert rank0["weights"] == rank1["weights"]
