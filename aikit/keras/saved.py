"""What the Keras GA wrapper saves and loads: the variables Keras saved before the skip counts
were variables (a count is the optimizer's own, as torch's ``skipped``), so weights saved before
and after load alike; and the ``steps`` of the plan compiled now kept through a load."""

from __future__ import annotations

import warnings

import numpy as np

from aikit.core.errors import InvalidValue
from aikit.core.validate import checked_int, positive_int
from aikit.runtime.Keras.backend import to_numpy


class SavedVariables:
    """``save_own_variables`` and ``load_own_variables`` of :class:`aikit.keras.optimizers.Optimizer`."""

    def load_own_variables(self, store) -> None:
        """Load the saved variables but keep this optimizer's ``steps`` (the plan it was compiled
        with; a model saved under another plan must not change it), as the torch wrapper does.
        Saved mid-update, the state loads only into the same ``steps`` (the gradients summed
        belong to an update of that many micro-steps: finishing it with another count would
        make one update of the wrong size); checked before any variable changes."""
        steps = self.steps
        saved = self._saved_variables
        if len(store.keys()) == len(saved):  # else Keras loads nothing (and warns)
            index = {id(v): i for i, v in enumerate(saved)}
            saved_steps = int(np.asarray(store[str(index[id(self._micro_steps)])]))
            accumulated = int(np.asarray(store[str(index[id(self._accumulated)])]))
            positive_int(saved_steps, "the saved GA steps")
            checked_int(accumulated, "the saved GA micro-steps accumulated", 0, saved_steps - 1,
                        f"an integer in [0, {saved_steps}) for steps={saved_steps}", "load an intact file")
            if accumulated and saved_steps != steps:
                raise InvalidValue(
                    f"the weights were saved {accumulated} micro-steps into an update of steps={saved_steps}, but "
                    f"this optimizer has steps={steps}: resume with steps={saved_steps}, or save between updates "
                    "(optimizer.accumulated == 0) to change steps"
                )
        self._load_saved(store)
        self._micro_steps.assign(steps)

    def save_own_variables(self, store) -> None:
        """The variables Keras saved before the skip counts were variables (a count is this
        object's, as torch's ``skipped``): files written before and after load alike."""
        for i, variable in enumerate(self._saved_variables):
            store[str(i)] = to_numpy(variable)

    def _load_saved(self, store) -> None:
        saved = self._saved_variables
        if len(store.keys()) != len(saved):
            warnings.warn(f"Skipping variable loading for optimizer '{self.name}', because it has {len(saved)} "
                          f"variables whereas the saved optimizer has {len(store.keys())} variables.", stacklevel=2)
            return
        for i, variable in enumerate(saved):
            variable.assign(store[str(i)])

