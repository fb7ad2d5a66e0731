"""``aikit.elastic.TF.strategies``, the path users write for :mod:`aikit.runtime.TF.strategies`:
importing it gives that very module (no copy of its code lives here)."""

import sys

from aikit.runtime.TF import strategies

sys.modules[__name__] = strategies
