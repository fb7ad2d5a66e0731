"""tests/keras on Keras' other backends, each in a process of its own (Keras picks its backend once
per process, so this process's Keras, on TensorFlow, runs them in the main suite and never
switches): JAX with x64 over two virtual CPU devices, and torch. Each run is one pytest over
tests/keras; its failures are shown here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ports import free_port

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

    pytest.importorskip("jax")
    port = free_port()
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


# a user of aikit's jax extra (or of torch and keras) has no TensorFlow: the docs' blocks run without it
WITHOUT_TENSORFLOW = """
import sys
sys.modules["tensorflow"] = None  # as if not installed: importing it fails, importlib.util.find_spec finds none
import pytest
sys.exit(pytest.main(["-q", "-n", "0", "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning", *sys.argv[1:]]))
"""
KERAS_BLOCK = re.compile(r"^(?:import keras|from aikit\.(?:keras|\w+\.TF)\b|import aikit\.(?:keras|\w+\.TF)\b)", re.M)
TENSORFLOW_ONLY = {"docs/horovod.md": "Keras under Horovod is TensorFlow's (refused by name on JAX and torch)"}


def keras_documents() -> list[str]:
    """README.md and docs/*.md whose Python blocks (or hidden setups) use Keras."""
    found = [path for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
             if KERAS_BLOCK.search(path.read_text())]
    return [str(path.relative_to(ROOT)) for path in found if str(path.relative_to(ROOT)) not in TENSORFLOW_ONLY]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_the_keras_docs_run_on_every_backend_without_tensorflow(backend):
    """Every document with Keras blocks runs them, as the main suite does on TensorFlow, under
    KERAS_BACKEND=jax and torch, in a process where TensorFlow cannot be imported (a block that
    needs it, as `tf.constant` did, fails here as it fails for a user of that backend)."""
    pytest.importorskip(backend)
    documents = keras_documents()
    assert "docs/keras.md" in documents and len(documents) >= 4, documents
    env = {**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-c", WITHOUT_TENSORFLOW, *documents], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{documents} on {backend}:\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
    assert " passed" in done.stdout.splitlines()[-1], done.stdout[-2000:]


NO_X64 = """
import warnings, jax, keras, numpy as np
import aikit.keras.elastic as elastic
from aikit.core.errors import NoFloat64Warning
from aikit.keras import Optimizer

def warned(train):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train()
    return [str(w.message).split(":")[0] for w in caught if issubclass(w.category, NoFloat64Warning)]

def fit():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(Optimizer(keras.optimizers.SGD(0.1), 2), loss="mse")
    model.fit(np.ones((8, 3)), np.ones((8, 2)), batch_size=4, verbose=0)
    return model

keras.config.set_floatx("float64")
print(warned(lambda: elastic.init(8, 4, verbose=False)), warned(fit))
jax.config.update("jax_enable_x64", True)
print(warned(lambda: elastic.init(8, 4, verbose=False)), warned(fit), fit().weights[0].value.dtype)
"""


def test_jax_without_x64_warns_by_name_that_float64_computes_in_float32():
    """keras.config.set_floatx("float64") on JAX without jax_enable_x64 computes in float32 with no
    error: aikit's init and GA optimizer warn (NoFloat64Warning), and say nothing once x64 is on."""
    pytest.importorskip("jax")
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_ENABLE_X64": "0", "PYTHONPATH": str(ROOT),
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", NO_X64], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-2:] == ["['aikit.keras.elastic.init'] [\"aikit's GA Optimizer\"]",
                                             "[] [] float64"]
