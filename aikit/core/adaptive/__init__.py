"""The adaptive batch, framework-free: one algorithm behind PyTorch's ``AdaptiveSampler`` and
``AdaptiveOptimizer`` and Keras' ``fit_adaptive``.

An adaptive run decides the global batch of every update while training, by a
:class:`~aikit.core.goodput.GoodputController` (Pollux/AdaptDL's goodput = throughput x
statistical efficiency). The adapters move tensors, call collectives and hook into their
framework; everything else is written here, once:

* **Packing** (:class:`AdaptiveSchedule`): update ``u`` takes the controller's batch at the time
  it is decided (``lookahead`` updates ahead of training), or, where less is left of its epoch,
  the largest batch of what is left that it can run (:meth:`BatchSplit.largest
  <aikit.core.goodput.BatchSplit.largest>`). Updates take consecutive samples of the epoch's
  permutation, :mod:`aikit.core.schedule`'s own, so the epoch views are ordinary
  :class:`~aikit.core.schedule.EpochSchedule` objects and a replay of the batches with a trace
  gets the same samples.
* **End of epoch**: an epoch ends with the update after which what is left runs no batch: fewer
  samples than one micro-batch (a fixed micro-batch), or than the replicas (an even split). An
  update never straddles two epochs.
* **Timing** (:class:`UpdateClock`): each update's whole cycle, and the cycle less its
  micro-steps but one, go to the throughput model.
* **Each update** (:class:`AdaptiveRun`): its LR (:func:`learning_rate`), the record of what it
  measured, its history row (:func:`history_row`, one format for both adapters), the
  controller's decision (logged on logger ``aikit.adaptive``) and the next batches decided.
"""

from __future__ import annotations

from aikit.core.adaptive.packing import AdaptiveSchedule
from aikit.core.adaptive.run import HISTORY_KEYS, AdaptiveRun, history_row, learning_rate
from aikit.core.adaptive.timing import UpdateClock, update_timing

__all__ = ["HISTORY_KEYS", "AdaptiveRun", "AdaptiveSchedule", "UpdateClock", "history_row", "learning_rate",
           "update_timing"]
