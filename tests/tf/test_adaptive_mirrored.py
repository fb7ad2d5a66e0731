"""The adaptive batch under MirroredStrategy over two logical CPU devices (a real tf.distribute
run, in a subprocess): the noise of every micro-batch on every replica, carried by the update's
one all-reduce, and fit_adaptive equal to big-batch steps across plan changes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    trace = tmp_path_factory.mktemp("adaptive") / "trace.csv"
    run = subprocess.run([sys.executable, str(HERE / "adaptive_mirrored_checks.py"), str(trace)],
                         capture_output=True, text=True, timeout=600)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULTS ")]
    assert run.returncode == 0 and lines, (
        f"adaptive_mirrored_checks.py failed:\n{run.stdout[-3000:]}\n{run.stderr[-5000:]}")
    return json.loads(lines[-1][len("RESULTS "):])


def test_the_noise_of_the_six_parts_is_the_brute_force_estimate(results):
    # 3 micro-steps x 2 replicas, each replica on samples of its own; eager and traced
    assert results["noise_relative_difference"] < 1e-12
    assert results["noise_traced_relative_difference"] < 1e-12


def test_the_part_norms_ride_in_the_updates_one_all_reduce(results):
    # one reduction per update, as without noise measurement, with one more tensor in it
    assert results["plain_reductions"] == [4, 4]  # two updates: 2 kernels + 2 biases
    assert results["noise_reductions"] == [5, 5]
    assert results["noise_traced_reductions"] == [5]  # the traced update holds that one all-reduce


def test_each_replica_trains_on_its_own_samples(results):
    # the micro-step's loss is the mean over both replicas' samples
    assert results["loss_difference"] < 1e-12


def test_fit_adaptive_equals_big_batch_steps_across_plan_changes(results):
    # 49 samples on 2 replicas: 8 (1x4 each) -> 24 (3x4) -> 8 -> 18 (3x3); the epochs end on a
    # shorter update, the odd sample out of each epoch only
    assert results["batches"] == [8, 8, 24, 8, 8, 8, 18, 12, 2]
    assert results["ga_steps"] == [1, 1, 3, 1, 1, 1, 3, 2, 1]
    assert results["micro_batches"] == [4, 4, 4, 4, 4, 4, 3, 3, 1]
    assert sum(b for b, e in zip(results["batches"], results["epochs"], strict=True) if e == 0) == 48
    assert all(results["noise_measured"])  # two replicas: every update has two parts or more
    assert results["adaptive_difference"] < 1e-12
    assert results["fit_adaptive_noise_difference"] < 1e-12  # each replica trained on its own samples


def test_the_trace_replays_the_run_with_fit_trace(results):
    assert results["replay_difference"] < 1e-12
