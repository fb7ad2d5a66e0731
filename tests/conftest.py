"""Fixtures every test directory shares (pytest finds them here without an import)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HOROVODRUN = Path(sys.executable).parent / "horovodrun"
# torchrun sets these for its workers; inherited from a surrounding launch they would confuse it
TORCHRUN_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(scope="session")
def torchrun():
    """``run(script, *args)``: a real ``torchrun --standalone --nproc-per-node 2`` (gloo on CPU)
    of a Python script; fails the test with the end of its output when it exits non-zero."""

    def run(script: Path | str, *args: object, timeout: float = 240) -> subprocess.CompletedProcess:
        env = {name: value for name, value in os.environ.items() if name not in TORCHRUN_VARIABLES}
        env.update(OMP_NUM_THREADS="1", MPLBACKEND="Agg")
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                   str(script), *map(str, args)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        if done.returncode:
            pytest.fail(f"torchrun {script} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-4000:]}")
        return done

    return run


def horovod_missing() -> str | None:
    """Why Horovod cannot run here, or None when it can."""
    if not HOROVODRUN.exists():
        return f"{HOROVODRUN} not found"
    try:
        import horovod.torch as hvd
    except ImportError as error:
        return f"import horovod.torch failed: {error}"
    return None if hvd.gloo_built() else "Horovod was built without gloo"


@pytest.fixture(scope="session")
def require_horovod() -> None:
    """Skip the test without Horovod, or fail it when AIKIT_REQUIRE_HOROVOD=1 (the test command
    builds Horovod and sets it, so a broken build cannot pass as a skip)."""
    missing = horovod_missing()
    if missing:
        message = f"Horovod is not installed ({missing}): run scripts/install_horovod.sh"
        if os.environ.get("AIKIT_REQUIRE_HOROVOD") == "1":
            pytest.fail(f"AIKIT_REQUIRE_HOROVOD=1 but {message}")
        pytest.skip(message)


@pytest.fixture
def float64():
    """Keras layers in float64 for one test, so GA and a big batch agree to ~1e-12.

    Keras pins its global dtype policy from ``floatx()`` the first time a layer asks for it, so
    ``set_floatx`` alone does nothing once any earlier test built a layer: set both, and put
    both back."""
    import keras

    previous = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    yield
    keras.config.set_floatx(previous[0])
    keras.config.set_dtype_policy(previous[1])
