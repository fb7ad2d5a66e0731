"""``aikit.lr_finder.TF.lr_finder``, the seed's path of :mod:`aikit.keras.lr_finder`: importing it
gives that very module."""

import sys

from aikit.keras import lr_finder

sys.modules[__name__] = lr_finder
