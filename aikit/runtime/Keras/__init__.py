"""The Keras 3 runtime under aikit's Keras adapter (:mod:`aikit.keras`), on whichever backend Keras
runs: the backend and its seam (:mod:`~aikit.runtime.Keras.backend`: one module per backend,
:mod:`~aikit.runtime.Keras.tensorflow`, :mod:`~aikit.runtime.Keras.jax`,
:mod:`~aikit.runtime.Keras.torch`, for what truly differs: distribution, host reads, the compiled
step), the ``tf.distribute`` strategy (:mod:`~aikit.runtime.Keras.strategies`) and the micro-step
the trace-driven and adaptive fits share (:mod:`~aikit.runtime.Keras.training`).

Importing this package loads Keras (on the backend ``KERAS_BACKEND`` names: aikit sets none) and
nothing of aikit; on Keras' default backend, TensorFlow, a missing TensorFlow names its extra.
"""

import os
import sys

from aikit.optional import require

if "keras" not in sys.modules and os.environ.get("KERAS_BACKEND", "tensorflow") == "tensorflow":
    require("tensorflow", "this part of aikit", "set KERAS_BACKEND=jax (the jax extra) or torch before importing keras")
require("keras", "aikit's Keras adapter")
