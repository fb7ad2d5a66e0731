"""Keras tests written once, for every backend: the main suite runs them on the backend its
process loaded (TensorFlow, Keras' default); tests/test_keras_backends.py runs them again in a
process per backend (KERAS_BACKEND=jax with x64 and two virtual CPU devices, KERAS_BACKEND=torch),
since Keras picks its backend once per process. Run one backend by hand with
``KERAS_BACKEND=jax python -m pytest tests/keras``."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if os.environ.get("KERAS_BACKEND") == "jax" and "keras" not in __import__("sys").modules:
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    import jax

    jax.config.update("jax_enable_x64", True)  # float64 exactness, as on the other backends

import pytest

keras = pytest.importorskip("keras")
