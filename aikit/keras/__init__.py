"""aikit for Keras 3, on every backend (TensorFlow, JAX, torch): one adapter, written on
``keras.ops`` and Keras variables, over the backend's seam (:mod:`aikit.runtime.Keras.backend`).

Here: the GA optimizer wrapper :class:`Optimizer` (Run:AI's prebuilt ``optimizers.Adam(steps, ...)``
and the rest), :class:`TokenMean` (token-weighted accumulation in ``fit``) and
:class:`NoiseOptimizer` (the gradient noise of every update). Beside it:
:mod:`aikit.keras.elastic` (``init``, ``Model``, ``fit_trace``, ``fit_adaptive``),
:mod:`aikit.keras.lr_finder` (``LRFinder``) and :mod:`aikit.keras.autolrs` (``AutoLRS``). The seed's
paths (``aikit.ga.TF``, ``aikit.elastic.TF``, ``aikit.lr_finder.TF``, ``aikit.autolrs.TF``) are
these modules.
"""

import aikit.runtime.Keras  # noqa: F401  isort: skip  (first: a missing keras, or TensorFlow, names its extra)
from aikit.keras import optimizers
from aikit.keras.noise import NoiseOptimizer
from aikit.keras.optimizers import Optimizer
from aikit.keras.tokens import TokenMean

__all__ = ["NoiseOptimizer", "Optimizer", "TokenMean", "optimizers"]
