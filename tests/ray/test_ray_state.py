"""aikit.integrations.ray.ElasticState in one process (no cluster: a world of one, a directory
given): what it refuses before anything changes, and the folder report() gives Ray."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from resize_common import make_model, make_sgd

from aikit.core.errors import InvalidState, InvalidType, InvalidValue

pytestmark = pytest.mark.ray


def weights(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def files(directory) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir()}


def ga_state(directory, global_batch: int, **options):
    import aikit.elastic.Torch
    from aikit.ga.Torch.optim import Optimizer
    from aikit.integrations.ray import ElasticState

    plan = aikit.elastic.Torch.init(global_batch, 8)
    model = make_model()
    return ElasticState(directory, model=model, optimizer=Optimizer(make_sgd(model), plan.steps), verbose=False,
                        **options)


def test_a_commit_of_another_global_batch_is_refused_and_kept(ray_integration, tmp_path):
    """Each Ray worker is a fresh process, so the plan its init() published is the run's: a
    commit made under another global batch is refused (a resize keeps it), nothing changed."""
    ga_state(tmp_path, 32).commit()
    before = files(tmp_path)
    state = ga_state(tmp_path, 64)
    start = weights(state.model)
    with pytest.raises(InvalidValue, match=r"was written by a run of global batch 32 \(init\(32, \.\.\.\)\), this one "
                       r"plans 64 per update: a resize keeps the global batch, so resume with init\(32, \.\.\.\), or "
                       r"start from an empty directory"):
        state.restore()
    assert all(torch.equal(a, b) for a, b in zip(weights(state.model), start, strict=True))
    assert files(tmp_path) == before
    assert ga_state(tmp_path, 32).restore()


def test_outside_a_ray_worker_the_run_storage_is_named_as_missing(ray_integration):
    with pytest.raises(InvalidState, match=r"without a directory reads the run's storage from Ray Train: build it "
                                           r"inside train_loop_per_worker, or give it a directory"):
        ray_integration.ElasticState(model=make_model())


def test_a_storage_path_that_is_no_file_system_path_is_refused(ray_integration, monkeypatch):
    storage = SimpleNamespace(storage_filesystem=SimpleNamespace(type_name="s3"), experiment_fs_path="bucket/run")
    monkeypatch.setattr(ray_integration.ray.train, "get_context",
                        lambda: SimpleNamespace(get_storage=lambda: storage))
    with pytest.raises(InvalidValue, match=r"RunConfig\(storage_path=\.\.\.\) is on a 's3' file system, but "
                                           r"ElasticState commits by renaming a file"):
        ray_integration.ElasticState(model=make_model())


def test_the_folder_given_to_ray_holds_the_commit_and_a_new_run_starts_from_it(ray_integration, tmp_path):
    state = ga_state(tmp_path / "run", 32, step=0)
    for step in range(1, 4):
        state.step = step
        state.commit()
    folder = tmp_path / "reported" / "commit_000000003"
    ray_integration.link_commit(state.directory, 3, folder)
    name = "aikit_state.000000003.safetensors"
    assert [p.name for p in folder.iterdir()] == [name]
    assert (folder / name).stat().st_ino == (state.directory / name).stat().st_ino  # a link, not a copy
    fresh = ga_state(tmp_path / "new", 32, step=0)
    assert fresh.restore(start_from=folder) and (fresh.step, fresh.commits) == (3, 3)
    fresh.commit()  # in its own directory, going on from commit 3
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["aikit_state.000000004.safetensors"]
    assert [p.name for p in folder.iterdir()] == [name]


def test_start_from_a_folder_without_a_commit_is_refused(ray_integration, tmp_path):
    state = ga_state(tmp_path / "new", 32)
    start = weights(state.model)
    with pytest.raises(InvalidValue, match=r"holds no aikit commit: give the folder \(or the Checkpoint\) "
                                           r"ElasticState.report\(\) gave Ray, e.g. Result.checkpoint"):
        state.restore(start_from=tmp_path / "empty")
    assert all(torch.equal(a, b) for a, b in zip(weights(state.model), start, strict=True))


def test_report_outside_a_ray_worker_and_a_start_that_is_no_folder_are_named(ray_integration, tmp_path):
    """Issue 47: report() outside Ray raised Ray's RuntimeError (before a commit from ray.train.report,
    after one from get_context), restore(start_from=123) a TypeError from pathlib."""
    state = ga_state(tmp_path, 32)
    with pytest.raises(InvalidType, match=r"restore\(start_from=\.\.\.\) takes a folder \(a str or a path\) or a "
                                          r"ray\.train\.Checkpoint, got int 123: .*restore\(start_from="
                                          r"config\['checkpoint'\]\)"):
        state.restore(start_from=123)
    assert not list(tmp_path.iterdir())  # refused before anything was written
    refused = (r"ElasticState\.report\(\) hands the last commit to Ray Train \(ray\.train\.report\), which takes it "
               r"only in a worker of trainer\.fit\(\): call it inside train_loop_per_worker")
    with pytest.raises(InvalidState, match=refused):
        state.report({"epoch": 0})
    state.restore()
    state.commit()
    with pytest.raises(InvalidState, match=refused):
        state.report({"epoch": 0})


def test_stop_on_aikit_error_stops_what_a_restart_meets_again_and_no_other(ray_integration):
    """What StopOnAikitError decides on Ray Train's controller, given the workers' errors as Ray
    hands them (wrapped with their tracebacks): a refusal ends the run, a lost peer restarts."""
    import ray.train
    from ray.train.v2._internal.exceptions import UserExceptionWithTraceback

    from aikit.core.errors import CollectiveError, OutOfMemory, TraceFileError

    stop = ray_integration.StopOnAikitError()
    lost = {0: UserExceptionWithTraceback(CollectiveError("all-reduce: peer gone"), "traceback 0"),
            1: UserExceptionWithTraceback(OutOfMemory("out of memory"), "traceback 1")}
    assert stop.after_exception(None, lost) is None  # Ray restarts, as its elastic runs should
    refused = {**lost, 1: UserExceptionWithTraceback(TraceFileError("trace trace.csv does not exist"), "traceback")}
    with pytest.raises(ray.train.ControllerError) as stopped:
        stop.after_exception(None, refused)
    assert str(stopped.value) == (
        "Training failed due to controller error:\nTraining failed due to worker errors:\naikit: a restart would meet "
        "this again, so the run stops here rather than Ray retrying it (aikit.integrations.ray.StopOnAikitError):\n"
        "[rank 1] TraceFileError: trace trace.csv does not exist")
    assert stopped.value.controller_failure.worker_failures == refused
