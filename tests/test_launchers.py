"""The launchers the multi-process tests share (tests/conftest.py): a worker killed by a signal
(gloo has aborted a process at exit on rare runs) is run once more, with a warning that keeps
the first output; a crash that repeats, or a Python error, fails the test at once."""

from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("crash_worker.py")
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("launcher", ["torchrun", "horovodrun"])
def test_a_worker_that_crashed_once_is_rerun_with_a_warning(launcher, request, tmp_path):
    run = request.getfixturevalue(launcher)
    with pytest.warns(pytest.PytestWarning, match="a worker died of SIGABRT; running it once more"):
        run(WORKER, "abort-once", tmp_path / "crashed")
    assert (tmp_path / "crashed").exists()


def test_a_worker_that_crashes_again_fails_the_test(torchrun, tmp_path):
    with pytest.warns(pytest.PytestWarning), pytest.raises(pytest.fail.Exception, match="exited 1"):
        torchrun(WORKER, "abort", tmp_path / "crashed")


def test_a_python_error_fails_at_once(torchrun, tmp_path, recwarn):
    with pytest.raises(pytest.fail.Exception, match="a bug in the worker"):
        torchrun(WORKER, "raise", tmp_path / "unused")
    assert not [w for w in recwarn if "running it once more" in str(w.message)]
