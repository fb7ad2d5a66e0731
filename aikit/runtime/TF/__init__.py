"""The Keras 3 on TensorFlow runtime under aikit's adapters: the backend check
(:mod:`~aikit.runtime.TF.keras_backend`), strategy selection
(:mod:`~aikit.runtime.TF.strategies`) and the micro-step the trace-driven and adaptive fits
share (:mod:`~aikit.runtime.TF.training`).

Importing this package loads TensorFlow and nothing of aikit.
"""

from aikit.optional import tensorflow  # noqa: F401  (first: a missing tensorflow names its extra)
