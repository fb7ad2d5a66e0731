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
from hvd_case import (  # noqa: E402 — the checks both engines must pass, written once
    test_a_nan_gradient_on_one_rank_skips_the_update_on_every_rank,  # noqa: F401
    test_a_second_backward_after_the_buckets_started_is_summed_and_said,  # noqa: F401
    test_buckets_start_their_all_reduce_during_the_last_backward,  # noqa: F401
    test_the_overlapped_all_reduce_gives_the_bits_of_one_all_reduce_after_the_backward,  # noqa: F401
    test_the_wrapped_optimizer_steps_once_per_window,  # noqa: F401
    test_two_ranks_with_ga_equal_the_big_batch_step,  # noqa: F401
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ranks(torchrun, tmp_path_factory):
    out = tmp_path_factory.mktemp("reduce")
    torchrun(HERE / "reduce_worker.py", out)
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]
