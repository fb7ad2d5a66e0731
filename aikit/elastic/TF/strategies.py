"""``aikit.elastic.TF.strategies``, the path users write for :mod:`aikit.runtime.Keras.strategies`:
importing it gives that very module (no copy of its code lives here)."""

import sys

from aikit.runtime.Keras import strategies

sys.modules[__name__] = strategies
