"""The Keras range test under MirroredStrategy (two logical CPU devices) trains through
``model.fit`` and records the same LRs and losses as the test on one device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorflow")

WORKER = Path(__file__).with_name("lr_finder_mirrored_worker.py")


@pytest.fixture(scope="module")
def result():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(WORKER)], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


@pytest.mark.parametrize("val", [False, True])
def test_two_replicas_record_what_one_device_records(result, val):
    """Each update is one batch of 16 split 8 + 8 over the replicas; its loss (training, or the
    whole validation set's) equals the one-device test's, update for update."""
    assert result["replicas"] == 2
    mirrored, single = result[f"mirrored_val{val}"], result[f"single_val{val}"]
    assert len(mirrored["history"]["lr"]) == 8
    assert mirrored["history"]["lr"] == pytest.approx(single["history"]["lr"], rel=1e-12)
    assert mirrored["history"]["loss"] == pytest.approx(single["history"]["loss"], rel=1e-9)


def test_the_model_is_trained_then_reset_and_the_lr_put_back(result):
    for case in ("mirrored_valFalse", "mirrored_valTrue"):
        assert result[case]["trained"] and result[case]["restored"]
        assert result[case]["lr_after"] == pytest.approx(1e-4, rel=1e-12)


def test_accumulation_is_refused_under_a_strategy(result):
    assert result["accumulation_error"] == (
        "under MirroredStrategy (2 replicas) the test trains through fit, one batch per update: use "
        "accumulation_steps=1 and a larger batch_size, got accumulation_steps=2"
    )


def test_through_the_ga_optimizer_two_replicas_record_the_one_device_test_of_the_global_batch(result):
    """aikit's GA optimizer under MirroredStrategy: every update is 2 fit steps of 8 samples (4 per
    replica), at one LR; the history and the weights after the test equal the one-device test
    on batches of 16 (issue 27)."""
    ga, single = result["mirrored_ga"], result["single_valFalse"]
    assert ga["history"]["lr"] == pytest.approx(single["history"]["lr"], rel=1e-12) and len(ga["history"]["lr"]) == 8
    assert ga["history"]["loss"] == pytest.approx(single["history"]["loss"], rel=1e-9)
    for a, b in zip(ga["weights"], single["weights"], strict=True):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-9, atol=1e-12)
    assert ga["trained"] and ga["restored"] and ga["updates"] == 0  # reset() put the update count back too
