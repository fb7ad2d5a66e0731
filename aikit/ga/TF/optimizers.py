"""``aikit.ga.TF.optimizers``, the seed's path of :mod:`aikit.keras.optimizers`: importing it gives that very module."""

import sys

from aikit.keras import optimizers

sys.modules[__name__] = optimizers
