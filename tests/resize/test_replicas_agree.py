"""Replicas given different settings are refused before they train apart, on every rank alike,
with the ranks and what differs named; the comparison rides on the collective that is there
anyway (rank 0's weights at the first set_epoch, or the first update's all-reduce)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def ranks(torchrun, tmp_path_factory):
    out = tmp_path_factory.mktemp("agree")
    torchrun(HERE / "agree_worker.py", out, timeout=180)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_another_trace_on_one_rank_is_refused_on_every_rank_at_the_first_set_epoch(ranks):
    (message, _), (other, _) = ranks[0]["trace"], ranks[1]["trace"]
    assert message == other  # the same words on every rank
    assert message.startswith("the replicas were not given the same run; they differ in trace (rank 0: #")
    assert "; rank 1: #" in message and "seed (" not in message
    assert message.endswith("start every worker with the same trace, data set, seed and settings (and, resuming, "
                            "from the same checkpoint)")


def test_another_seed_without_the_broadcast_is_refused_at_the_first_update(ranks):
    (message, _), (other, _) = ranks[0]["seed_no_broadcast"], ranks[1]["seed_no_broadcast"]
    assert message == other and "they differ in seed (rank 0: 1; rank 1: 2)" in message


def test_the_same_settings_train_from_rank_0s_weights(ranks):
    (error0, weights0), (error1, weights1) = ranks[0]["same"], ranks[1]["same"]
    assert error0 is None and error1 is None and weights0 == weights1
