"""``aikit.ga.TF.tokens``, the seed's path of :mod:`aikit.keras.tokens`: importing it gives that very module."""

import sys

from aikit.keras import tokens

sys.modules[__name__] = tokens
