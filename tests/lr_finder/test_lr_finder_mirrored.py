"""The Keras range test under MirroredStrategy (two logical CPU devices) trains through
``model.fit`` and records the same LRs and losses as the test on one device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
