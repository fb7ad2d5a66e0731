"""2 torchrun replicas (gloo, a plain model, no DDP) with ``Optimizer(reduce=True)`` equal one
process taking big-batch steps (float64): ragged micro-batches, a rank with nothing in a GA step,
an epoch's last short window (``flush()``), clipping and a scheduler. The same cases run under
Horovod in tests/horovod/test_horovod_ga.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "horovod"))
from hvd_case import CASES, PAIRS_MB, expected_early, reference  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ranks(torchrun, tmp_path_factory):
    out = tmp_path_factory.mktemp("reduce")
    torchrun(HERE / "reduce_worker.py", out)
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_two_replicas_reducing_at_the_update_equal_the_big_batch_step(ranks, case):
    expected = reference(case)
    for rank in ranks:
        for got, want in zip(rank[case.name]["params"], expected, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


def test_the_wrapped_optimizer_steps_once_per_window(ranks):
    case = next(c for c in CASES if c.optimizer == "adamw")
    assert [r[case.name]["inner_steps"] for r in ranks] == [len(case.windows)] * 2


def test_the_overlapped_all_reduce_gives_the_bits_of_one_all_reduce_after_the_backward(ranks):
    for rank in ranks:
        for a, b in zip(rank["ragged-sgd-clip-buckets"]["params"], rank["ragged-sgd-clip-one-all-reduce"]["params"],
                        strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("case", [c for c in CASES if c.bucket_cap_mb == PAIRS_MB], ids=lambda c: c.name)
def test_buckets_start_their_all_reduce_during_the_last_backward(ranks, case):
    """Every bucket whose gradients are final is on the wire before step(); an idle rank starts
    all of them in step(), and a parameter without gradient holds back only its own bucket."""
    assert [r[case.name]["started_early"] for r in ranks] == [expected_early(case, rank) for rank in range(2)]


def test_a_second_backward_after_the_buckets_started_is_summed_and_said(ranks):
    for rank in ranks:
        for case in CASES:
            warned = [w for w in rank[case.name]["warnings"] if "gives up the overlap" in w]
            assert len(warned) == (1 if case.split_backward else 0), (case.name, rank[case.name]["warnings"])
