"""Ray Train at a fixed worker count on one local node of 2 CPUs (``ray.init(num_cpus=2)``):
aikit reads Ray's world through torch.distributed and trains as under torchrun; the workers'
check before a restore (storage every worker sees, one plan); the last commit reported to Ray
and a new run started from it (``resume_from_checkpoint``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from resize_checks import check_accounting, check_final_weights, commits, prepare, records
from resize_common import total_steps

pytestmark = [pytest.mark.slow, pytest.mark.ray]

DDP_WORKER = Path(__file__).resolve().parents[1] / "torch" / "ddp_worker.py"
FIT_TIMEOUT = 240


def fit(loop, tmp_path, config: dict, name: str = "run", workers: int = 2, run_options: dict | None = None,
        **options):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    run_config = RunConfig(storage_path=str(tmp_path / "storage"), name=name, **(run_options or {}))
    return TorchTrainer(loop, train_loop_config=config, scaling_config=ScalingConfig(num_workers=workers),
                        run_config=run_config, **options).fit()


def test_two_fixed_workers_train_as_two_torchrun_processes(ray_local, torchrun, tmp_path):
    """tests/torch/ddp_worker.py's DDP + GA scenarios (``init(G, M)`` over the world found, even,
    ragged and empty micro-batches, a summed loss) on Ray's process group and under torchrun:
    the same plans, the same all-reduces, bit-identical weights."""
    from ray_worker import ddp_run

    got = fit(ddp_run, tmp_path, {}).return_value
    torchrun(DDP_WORKER, tmp_path)
    want = json.loads((tmp_path / "rank0.json").read_text())
    assert set(got) == set(want)
    for name in want:
        assert got[name] == want[name], name  # params, steps, master, gpus, local sizes, all-reduce counts
    assert (got["even"]["steps"], got["even"]["gpus"]) == (2, 2)


def failure(run, *args, **kwargs) -> str:
    import ray.train

    with pytest.raises(ray.train.TrainingFailedError) as failed:
        run(*args, **kwargs)
    return str(failed.value)


def test_a_directory_some_workers_cannot_see_is_refused_before_anything_is_written(ray_local, tmp_path):
    """Each rank given its own directory, as a disk local to its node: rank 1 cannot see the file
    rank 0 writes, and every rank refuses in restore(), before any commit."""
    from ray_worker import checked_run

    message = failure(fit, checked_run, tmp_path, {"global_batch": [32, 32], "directory": str(tmp_path / "local"),
                                                   "per_rank": True})
    assert "is not storage every worker sees: rank(s) 1 cannot see the file rank 0 wrote there" in message
    assert message.count("InvalidValue") >= 2  # rank 0 and rank 1 alike
    assert [p for p in (tmp_path / "local").rglob("*") if p.is_file()] == []  # no commit, no marker left


def test_a_relative_trace_path_is_named_with_the_workers_directory_and_not_retried(ray_local, tmp_path):
    """Issue 47: docs/resize.md's recipe with a relative "trace.csv" failed on every worker (Ray
    Train runs the function in a directory of its own), with a TraceFileError that did not say
    where it looked, and Ray retried it max_failures times. The error now names the worker's
    directory and the fix; with StopOnAikitError the run ends at the first attempt (the path
    resolved on the driver, as every other test here gives its trace, is found)."""
    from ray.train import FailureConfig
    from ray_worker import missing_trace_run

    from aikit.integrations.ray import StopOnAikitError

    (tmp_path / "trace.csv").write_text("step,batchsize\n" + "".join(f"{step},8\n" for step in range(8)))  # beside
    # the driver, not where Ray looks
    message = failure(fit, missing_trace_run, tmp_path, {"run_dir": str(tmp_path), "trace": "trace.csv"},
                      run_options={"failure_config": FailureConfig(max_failures=3), "callbacks": [StopOnAikitError()]})
    attempts = (tmp_path / "attempts.txt").read_text().split("\n")[:-1]
    assert len(attempts) == 2, attempts  # one attempt of each worker: no retry
    directory = attempts[0].split(" ", 1)[1]
    assert directory != str(tmp_path) and not Path(directory, "trace.csv").exists()
    assert "a restart would meet this again, so the run stops here rather than Ray retrying it" in message
    assert (f"TraceFileError: trace trace.csv does not exist in the working directory {directory}: a relative path is "
            "read from the process's working directory, and Ray Train runs each worker in a directory of its own, not "
            "the driver's; give an absolute path" in message)


def test_workers_given_different_plans_are_refused_alike(ray_local, tmp_path):
    from ray_worker import checked_run

    message = failure(fit, checked_run, tmp_path, {"global_batch": [32, 64], "directory": str(tmp_path / "ckpt")})
    assert ("the replicas were not given the same run; they differ in global_batch_size (rank 0: 32; rank 1: 64)"
            in message)
    assert not list((tmp_path / "ckpt").glob("aikit_state.*"))


def test_the_last_commit_reported_to_ray_starts_a_new_run(ray_local, tmp_path):
    """A run of epoch 0 reports its last commit: Result.checkpoint is a folder ElasticState
    restores (hard links in the run's directory). A new run (another name, so an empty storage)
    given it through train_loop_config (Ray Train v2 refuses resume_from_checkpoint=) and
    restore(start_from=...) goes on at epoch 1 and ends at the big-batch run's weights, every step
    trained once."""
    from ray_worker import trace_run

    x, y = prepare(tmp_path)
    first = fit(trace_run, tmp_path, {"run_dir": str(tmp_path), "epochs": 1, "report": True}, name="first")
    folder = Path(first.checkpoint.path)
    assert folder.parent == tmp_path / "storage" / "first" / "aikit_checkpoints"
    assert [p.name for p in folder.iterdir()] == ["aikit_state.000000007.safetensors"]
    assert first.metrics["aikit_commit"] == 7 and first.metrics["epoch"] == 0
    fit(trace_run, tmp_path, {"run_dir": str(tmp_path), "start_from": first.checkpoint}, name="second")
    recs = records(tmp_path)
    resumed = [r["restored"] for r in recs if r["event"] == "start" and r["restored"]]
    assert resumed and resumed[0]["commit"] == 7
    assert sorted(c["updates"] for c in commits(recs) if c["rank"] == 0) == list(range(1, total_steps() + 1))
    assert (tmp_path / "storage" / "second" / "aikit" / f"aikit_state.{total_steps():09d}.safetensors").exists()
    check_accounting(recs)
    assert check_final_weights(tmp_path, x, y, total_steps()) < 1e-9
