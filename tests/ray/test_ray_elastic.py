"""Ray Train's elastic workers on a local cluster of one-CPU nodes (``ScalingConfig(num_workers=(1,
2))``, gloo, float64): a node lost mid-epoch (its worker SIGKILLed with it), the run going on with
the worker left and growing back when a node returns; a run started on one worker gaining a
second; ``max_failures`` used up. Every run restores through ``aikit.integrations.ray.ElasticState``
in the run's storage and ends at the weights of the uninterrupted big-batch run."""

from __future__ import annotations

import os
import time

import pytest
from ray_cluster import Fit, elastic_trainer
from resize_checks import check_accounting, check_final_weights, commits, prepare, wait_for
from resize_common import max_difference, total_steps

pytestmark = [pytest.mark.slow, pytest.mark.ray]

# bounds, not durations: a wait ends as soon as what it waits for is logged, or fit() ends. On a
# 2-core machine loaded by other jobs (load 10) a start of the worker group alone, processes that
# import torch and aikit, took over a minute, and 120 s timed out (issue 47)
FIT_TIMEOUT = 600
WAIT_S = 360


def world_committed(world: int, at_least: int, after: float = 0.0):
    return lambda recs: sum(r["world"] == world and r["t"] > after for r in commits(recs)) >= at_least


def test_a_node_lost_mid_epoch_the_worker_left_goes_on_and_the_pair_grows_back(ray_nodes, tmp_path):
    """2 workers; rank 0's node lost mid-epoch 0 (the worker SIGKILLed with its node): Ray restarts
    the run on the one worker left, which resumes from the last commit; a node added back: Ray
    resizes to 2, which resume again. Every step trained once on exactly its global batch, the
    weights those of the big-batch run."""
    from ray_worker import trace_run

    x, y = prepare(tmp_path)
    ray_nodes.keep(2)
    fit = Fit(elastic_trainer(trace_run, tmp_path, {"delay": 0.25, "solo_delay": 5.0}, "lost-and-back"))
    recs = wait_for(world_committed(2, 2), tmp_path, WAIT_S, procs=[fit], what="two committed steps by 2 workers")
    rank0 = next(r["pid"] for r in recs if r["event"] == "start" and r["rank"] == 0 and r["world"] == 2)
    lost_at = time.time()
    ray_nodes.lose(rank0)
    recs = wait_for(world_committed(1, 1, lost_at), tmp_path, WAIT_S, procs=[fit], what="an update by the worker left")
    alone_at = min(c["t"] for c in commits(recs) if c["world"] == 1)
    added_at = time.time()
    ray_nodes.add()
    recs = wait_for(world_committed(2, 1, added_at), tmp_path, WAIT_S, procs=[fit], what="an update by 2 workers again")
    back_at = min(c["t"] for c in commits(recs) if c["world"] == 2 and c["t"] > added_at)
    fit.result(FIT_TIMEOUT)
    recs = wait_for(lambda r: True, tmp_path, 1)
    last_before = max(c["updates"] for c in commits(recs) if c["t"] < lost_at)
    assert last_before < 7, "the node was not lost mid-epoch 0"
    starts = [r for r in recs if r["event"] == "start" and r["restored"]]
    assert {(r["world"], r["restored"]["world_size"]) for r in starts} >= {(1, 2), (2, 1)}  # resumed, not restarted
    steps = check_accounting(recs)
    assert {entry["world"] for entry in steps.values()} == {1, 2}
    difference = check_final_weights(tmp_path, x, y, total_steps())
    assert difference < 1e-9
    print(f"\nRay scale-down: {alone_at - lost_at:.1f} s from the node's loss to the first update on 1 worker; "
          f"scale-up: {back_at - added_at:.1f} s from a node added to the first update on 2; final weights "
          f"within {difference:.1e} of the big-batch run")


def test_a_sharded_run_started_on_one_worker_gains_a_second(ray_nodes, tmp_path):
    """FSDP2 + the GA wrapper, each step planned for Ray's world by init(G, M): started with one
    node, a second added after two updates. The run resumes resharded over 2, its GA steps
    re-planned (G=12, M=4: 3 micro-steps alone, 2 per worker on two), and ends at the weights and
    AdamW state of the uninterrupted big-batch run."""
    import torch
    from fsdp_common import MAX_MICRO, reference
    from ray_worker import sharded_run

    ray_nodes.keep(1)
    (tmp_path / "logs").mkdir()
    fit = Fit(elastic_trainer(sharded_run, tmp_path, {"hold_after": 2, "hold_s": 120}, "gains-a-second"))
    wait_for(world_committed(1, 2), tmp_path, WAIT_S, procs=[fit], what="two updates by the first worker")
    added_at = time.time()
    ray_nodes.add()
    recs = wait_for(world_committed(2, 1, added_at), tmp_path, WAIT_S, procs=[fit], what="an update by 2 workers")
    back_at = min(c["t"] for c in commits(recs) if c["world"] == 2)
    fit.result(FIT_TIMEOUT)
    recs = wait_for(lambda r: True, tmp_path, 1)
    kept = {}
    for c in sorted(commits(recs), key=lambda c: (c["inc"], c["rank"])):  # the last incarnation's
        kept[c["epoch"], c["step"], c["rank"]] = c
    assert {(c["world"], c["steps"]) for c in kept.values() if c["global_batch"] == 12} == {(1, 3), (2, 2)}
    assert -(-12 // MAX_MICRO) == 3 and -(-12 // (2 * MAX_MICRO)) == 2
    resumed = [c["restored"] for c in recs if c["world"] == 2 and c["restored"]]
    assert resumed and resumed[0]["world_size"] == 1
    final = torch.load(tmp_path / "final.pt")
    weights, adam = reference()
    difference = max(max_difference(final["final"], weights), max_difference(final["adam"], adam))
    assert difference < 1e-9
    print(f"\nRay scale-up (FSDP2): {back_at - added_at:.1f} s from a node added to the first update on 2 workers; "
          f"weights and AdamW state within {difference:.1e} of the big-batch run")


def test_max_failures_used_up_ends_the_run_with_ray_s_error_and_a_rerun_goes_on_exactly(ray_nodes, tmp_path):
    """FailureConfig(max_failures=1): a worker SIGKILLed twice (its node stays, so Ray restarts
    at 2 each time). The second failure ends ``fit()`` with Ray's error, the commits intact; the
    same run started again (same name) resumes from the last commit and ends exactly."""
    import ray.train
    from ray_worker import trace_run

    x, y = prepare(tmp_path)
    ray_nodes.keep(2)
    fit = Fit(elastic_trainer(trace_run, tmp_path, {"delay": 0.25}, "max-failures", max_failures=1))
    for kill in range(2):
        recs = wait_for(world_committed(2, 2 * (kill + 1)), tmp_path, WAIT_S, procs=[fit],
                        what=f"updates before kill {kill + 1}")
        worker = max((r for r in recs if r["event"] == "start"), key=lambda r: r["t"])["pid"]
        killed_at = time.time()
        os.kill(worker, 9)
        if kill == 0:
            wait_for(lambda rs, t=killed_at: any(r["event"] == "start" and r["t"] > t and r["restored"] for r in rs),
                     tmp_path, WAIT_S, procs=[fit], what="a restart")
    with pytest.raises(ray.train.TrainingFailedError) as failed:
        fit.result(FIT_TIMEOUT)
    assert "Training failed due to worker errors" in str(failed.value)  # each rank's error follows
    print(f"\nwhat the user reads: {type(failed.value).__name__}: {str(failed.value)[:600]}")
    committed = max(c["updates"] for c in commits(wait_for(lambda r: True, tmp_path, 1)))
    assert committed < total_steps()
    Fit(elastic_trainer(trace_run, tmp_path, {}, "max-failures", max_failures=1)).result(FIT_TIMEOUT)
    recs = wait_for(lambda r: True, tmp_path, 1)
    check_accounting(recs)
    last_start = max((r for r in recs if r["event"] == "start"), key=lambda r: r["t"])
    assert last_start["restored"]["commit"] == committed  # nothing lost: the rerun began at the last commit
    assert check_final_weights(tmp_path, x, y, total_steps()) < 1e-9
