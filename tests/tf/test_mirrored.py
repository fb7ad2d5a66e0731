"""MirroredStrategy over two logical CPU devices (a real tf.distribute run, in a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def results() -> dict:
    run = subprocess.run([sys.executable, str(HERE / "mirrored_checks.py")], capture_output=True, text=True,
                         timeout=600)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULTS ")]
    assert run.returncode == 0 and lines, f"mirrored_checks.py failed:\n{run.stdout[-3000:]}\n{run.stderr[-5000:]}"
    return json.loads(lines[-1][len("RESULTS "):])


pytestmark = pytest.mark.slow


def test_init_plans_over_the_strategys_replicas(results):
    assert results["plan"] == [3, 4, 2, 24]  # steps, per-device batch, devices, global batch
    assert results["init_uses_the_scope"]


def test_fit_under_mirrored_equals_one_device_big_batch(results):
    assert results["fit_difference"] < 1e-12
    assert (results["fit_updates"], results["fit_micro_steps"]) == (4, 12)


def test_one_cross_replica_reduction_per_update(results):
    # the traced graph holds one all-reduce, inside the update branch ...
    assert results["graph_reductions_traced"] == 1
    # ... and run eagerly it executes once per update, where Keras without GA reduces every step
    assert results["eager_reductions_ga"] == results["eager_reductions_ga_updates"] == 1
    assert results["eager_reductions_plain"] == results["eager_reductions_plain_updates"] == 3


def test_custom_loop_with_strategy_run_equals_big_batch(results):
    assert results["custom_loop_difference"] < 1e-12 and results["custom_loop_updates"] == 2


def test_a_nan_on_one_replica_skips_the_update_on_both(results):
    """Each replica counts its non-finite sums, the counts are summed in the update (a one-number
    reduce, not a second all-reduce of the gradients), and both replicas take the skip branch."""
    assert results["skip_difference"] < 1e-12  # the skipped update left nothing: only the second is applied
    assert results["skip_counts"] == [1, 0, 1]  # skipped, skipped in a row since, iterations
    assert results["skip_graph_reductions_traced"] == 1


def test_an_optimizer_built_while_tracing_is_refused_with_the_fix(results):
    assert "call optimizer.build(model.trainable_variables) inside strategy.scope() first" in (
        results["unbuilt_error"] or "")


def test_trace_over_two_replicas_equals_big_batch_steps(results):
    assert results["trace_difference"] < 1e-12
    assert results["trace_ga_steps"] == [2, 1, 3, 6]  # batch / (micro-batch 2 x 2 replicas)


def test_a_plan_on_fewer_devices_narrows_the_strategy(results):
    assert results["narrowed"] == [1, 1]  # 9 samples split evenly only on one device
