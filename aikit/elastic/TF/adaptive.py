"""``aikit.elastic.TF.adaptive``, the seed's path of :mod:`aikit.keras.elastic.adaptive`: importing it gives
that very module."""

import sys

from aikit.keras.elastic import adaptive

sys.modules[__name__] = adaptive
