"""What a trace optimizer saves and loads: its position in the trace, the wrapped optimizer's
state and, in the middle of a step, the gradients accumulated so far (so a resume continues to
the same bits). A state is checked whole before anything changes, and loading runs no collective.

:func:`saved`, :func:`check` and :func:`load` are what a
:class:`~aikit.elastic.Torch.trace_optim.TraceOptimizer`'s ``state_dict``, ``check_state`` and
``load_state_dict`` do; what an optimizer keeps beside its trace (the measured noise, an adaptive
run's schedule) are its ``parts``, each a :class:`StatePart` saved under its own key. The format
is the one aikit has always written: states saved before still load.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from aikit.core.errors import InvalidValue
from aikit.core.validate import checked_int
from aikit.runtime.Torch.state_checks import check_groups, check_pending

TraceOptimizer = Any  # the trace optimizer that calls these with itself (not imported: it imports this module)

TRACE_KEYS = {"epoch", "step", "micro", "updates", "rank", "accumulated", "terms"}
_TRACE_KEYS_BEFORE_TERMS = TRACE_KEYS - {"terms"}  # states saved before accumulate(weight=) existed
INTACT = "restore an intact commit (was it edited?)"


class StatePart(NamedTuple):
    """What an optimizer saves under one key beside its trace: ``save()`` gives it, ``check(saved)``
    refuses what cannot load (changing nothing), ``load(saved)`` loads a checked one (an object
    with these three methods, e.g. a :class:`~aikit.runtime.Torch.noise.NoiseMeter`, serves too)."""

    save: Callable[[], Any]
    check: Callable[[Any], Any]
    load: Callable[[Any], None]


def saved(optimizer: TraceOptimizer) -> dict:
    """``optimizer``'s state: the wrapped optimizer's, the position, a step's gradients so far."""
    accumulated = [None if p.grad is None else p.grad.detach().clone() for p in optimizer.params] \
        if optimizer.micro_step else None
    return {"optimizer": optimizer.optimizer.state_dict(),
            "trace": {"epoch": optimizer.epoch, "step": optimizer.step_index, "micro": optimizer.micro_step,
                      "updates": optimizer.updates, "rank": optimizer.sampler.rank, "accumulated": accumulated,
                      "terms": optimizer.loss_terms.saved()},
            **{key: part.save() for key, part in optimizer.parts.items()}}


def check(optimizer: TraceOptimizer, state: dict) -> None:
    """Every reason ``state`` cannot be loaded into ``optimizer``, before anything is changed."""
    name = type(optimizer).__name__
    expected = {"optimizer", "trace", *optimizer.parts}
    if not isinstance(state, dict) or set(state) != expected:
        keys = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise InvalidValue(f"not a {name} state: keys {keys}, expected {sorted(expected)} (load the wrapped "
                           "optimizer's own state into it directly)")
    trace = state["trace"]
    if not isinstance(trace, dict) or set(trace) not in (TRACE_KEYS, _TRACE_KEYS_BEFORE_TERMS):
        raise InvalidValue(f"{name} state['trace'] needs keys {sorted(TRACE_KEYS)}")
    for key in ("epoch", "step", "micro", "updates", "rank"):  # what this optimizer writes (was it edited?)
        checked_int(trace[key], f"the checkpoint's trace {key}", 0, None, "a non-negative integer", INTACT)
    if trace["micro"] and trace["rank"] != optimizer.sampler.rank:
        raise InvalidValue(f"this state was saved by rank {trace['rank']} in the middle of a step; "
                           f"rank {optimizer.sampler.rank} must load its own")
    check_groups(optimizer.optimizer, state["optimizer"])
    if trace["accumulated"] is not None:
        check_pending(optimizer.params, trace["accumulated"])
    for key, part in optimizer.parts.items():
        part.check(state[key])
    optimizer._check_position(state)


def load(optimizer: TraceOptimizer, state: dict) -> None:
    """Check ``state`` whole, then load it into ``optimizer`` and put its sampler where it stood."""
    check(optimizer, state)
    trace = state["trace"]
    optimizer.optimizer.load_state_dict(state["optimizer"])
    optimizer.updates = trace["updates"]
    if trace["accumulated"] is not None:
        for p, grad in zip(optimizer.params, trace["accumulated"], strict=True):
            p.grad = None if grad is None else grad.to(p.device).clone()
    for key, part in optimizer.parts.items():
        part.load(state[key])
    optimizer.sampler.resume(trace["epoch"], trace["step"], trace["micro"])
    optimizer._start(trace["epoch"], trace["step"], trace["micro"])
    optimizer.loss_terms.restart(trace.get("terms"))
    optimizer.updated = False
