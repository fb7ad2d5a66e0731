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


@pytest.mark.slow
def test_jax_data_parallel_over_two_processes_on_localhost():
    """Two JAX processes joined by keras.distribution.initialize: aikit's init counts both
    processes' devices (2, rank 0 the master), each process feeds its share of every micro-step,
    and both end on the one-device big batch's weights."""
    import json
    import socket

    pytest.importorskip("jax")
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    workers = [subprocess.Popen([sys.executable, "tests/keras/jax_process_worker.py", str(port), str(rank)],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for rank in (0, 1)]
    outputs = [worker.communicate(timeout=300) for worker in workers]
    for worker, (out, err) in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, f"{out[-2000:]}\n{err[-4000:]}"
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert [(r["rank"], r["gpus"], r["steps"], r["processes"], r["master"]) for r in results] == \
        [(0, 2, 2, 2, True), (1, 2, 2, 2, False)]
    assert max(r["difference"] for r in results) < 1e-12
