"""The backend-agnostic core: plans, traces, schedules and LR arithmetic.

Nothing here imports torch or tensorflow; the per-framework adapters apply what it computes.
"""

import sys

from aikit.core import plan as _plan
from aikit.core.plan import Plan, make_plan
from aikit.core.scaling import scale_factor, scaled_lr
from aikit.core.schedule import EpochSchedule, Schedule
from aikit.core.trace import Trace, TraceExhaustedError, load_trace

# micro_batch_slices lives with the plan it slices; ``aikit.core.windows``, its old module, stays importable
sys.modules[f"{__name__}.windows"] = _plan

__all__ = [
    "EpochSchedule",
    "Plan",
    "Schedule",
    "Trace",
    "TraceExhaustedError",
    "load_trace",
    "make_plan",
    "scale_factor",
    "scaled_lr",
]
