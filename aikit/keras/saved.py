"""What the Keras GA wrapper saves and loads: the variables Keras saved before the skip counts
were variables (a count is the optimizer's own, as torch's ``skipped``), so weights saved before
and after load alike; and the ``steps`` of the plan compiled now kept through a load."""

from __future__ import annotations

import warnings

import numpy as np

from aikit.core.errors import InvalidValue
from aikit.core.validate import checked_int, positive_int
from aikit.runtime.Keras.backend import to_numpy


def load_keeping_steps(optimizer, store) -> None:
    """``optimizer.load_own_variables``: load the saved variables but keep its ``steps`` (the plan it
    was compiled with; a model saved under another plan must not change it), as the torch wrapper
    does. Saved mid-update, the state loads only into the same ``steps`` (the gradients summed
    belong to an update of that many micro-steps: finishing it with another count would make one
    update of the wrong size); checked before any variable changes."""
    steps = optimizer.steps
    saved = optimizer._saved_variables
    if len(store.keys()) == len(saved):  # else Keras loads nothing (and warns)
        index = {id(v): i for i, v in enumerate(saved)}
        saved_steps = int(np.asarray(store[str(index[id(optimizer._micro_steps)])]))
        accumulated = int(np.asarray(store[str(index[id(optimizer._accumulated)])]))
        positive_int(saved_steps, "the saved GA steps")
        checked_int(accumulated, "the saved GA micro-steps accumulated", 0, saved_steps - 1,
                    f"an integer in [0, {saved_steps}) for steps={saved_steps}", "load an intact file")
        if accumulated and saved_steps != steps:
            raise InvalidValue(
                f"the weights were saved {accumulated} micro-steps into an update of steps={saved_steps}, but "
                f"this optimizer has steps={steps}: resume with steps={saved_steps}, or save between updates "
                "(optimizer.accumulated == 0) to change steps"
            )
    _load_saved(optimizer, store)
    optimizer._micro_steps.assign(steps)


def save_variables(optimizer, store) -> None:
    """``optimizer.save_own_variables``: the variables Keras saved before the skip counts were
    variables (a count is the optimizer's own, as torch's ``skipped``): files written before and
    after load alike."""
    for i, variable in enumerate(optimizer._saved_variables):
        store[str(i)] = to_numpy(variable)


def _load_saved(optimizer, store) -> None:
    saved = optimizer._saved_variables
    if len(store.keys()) != len(saved):
        warnings.warn(f"Skipping variable loading for optimizer '{optimizer.name}', because it has {len(saved)} "
                      f"variables whereas the saved optimizer has {len(store.keys())} variables.", stacklevel=3)
        return
    for i, variable in enumerate(saved):
        variable.assign(store[str(i)])
