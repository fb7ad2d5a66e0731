"""``aikit.elastic.TF.horovod``, the seed's path of :mod:`aikit.keras.elastic.horovod`: importing it gives
that very module."""

import sys

from aikit.keras.elastic import horovod

sys.modules[__name__] = horovod
