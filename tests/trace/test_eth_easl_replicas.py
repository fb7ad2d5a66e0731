"""eth-easl's variable batch size on two real replicas (torchrun + gloo, one launch of
eth_easl_worker.py): AdaScale's gain from the micro-batches of both replicas, a replica without a
micro-batch counting no part, and a whole 2-replica run bit-identical to eth-easl's code."""

from pathlib import Path

import pandas as pd
import pytest
import torch
from adascale_reference import ReferenceGain, per_sample_grads
from test_adascale import group_slices
from test_eth_easl import SEED_TRACE
from trace_common import MINIBATCH, dataset, make_model

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def ranks(torchrun, tmp_path_factory):
    out = tmp_path_factory.mktemp("eth_easl")
    trace = out / "trace.csv"
    pd.read_csv(SEED_TRACE).head(30).to_csv(trace, index=False)
    torchrun(HERE / "eth_easl_worker.py", out, trace)
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


def test_adascale_gains_on_two_replicas_equal_the_per_sample_computation(ranks):
    runs = [rank["adascale"] for rank in ranks]
    updates = runs[0]["updates"]
    assert [u["at"] for u in runs[1]["updates"]] == [u["at"] for u in updates]  # the same updates on both
    x, y = dataset(60).tensors
    reference = ReferenceGain(group_slices(make_model()), decay=0.5)
    probe = make_model()
    progress, idle, uneven = 0.0, 0, 0
    for update in updates:
        # this step's parts: every micro-batch of both replicas (none from a replica that sat it out)
        parts = {r: [ids for e, s, ids in run["samples"] if (e, s) == update["at"]] for r, run in enumerate(runs)}
        idle += not parts[1]
        uneven += len(parts[0]) != len(parts[1])
        per_group, whole = reference.update(per_sample_grads(probe, update["params"], x, y),
                                            parts[0] + parts[1], MINIBATCH)
        progress += whole
        for run in runs:
            mine = next(u for u in run["updates"] if u["at"] == update["at"])
            assert mine["gains"] == pytest.approx(per_group, rel=1e-9), update["at"]
            assert mine["model_gain"] == pytest.approx(whole, rel=1e-9)
            assert mine["lr"] == pytest.approx([0.05 / 4 * per_group[0], 0.1 / 4 * per_group[1]], rel=1e-9)
            assert mine["progress"] == pytest.approx(progress, rel=1e-12)
    assert idle >= 2 and uneven >= 4  # steps where rank 1 had nothing, and ragged ones, were there


def test_a_two_replica_run_is_bit_identical_to_eth_easls(ranks):
    original = ranks[0]["digits"]["original"]
    assert len(original) > 15
    for rank in ranks:
        history = rank["digits"]["history"]
        assert len(history) == len(original)
        for step, (a, b) in enumerate(zip(history, original, strict=True)):
            for p, q in zip(a, b, strict=True):
                assert torch.equal(p, q), f"update {step} differs by {(p - q).abs().max():.3g}"
