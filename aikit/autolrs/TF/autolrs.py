"""``aikit.autolrs.TF.autolrs``, the seed's path of :mod:`aikit.keras.autolrs`: importing it gives that very module."""

import sys

from aikit.keras import autolrs

sys.modules[__name__] = autolrs
