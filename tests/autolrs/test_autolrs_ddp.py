"""AutoLRS under DDP on 2 real gloo processes (torchrun): rank 0 decides, rank 1 follows; the
constructor is local and the first step refuses replicas that began differently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("autolrs_ddp_worker.py")
FIRST_STEP_WORKER = Path(__file__).with_name("autolrs_first_step_worker.py")
pytestmark = pytest.mark.slow


def run_ranks(torchrun, out: Path, worker: Path) -> list[dict]:
    """What each of the two ranks of ``worker`` wrote to ``out``."""
    torchrun(worker, out)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def ranks(torchrun, tmp_path_factory) -> list[dict]:
    return run_ranks(torchrun, tmp_path_factory.mktemp("autolrs_ddp"), WORKER)


@pytest.fixture(scope="module")
def first_step(torchrun, tmp_path_factory) -> list[dict]:
    return run_ranks(torchrun, tmp_path_factory.mktemp("autolrs_first_step"), FIRST_STEP_WORKER)


def test_every_rank_steps_at_rank_0s_lrs(ranks):
    rank0, rank1 = ranks
    assert rank0["step_lrs"] == rank1["step_lrs"] == rank0["history_lrs"]
    assert len(set(rank0["step_lrs"])) >= 3  # the three trials of a stage really tried different LRs
    assert rank1["history_lrs"] == []  # rank 1's own (differently seeded) controller never decided


def test_every_rank_evaluates_together_and_restores_to_equal_weights(ranks):
    rank0, rank1 = ranks
    assert rank0["val_calls"] == rank1["val_calls"] and len(rank0["val_calls"]) == 3 * 4
    assert rank0["weights"] == rank1["weights"]


def test_replicas_that_began_differently_are_refused_at_the_first_step_on_every_rank(first_step):
    rank0, rank1 = first_step
    assert rank0["first_lr"] != rank1["first_lr"]  # design=0 and their own seeds: different first trials
    for rank in (rank0, rank1):
        assert "AutoLRS began differently on 1 of 2 replicas than on rank 0" in rank["refusal"]
        assert "build it with the same options, seed and optimizer LR on each" in rank["refusal"]


def test_the_constructor_issues_no_collective(first_step):
    # rank 1 built one AutoLRS more than rank 0; under TORCH_DISTRIBUTED_DEBUG=DETAIL any
    # collective in it would have met a different one on rank 0, and the run would have failed
    rank0, rank1 = first_step
    assert rank0["step_lrs"] == rank1["step_lrs"] == rank0["history_lrs"] and len(rank0["step_lrs"]) == 30
    assert len(set(rank0["step_lrs"])) >= 3


def test_the_chiefs_refusal_of_a_val_fn_result_is_raised_on_every_rank_at_the_same_step(first_step):
    rank0, rank1 = first_step
    step, error, message = rank0["val_refusal"]
    assert (step, error) == (1, "InvalidType") and message.startswith("val_fn must return the validation loss as one "
                                                                      "number (a float, or a tensor with one element), "
                                                                      "got 'abc'")
    step, error, message = rank1["val_refusal"]  # rank 1's own val_fn answered a number: rank 0's refusal counts
    assert (step, error) == (1, "TrainingFailed") and "AutoLRS raised an error on the chief (rank 0" in message
    assert rank0["after_refusal_lrs"] == rank1["after_refusal_lrs"]  # and both go on together


def test_a_loss_that_is_never_finite_stops_every_rank_at_the_same_step(first_step):
    rank0, rank1 = first_step
    # the 12th step (index 11): 3 trials that failed at once, then 8 rollbacks and the 9th divergence
    assert rank0["nan_refusal"][:2] == rank1["nan_refusal"][:2] == [11, "TrainingFailed"]
    assert "rolled back 8 times in a row" in rank0["nan_refusal"][2]
