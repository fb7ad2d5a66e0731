"""Two real replicas (torchrun + gloo) through a random trace: every update equals the
single-process big-batch update, every sample is trained exactly once per epoch, and a replica
with nothing to do in a step joins the all-reduce without a batch. (The same over Horovod:
tests/horovod/test_horovod_trace.py.)"""

from pathlib import Path

import numpy as np
import pytest
import torch
from trace_common import MINIBATCH, big_batch_history, dataset, make_model, random_trace

from aikit.core.schedule import Schedule
from aikit.core.trace import Trace

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent
SEED = 3


@pytest.fixture(scope="module")
def ranks(torchrun, tmp_path_factory):
    out = tmp_path_factory.mktemp("torchrun")
    torchrun(HERE / "replica_worker.py", out, SEED)
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


def schedule() -> Schedule:
    data = dataset()
    return Schedule(Trace(random_trace(SEED, len(data)), "stop"), len(data), 2, MINIBATCH, SEED)


def test_every_update_equals_the_big_batch_update(ranks):
    epochs = [schedule().epoch(e) for e in range(2)]
    assert any(0 in plan.counts(1) for plan in epochs)  # the trace does leave rank 1 out of steps
    expected = big_batch_history(make_model(seed=0), epochs, dataset(), 0.05, 32, momentum=0.9, weight_decay=1e-3)
    for rank in ranks:
        assert len(rank["history"]) == len(expected) == sum(len(plan) for plan in epochs)
        for got, want in zip(rank["history"], expected, strict=True):
            for a, b in zip(got, want, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)


def test_each_epoch_trains_every_scheduled_sample_exactly_once(ranks):
    for epoch in range(2):
        plan = schedule().epoch(epoch)
        seen = [i for rank in ranks for e, _, ids in rank["samples"] if e == epoch for i in ids]
        assert len(seen) == plan.samples == len(set(seen))
        assert sorted(seen) == sorted(plan.order[: plan.samples].tolist())
        for rank_index, rank in enumerate(ranks):  # and each step's share went to the right rank
            for step in range(len(plan)):
                got = [i for e, s, ids in rank["samples"] if e == epoch and s == step for i in ids]
                assert got == np.concatenate(plan.micro_batches(step, rank_index) or [[]]).tolist()


def test_a_replica_without_micro_batches_joins_with_zero_weight_and_no_batch(ranks):
    # trace [4, 8] cycling: rank 1 gets one micro-batch every other step, rank 0 one every step
    assert ranks[0]["bn_updates"] == ranks[1]["bn_updates"] == ranks[0]["bn_yielded"]
    assert ranks[1]["bn_yielded"] == ranks[0]["bn_yielded"] // 2
    for rank in ranks:  # BatchNorm saw only the real micro-batches: no dummy batch
        assert rank["bn_tracked"] == rank["bn_yielded"]
    for a, b in zip(ranks[0]["bn_params"], ranks[1]["bn_params"], strict=True):
        assert torch.equal(a, b)  # the same updates on both replicas
