"""``aikit.elastic.Torch.spmd``, the path users write for :mod:`aikit.runtime.Torch.spmd`:
importing it gives that very module (no copy of its code lives here)."""

import sys

from aikit.runtime.Torch import spmd

sys.modules[__name__] = spmd
