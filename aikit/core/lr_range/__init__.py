"""The LR range test (Smith, 2017; fastai's ``lr_find``; torch-lr-finder), framework-free.

A range test trains for ``num_iter`` updates while the LR climbs from ``start_lr`` to
``end_lr``, records the (smoothed) loss at every LR and stops early once the loss diverges.
This package owns all of it but the tensors:

* ``rules``: the LR sequence (torch-lr-finder's formulas, to the bit) and the smoothing and
  stop rules (:class:`LossTracker`);
* ``driver``: the loop (:class:`RangeTest`) over an adapter's :class:`Trainer` and
  :class:`Replicas`;
* ``suggestions``: the rules that read an LR off the curve (:func:`suggest`);
* ``history``: the ``lr,loss`` CSV.

The torch and Keras ``LRFinder`` classes (``aikit.lr_finder``) only train, and AutoLRS's
range test (``aikit.core.autolrs``) uses the same sequence, tracker and suggestions.
"""

from aikit.core.lr_range.driver import (
    MAX_SKIPPED,
    ONE_PROCESS,
    VAL_AVERAGES,
    OneProcess,
    RangeTest,
    Replicas,
    Trainer,
)
from aikit.core.lr_range.history import read_history, write_history
from aikit.core.lr_range.rules import STEP_MODES, LossTracker, lr_sequence, step_mode_name
from aikit.core.lr_range.suggestions import BOTTOM_NEAR, SUGGESTIONS, Suggestion, suggest, trim

__all__ = [
    "BOTTOM_NEAR",
    "MAX_SKIPPED",
    "ONE_PROCESS",
    "STEP_MODES",
    "SUGGESTIONS",
    "VAL_AVERAGES",
    "LossTracker",
    "OneProcess",
    "RangeTest",
    "Replicas",
    "Suggestion",
    "Trainer",
    "lr_sequence",
    "read_history",
    "step_mode_name",
    "suggest",
    "trim",
    "write_history",
]
