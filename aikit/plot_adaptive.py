"""``aikit.plot_adaptive``, the path users write for the adaptive-batch plot (``plot_adaptive``) of
:mod:`aikit.runtime.plots`: importing it gives that very module (no copy of its code lives here)."""

import sys

from aikit.runtime import plots

sys.modules[__name__] = plots
