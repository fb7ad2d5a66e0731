"""The backend-agnostic core: plans, traces, schedules and LR arithmetic.

Nothing here imports torch or tensorflow; the per-framework adapters apply what it computes.
The names below load with their module on first use (PEP 562), so an adapter that needs one
part of the core (``aikit.autolrs.Torch`` needs ``core.autolrs``) loads that part, not pandas
and the trace reader with it.
"""

import importlib

_HOME = {
    "EpochSchedule": "schedule",
    "LRPolicy": "lr_policy",
    "Plan": "plan",
    "Schedule": "schedule",
    "Trace": "trace",
    "TraceExhaustedError": "trace",
    "TraceTooShortError": "trace",
    "load_trace": "trace",
    "make_plan": "plan",
    "scale_factor": "scaling",
    "scaled_lr": "scaling",
}

__all__ = sorted(_HOME)


def __getattr__(name: str):
    """``aikit.core.Plan`` and the rest of :data:`__all__`, and any submodule, imported on first use."""
    if name in _HOME:
        return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as error:
        if error.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
