"""TensorFlow/Keras tests: Keras on its TF backend, float64 where a test compares updates."""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")


@pytest.fixture
def float64():
    """Keras layers in float64 for the test, so GA and a big batch agree to ~1e-12."""
    previous = keras.config.floatx()
    keras.config.set_floatx("float64")
    yield
    keras.config.set_floatx(previous)
