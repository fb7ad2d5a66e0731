"""TensorFlow/Keras tests: Keras on its TF backend (the ``float64`` fixture is in tests/conftest.py)."""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

