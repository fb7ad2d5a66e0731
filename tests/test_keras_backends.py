"""tests/keras on Keras' other backends, each in a process of its own (Keras picks its backend once
per process, so this process's Keras, on TensorFlow, runs them in the main suite and never
switches): JAX with x64 over two virtual CPU devices, and torch. Each run is one pytest over
tests/keras; its failures are shown here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("keras")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_the_keras_tests_pass_on_every_backend(backend):
    pytest.importorskip(backend)
    env = {**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-W",
                           "ignore::DeprecationWarning", "tests/keras"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, f"tests/keras on {backend}:\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
    assert " passed" in done.stdout.splitlines()[-1], done.stdout[-2000:]
