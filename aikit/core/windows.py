"""``aikit.core.windows``, the old path of :func:`~aikit.core.plan.micro_batch_slices`'s module:
importing it gives :mod:`aikit.core.plan` itself (no copy of its code lives here)."""

import sys

from aikit.core import plan

sys.modules[__name__] = plan
