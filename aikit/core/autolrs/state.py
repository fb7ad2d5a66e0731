"""An AutoLRS controller's saved state: what it holds, and its check and reading before a load.

A state is plain numbers, strings, lists and dicts (JSON-able): the controller's counters and
decisions as they are (:data:`STATE`, and :data:`STATE_ADDED` with the value a state saved before
them had), the options it was built with, its random generator's state, its stages, trials and
history as plain records, the search's LRs and scores, and a running range test's tracker.
:func:`restored` checks a state whole and reads its objects, so a load that is refused changes
nothing.
"""

from __future__ import annotations

import numpy as np

from aikit.core.autolrs.range_test import restored_tracker
from aikit.core.autolrs.search import LogLRSearch
from aikit.core.autolrs.settings import Settings
from aikit.core.autolrs.stages import Record, Stage, Trial
from aikit.core.errors import InvalidValue
from aikit.core.lr_range import LossTracker

STATE = ("min_lr", "max_lr", "tau", "plan", "steps", "phase", "lr", "rollbacks", "range_test", "_in_phase",
         "_evaluating", "_reference", "_anneal_from", "_kept", "_kept_mark", "_segment_start")
STATE_ADDED = {"_rollbacks_in_row": 0, "_last_val_error": ""}  # state added later: the value a state saved
# before it had


def search_state(search: LogLRSearch | None) -> dict | None:
    """A stage's search as plain numbers: the LRs it tried (scaled to its range) and their scores."""
    return None if search is None else {"x": list(search.x), "scores": list(search.scores), "first": search.first}


def restored(state: dict, settings: Settings) -> tuple[np.random.Generator, list[Stage], list[Record],
                                                      LogLRSearch | None, LossTracker | None]:
    """The random generator, stages, history, search and range-test tracker a controller built
    with ``settings`` continues from, read from ``state``; refused, naming why, where the state
    is not a controller's or was saved with other settings."""
    missing = {*STATE, "options", "rng", "stages", "history", "search", "tracker"} - set(state)
    if missing:
        raise InvalidValue(f"not an AutoLRS state: keys {sorted(missing)} are missing")
    if not isinstance(state["options"], dict):
        raise InvalidValue(f"not an AutoLRS state: its options are a {type(state['options']).__name__}")
    settings.check_saved(state["options"])
    rng = np.random.default_rng()
    rng.bit_generator.state = state["rng"]
    stages = [Stage(**{**s, "trials": [Trial(**t) for t in s["trials"]]}) for s in state["stages"]]
    history = [Record(*r) for r in state["history"]]
    search = tracker = None
    if state["search"] is not None:
        search = LogLRSearch(state["min_lr"], state["max_lr"], settings.kappa, rng,
                             first=state["search"]["first"], design=settings.design)
        search.x, search.scores = list(state["search"]["x"]), list(state["search"]["scores"])
    if state["tracker"] is not None:
        tracker = restored_tracker(state["tracker"], settings.range_steps)
    return rng, stages, history, search, tracker
