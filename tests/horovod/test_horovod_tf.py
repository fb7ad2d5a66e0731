"""Keras 3 under a real horovodrun: 2 ranks x aikit's GA equal one process taking big-batch steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from capabilities import skip_or_fail

pytestmark = [pytest.mark.horovod, pytest.mark.slow]


def horovod_tensorflow_missing() -> str | None:
    """Why horovod.tensorflow cannot run here (without importing TensorFlow), or None."""
    import horovod

    if not list((Path(horovod.__file__).parent / "tensorflow").glob("mpi_lib*.so")):
        return "Horovod was built without TensorFlow: re-run scripts/install_horovod.sh with TensorFlow installed"
    return None


@pytest.fixture(scope="module")
def ranks(horovodrun, tmp_path_factory):
    missing = horovod_tensorflow_missing()
    if missing:
        skip_or_fail("HOROVOD", missing)
    out = tmp_path_factory.mktemp("hvd_tf")
    horovodrun("tests/horovod/tf_worker.py", out, timeout=300)
    return [np.load(out / f"rank{r}.npy", allow_pickle=True).item() for r in range(2)]


def test_keras_ga_over_horovod_equals_the_big_batch_steps(ranks):
    for rank in ranks:  # both ranks (which started from different weights) end on the reference
        assert rank["updates"] == 5  # one real update per window of 8 samples
        for got, want in zip(rank["weights"], ranks[0]["reference"], strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_a_nan_on_one_rank_skips_the_update_on_every_rank(ranks):
    """The ranks' non-finite counts are summed over Horovod before the update's all-reduce: both
    ranks skip the second window (no hang, no NaN weights) and train the rest as the big batch."""
    for rank in ranks:
        weights, updates, skipped = rank["skip"]
        assert (updates, skipped) == (4, 1)
        for got, want in zip(weights, ranks[0]["skip_reference"], strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_tf_init_takes_the_world_from_horovod(ranks):
    for rank, result in enumerate(ranks):
        assert result["plan"] == {"steps": 2, "batch_size": 2, "global_batch_size": 8, "gpus": 2, "master": rank == 0}
        assert result["hvd"]  # Run:AI's AIkit's runai.elastic.hvd: the Horovod module in use


def test_tf_init_refuses_a_plan_that_leaves_horovod_processes_idle(ranks):
    for rank in ranks:
        assert rank["refused"] == (
            "the plan uses 1 of the 2 Horovod processes (global_batch_size 3), but every process must "
            "train: launch 1 process(es), or use a global batch that splits evenly over 2"
        )
