"""Fixtures every test directory shares (pytest finds them here without an import)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from capabilities import skip_or_fail
from launching import run_launcher
from multihost import network, require_netns  # noqa: F401 (fixtures: several hosts in network namespaces)

from aikit.runtime import process  # framework-free: what init() publishes lives here

ROOT = Path(__file__).resolve().parents[1]
HOROVODRUN = Path(sys.executable).parent / "horovodrun"
# torchrun sets these for its workers; inherited from a surrounding launch they would confuse it
TORCHRUN_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def _process_state_kept_to_the_test():
    """What a test's ``init()`` publishes (``aikit.runtime.process``, and the attributes it sets on
    a package published before) ends with the test: a ragged plan one test made must not be the
    plan another test's GA wrapper follows."""
    saved = process.ProcessState(dict(process._state.publishers), dict(process._state.extras_on),
                                 process._state.latest, process._state.sampler_made_last,
                                 process._state.keras_distribution)
    # a package published before keeps its attributes (the plan init() set on it, which plan_of() reads)
    published = {module: dict(module.__dict__) for module in saved.publishers.values()}
    yield
    names = {"plan", *process.PUBLIC, *(extra for state in (saved, process._state)
                                        for extras in state.extras_on.values() for extra in extras)}
    for module, before in published.items():
        for name in names:
            if name in before:
                setattr(module, name, before[name])
            else:
                module.__dict__.pop(name, None)
    process._state = saved


def launch(name: str, command: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """Run a multi-process launcher (a worker that died of a signal at exit gets one rerun:
    :func:`launching.run_launcher`); fail the test with the end of its output when it exits
    non-zero."""
    done = run_launcher(name, command, env, timeout=timeout, cwd=ROOT)
    if done.returncode:
        pytest.fail(f"{name} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    return done


def torchrun_command(script: Path | str, *args: object, nproc: int = 2) -> tuple[list[str], dict[str, str]]:
    """The command and environment of a ``torchrun --standalone --nproc-per-node NPROC`` of a script."""
    env = {name: value for name, value in os.environ.items() if name not in TORCHRUN_VARIABLES}
    env.update(OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               str(script), *map(str, args)]
    return command, env


@pytest.fixture(scope="session")
def torchrun():
    """``run(script, *args, nproc=2)``: a real ``torchrun --standalone --nproc-per-node 2`` (gloo on
    CPU) of a Python script (see :func:`launch`); ``run.command(script, *args, nproc=2)`` is its
    command and environment, for a test that starts and kills it itself."""

    def run(script: Path | str, *args: object, timeout: float = 240, nproc: int = 2) -> subprocess.CompletedProcess:
        command, env = torchrun_command(script, *args, nproc=nproc)
        return launch(f"torchrun {script}", command, env, timeout)

    run.command = torchrun_command
    return run


@pytest.fixture(scope="session")
def horovodrun(require_horovod):
    """``run(script, *args, np=2)``: a real ``horovodrun -np 2 -H localhost:2 --gloo`` of a
    Python script (see :func:`launch`)."""

    def run(script: Path | str, *args: object, np: int = 2, timeout: float = 240) -> subprocess.CompletedProcess:
        command = [str(HOROVODRUN), "-np", str(np), "-H", f"localhost:{np}", "--gloo",
                   sys.executable, str(script), *map(str, args)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        return launch(f"horovodrun {script}", command, env, timeout)

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
        skip_or_fail("HOROVOD", f"Horovod is not installed ({missing}): run scripts/install_horovod.sh")


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
