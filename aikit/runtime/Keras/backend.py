"""Keras on the backend it was loaded with, and that backend's seam.

Keras picks its backend once per process, when it is first imported (``KERAS_BACKEND``, or
``~/.keras/keras.json``); aikit sets none. The Keras adapter is written once, on ``keras.ops`` and
Keras variables; what differs between backends (distribution, host reads, the compiled step's
control flow) is one module per backend, :data:`seam`, chosen here as Keras chooses its own
backend classes at import. A backend switched afterwards (``keras.config.set_backend``) would
leave aikit's classes on the old one: :func:`check_backend` refuses that where users call in.
"""

from __future__ import annotations

import sys

import keras

from aikit.core.errors import InvalidState

BACKEND = keras.backend.backend()
BACKENDS = ("tensorflow", "jax", "torch")

if BACKEND == "tensorflow":
    from aikit.runtime.Keras import tensorflow as seam
elif BACKEND == "jax":
    from aikit.runtime.Keras import jax as seam
elif BACKEND == "torch":
    from aikit.runtime.Keras import torch as seam
else:
    raise InvalidState(
        f"aikit's Keras adapter trains on Keras' tensorflow, jax or torch backend, but Keras runs on {BACKEND!r}, "
        "which cannot train: set KERAS_BACKEND=jax (or tensorflow, torch) before importing keras"
    )

ops = keras.ops

__all__ = ["BACKEND", "BACKENDS", "check_backend", "keras", "ops", "seam", "to_numpy"]


def check_backend(user: str) -> None:
    """Refuse a Keras whose backend changed since aikit's Keras adapter was imported."""
    now = sys.modules.get("keras")
    if now is not keras and now is not None and now.backend.backend() != BACKEND:
        raise InvalidState(
            f"{user}: aikit's Keras adapter was imported with Keras on {BACKEND!r}, but Keras now runs on "
            f"{now.backend.backend()!r} (keras.config.set_backend reloads Keras, not aikit): Keras picks one backend "
            "per process, so set KERAS_BACKEND before importing keras and aikit, and run another backend in another "
            "process"
        )


def to_numpy(value):
    """A tensor or variable's value on the host (a read: between updates, never inside a step)."""
    if isinstance(value, keras.Variable):  # (TensorFlow's .value is its tf.Variable: read it through numpy())
        return value.numpy() if BACKEND == "tensorflow" else keras.ops.convert_to_numpy(value.value)
    return keras.ops.convert_to_numpy(value)
