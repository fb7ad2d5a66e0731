"""The trace optimizer's all-reduce over Horovod: 2 ranks through a random trace equal the
single-process big-batch run, and a rank with nothing to do in a step joins without a batch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trace"))
from trace_common import MINIBATCH, big_batch_history, dataset, make_model, random_trace

from aikit.core.schedule import Schedule
from aikit.core.trace import Trace

pytestmark = [pytest.mark.horovod, pytest.mark.slow]
SEED = 5


@pytest.fixture(scope="module")
def ranks(horovodrun, tmp_path_factory):
    out = tmp_path_factory.mktemp("hvd_trace")
    horovodrun("tests/trace/replica_worker.py", out, SEED, "horovod")  # the torchrun test's worker
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


def test_trace_training_over_horovod_equals_the_big_batch_run(ranks):
    data = dataset()
    schedule = Schedule(Trace(random_trace(SEED, len(data)), "stop"), len(data), 2, MINIBATCH, SEED)
    epochs = [schedule.epoch(e) for e in range(2)]
    assert any(0 in plan.counts(1) for plan in epochs)  # rank 1 does sit some steps out
    expected = big_batch_history(make_model(seed=0), epochs, data, 0.05, 32, momentum=0.9, weight_decay=1e-3)
    for rank in ranks:
        assert len(rank["history"]) == len(expected)
        for got, want in zip(rank["history"], expected, strict=True):
            for a, b in zip(got, want, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_a_rank_without_micro_batches_joins_with_zero_weight_and_no_batch(ranks):
    assert ranks[0]["bn_updates"] == ranks[1]["bn_updates"] == ranks[0]["bn_yielded"]
    assert ranks[1]["bn_yielded"] == ranks[0]["bn_yielded"] // 2
    for rank in ranks:  # BatchNorm saw only real micro-batches
        assert rank["bn_tracked"] == rank["bn_yielded"]
    for a, b in zip(ranks[0]["bn_params"], ranks[1]["bn_params"], strict=True):
        assert torch.equal(a, b)
