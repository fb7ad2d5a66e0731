"""Launch real ``horovodrun -np 2 -H localhost:2 --gloo`` jobs from the tests.

Horovod is optional (scripts/install_horovod.sh builds it): without it these tests skip, unless
``AIKIT_REQUIRE_HOROVOD=1`` says the environment promised it, and then they fail.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
HOROVODRUN = Path(sys.executable).parent / "horovodrun"


@functools.cache
def horovod_missing() -> str | None:
    """Why Horovod cannot run here, or None when it can."""
    if not HOROVODRUN.exists():
        return f"{HOROVODRUN} not found"
    try:
        import horovod.torch as hvd
    except ImportError as error:
        return f"import horovod.torch failed: {error}"
    return None if hvd.gloo_built() else "Horovod was built without gloo"


def require_horovod() -> None:
    """Skip the test without Horovod, or fail it when AIKIT_REQUIRE_HOROVOD=1."""
    missing = horovod_missing()
    if missing:
        message = f"Horovod is not installed ({missing}): run scripts/install_horovod.sh"
        if os.environ.get("AIKIT_REQUIRE_HOROVOD") == "1":
            pytest.fail(f"AIKIT_REQUIRE_HOROVOD=1 but {message}")
        pytest.skip(message)


@pytest.fixture
def hvd():
    """``horovod.torch`` initialised in this process as a world of one; shut down afterwards so
    that later tests see a single process again."""
    require_horovod()
    import horovod.torch as hvd

    hvd.init()
    yield hvd
    hvd.shutdown()


@pytest.fixture(scope="session")
def horovodrun():
    """``run(script, *args, np=2)``: run a Python script under horovodrun with gloo on localhost."""
    require_horovod()

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
