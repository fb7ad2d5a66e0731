"""Fixtures every test directory shares (pytest finds them here without an import)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HOROVODRUN = Path(sys.executable).parent / "horovodrun"


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
