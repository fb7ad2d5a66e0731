"""Load Keras on its TensorFlow backend, or say clearly why not."""

from __future__ import annotations

import os
import sys

from aikit.core.errors import InvalidState
from aikit.optional import require


def keras_on_tensorflow():
    """Import Keras with ``KERAS_BACKEND=tensorflow`` (the default we set) and return it.

    The TF adapters build on ``tf.distribute`` and TF variables; a Keras already loaded on
    JAX or torch cannot run them, so that is refused with the fix rather than failing later.
    """
    if "keras" not in sys.modules:
        os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    keras = require("keras", "aikit's Keras adapters")

    if keras.backend.backend() != "tensorflow":
        raise InvalidState(
            f"aikit's TF adapters need Keras on the TensorFlow backend, but Keras runs on "
            f"{keras.backend.backend()!r}: set KERAS_BACKEND=tensorflow before importing keras"
        )
    return keras
