"""``aikit.elastic.TF.model``, the seed's path of :mod:`aikit.keras.elastic.model`: importing it gives
that very module."""

import sys

from aikit.keras.elastic import model

sys.modules[__name__] = model
