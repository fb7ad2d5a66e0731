"""The GA wrapper's ``state_dict``: what it holds, and every check before a load changes anything.

``{"optimizer": the wrapped optimizer's state_dict, "ga": {...}}``, where ``ga`` holds the
update's ``steps``, its window's counts (:class:`~aikit.ga.Torch.window.Window`: its ``micro_step`` as ``position``,
``samples``, ``weighted``, ``unit``), the ``micro_steps`` ever taken, the ``reduction``, the loss
``terms`` counted so far (None where none were declared) and, saved mid-update, the
``pending_grads`` accumulated so far, so a resume continues identically. A state saved before
``accumulate(weight=)`` existed lacks ``terms`` and loads; Run:AI's AIkit's is converted first
(:func:`~aikit.ga.Torch.runai.from_runai`).
"""

from __future__ import annotations

from typing import Any

import torch

from aikit.core.errors import InvalidValue
from aikit.core.ga import reduction_name
from aikit.core.validate import checked_int, non_negative_int, positive_int
from aikit.ga.Torch.window import Window
from aikit.runtime.Torch.state_checks import check_groups, check_pending

STATE_KEYS = {"optimizer", "ga"}
GA_KEYS = {"steps", "position", "micro_steps", "reduction", "samples", "weighted", "unit", "terms", "pending_grads"}
GA_KEYS_BEFORE_TERMS = GA_KEYS - {"terms"}  # checkpoints saved before accumulate(weight=) existed


def ga_state(window: Window, *, micro_steps: int, taken: int, reduction: str, terms: int | None,
             pending: list[torch.Tensor | None]) -> dict[str, Any]:
    """The wrapper's ``state_dict()["ga"]``: ``micro_steps`` per update, ``taken`` ever. Its keys are
    the saved format, which checkpoints keep: ``steps`` (the micro-steps per update, Run:AI's
    name), ``position`` (the window's ``micro_step``) and ``micro_steps`` (those taken)."""
    return {"steps": micro_steps, "position": window.micro_step, "micro_steps": taken, "reduction": reduction,
            "samples": window.samples, "weighted": window.weighted, "unit": window.unit, "terms": terms,
            "pending_grads": pending}


def check_state(state_dict: Any, optimizer: torch.optim.Optimizer, micro_steps: int, reduction: str) -> None:
    """Every reason a wrapper of ``optimizer`` with ``micro_steps`` and ``reduction`` cannot load
    ``state_dict`` (already converted from Run:AI's), before anything is changed."""
    if not isinstance(state_dict, dict) or set(state_dict) != STATE_KEYS:
        if isinstance(state_dict, dict) and "param_groups" in state_dict:
            raise InvalidValue(
                "this is a torch optimizer's state_dict, not an aikit GA Optimizer's: load it "
                "with optimizer.optimizer.load_state_dict(...)"
            )
        keys = sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict).__name__
        raise InvalidValue(f"GA Optimizer state_dict needs keys {sorted(STATE_KEYS)}, got {keys}")
    ga = state_dict["ga"]
    if not isinstance(ga, dict) or set(ga) not in (GA_KEYS, GA_KEYS_BEFORE_TERMS):
        got = sorted(ga) if isinstance(ga, dict) else type(ga).__name__
        raise InvalidValue(f"GA Optimizer state_dict['ga'] needs keys {sorted(GA_KEYS)}, got {got}")
    _check_counters(ga)
    micro_step = ga["position"]
    if ga["reduction"] != reduction:
        raise InvalidValue(
            f"the checkpoint was saved by an optimizer with reduction={ga['reduction']!r}, this one has "
            f"reduction={reduction!r}: build it with reduction={ga['reduction']!r} (the reduction goes "
            "with the loss the run uses)"
        )
    if micro_step and ga["steps"] != micro_steps:
        raise InvalidValue(
            f"the checkpoint was saved {micro_step} micro-steps into an update of steps={ga['steps']}, "
            f"but this optimizer has steps={micro_steps}: resume with steps={ga['steps']}, or save "
            "between updates (optimizer.micro_step == 0) to change steps"
        )
    check_groups(optimizer, state_dict["optimizer"])
    if micro_step:
        check_pending([p for group in optimizer.param_groups for p in group["params"]], ga["pending_grads"])


def _check_counters(ga: dict[str, Any]) -> None:
    """The saved counters are what the wrapper writes: ``position`` in ``[0, steps)`` (a state
    that says 7 of 4 would never update again), counts non-negative, the reduction a name."""
    micro_steps = positive_int(ga["steps"], "the checkpoint's GA steps")
    checked_int(ga["position"], "the checkpoint's GA position", 0, micro_steps - 1,
                f"an integer in [0, {micro_steps}) for steps={micro_steps}",
                "restore an intact commit (was the state edited?)")
    for key in ("micro_steps", "samples", "weighted"):
        non_negative_int(ga[key], f"the checkpoint's GA {key}")
    if ga["unit"] is not None:
        positive_int(ga["unit"], "the checkpoint's GA unit")
    if ga.get("terms") is not None:
        non_negative_int(ga["terms"], "the checkpoint's GA terms")
    reduction_name(ga["reduction"])
