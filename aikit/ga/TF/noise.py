"""``aikit.ga.TF.noise``, the seed's path of :mod:`aikit.keras.noise`: importing it gives that very module."""

import sys

from aikit.keras import noise

sys.modules[__name__] = noise
