"""``aikit.elastic.Torch.distributed``, the path users write for :mod:`aikit.runtime.Torch.distributed`:
importing it gives that very module (no copy of its code lives here)."""

import sys

from aikit.runtime.Torch import distributed

sys.modules[__name__] = distributed
