"""Launch real ``horovodrun -np 2 -H localhost:2 --gloo`` jobs from the tests.

Horovod is optional (scripts/install_horovod.sh builds it): without it these tests skip, unless
``AIKIT_REQUIRE_HOROVOD=1`` says the environment promised it, and then they fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HOROVODRUN = Path(sys.executable).parent / "horovodrun"

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


@pytest.fixture
def hvd(require_horovod):
    """``horovod.torch`` initialised in this process as a world of one; shut down afterwards so
    that later tests see a single process again."""
    import horovod.torch as hvd

    hvd.init()
    yield hvd
    hvd.shutdown()


@pytest.fixture(scope="session")
def horovodrun(require_horovod):
    """``run(script, *args, np=2)``: run a Python script under horovodrun with gloo on localhost."""

    def run(script: Path | str, *args: str, np: int = 2, timeout: float = 120) -> subprocess.CompletedProcess:
        command = [str(HOROVODRUN), "-np", str(np), "-H", f"localhost:{np}", "--gloo",
                   sys.executable, str(script), *map(str, args)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
        if result.returncode:
            output = f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
            pytest.fail(f"{' '.join(command)} exited {result.returncode}:\n{output}")
        return result

    return run
