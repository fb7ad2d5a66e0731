"""Adaptive batch for PyTorch: aikit picks the global batch while training.

:class:`AdaptiveSampler` and :class:`AdaptiveOptimizer` are the adaptive pair of
:class:`~aikit.elastic.Torch.sampler.TraceSampler` and
:class:`~aikit.elastic.Torch.trace_optim.TraceOptimizer`: the same micro-batches, the same deal
to replicas, the same single all-reduce and update, but the trace is written while training by a
:class:`~aikit.core.goodput.GoodputController` (Pollux/AdaptDL's goodput = throughput x
statistical efficiency), so a finished run's batches (:attr:`AdaptiveSampler.trace`) replay it
exactly with ``TraceSampler`` and a trace optimizer.

The algorithm is :mod:`aikit.core.adaptive`'s, the same as Keras' ``fit_adaptive``: which
batch each update takes and where an epoch ends (:class:`~aikit.core.adaptive.AdaptiveSchedule`),
how updates are timed (:class:`~aikit.core.adaptive.UpdateClock`), and each update's LR, history
row and decision (:class:`~aikit.core.adaptive.AdaptiveRun`). This module adds what is torch's:

* **Gradient noise, cheaply.** A gradient hook on every parameter takes each micro-batch's
  squared gradient norm as autograd produces it, before it is added into ``.grad``
  (:class:`~aikit.runtime.Torch.noise.NoiseMeter`, as for a trace optimizer's AdaScale); the
  replicas' norms and their step times travel in the update's one all-reduce, appended to the
  gradients (:meth:`aikit.runtime.Torch.accumulator.Accumulator.reduce`), and
  :func:`aikit.core.gradient_noise.update_estimates` turns them into ``|G|²`` and ``tr(Σ)``.
* **Every replica decides the same.** The controller sees only all-reduced numbers, so every
  replica proposes the same batch at the same update.
* **Changes at well-defined updates.** A DataLoader draws indices ahead of training (its
  workers prefetch), so the batch of update ``u`` is fixed ``lookahead`` updates before ``u``
  is trained: a decision after update ``k`` takes effect at update ``k + 1 + lookahead``. The
  sampler refuses to run further ahead than that, naming the fix.
* **GA equality.** Every update is the one big-batch step over its samples: the accumulated
  gradient enters its update with the share ``micro_batch / B`` (``EpochSchedule.share``) whatever ``B`` is.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from aikit.core.adaptive import AdaptiveRun, UpdateClock
from aikit.core.autolrs import write_schedule
from aikit.core.errors import InvalidType, InvalidValue
from aikit.core.goodput import GoodputController
from aikit.core.lr_policy import LRPolicy
from aikit.core.schedule import EpochSchedule
from aikit.core.skips import MAX_SKIPS_IN_A_ROW
from aikit.elastic.Torch.adaptive_sampler import AdaptiveSampler
from aikit.elastic.Torch.measures import AdaptiveMeasures
from aikit.elastic.Torch.trace_optim import TraceOptimizer
from aikit.elastic.Torch.trace_state import StatePart

__all__ = ["AdaptiveOptimizer", "AdaptiveSampler"]


class AdaptiveOptimizer(TraceOptimizer):
    """Wraps a torch optimizer to train through an :class:`AdaptiveSampler`, measuring the
    gradient noise and letting the sampler's controller pick the next batches.

    ``rule`` scales the LR from ``sampler``'s ``ref_batch_size`` to each update's batch:
    ``"adascale"`` (default), ``"sqrt"``, ``"linear"`` or ``"constant"``, with the controller's
    smoothed noise. ``clock`` times the updates (seconds); what it measures:
    :class:`~aikit.elastic.Torch.measures.AdaptiveMeasures`. Other arguments as
    :class:`~aikit.elastic.Torch.trace_optim.TraceOptimizer`. Under torchrun give it the plain
    model (no DDP): its one all-reduce per update replaces DDP's.

    ``history`` holds one row per update (:func:`aikit.core.adaptive.history_row`, as Keras'
    ``fit_adaptive`` returns them): ``epoch``, ``step``, ``batch_size``, ``ga_steps``,
    ``micro_batch``, ``lr``, ``seconds`` and the smoothed ``grad_sq``, ``trace`` and ``noise_scale``.
    """

    kind = "adaptive optimizer"
    _decides_while_training = True
    _measures_noise = True  # the controller reads the noise whatever the rule

    def __init__(self, optimizer: torch.optim.Optimizer, sampler: AdaptiveSampler, rule: str = "adascale",
                 log_steps: int | None = None, *, warmup_steps: int = 0, broadcast: bool = True,
                 max_grad_norm: float | None = None, scaler: Any = None, clock: Callable[[], float] = time.perf_counter,
                 skip_nonfinite: bool = True, max_skips_in_a_row: int | None = MAX_SKIPS_IN_A_ROW) -> None:
        if not isinstance(sampler, AdaptiveSampler):
            raise InvalidType(f"AdaptiveOptimizer needs the AdaptiveSampler that feeds it, got {sampler!r}")
        self.run = AdaptiveRun(sampler.schedule, rule)
        policy = LRPolicy(rule, sampler.controller.ref_batch_size, warmup_steps, adaptive=True,
                          user="AdaptiveOptimizer")
        super().__init__(optimizer, sampler, policy=policy, log_steps=log_steps, broadcast=broadcast,
                         max_grad_norm=max_grad_norm, scaler=scaler, skip_nonfinite=skip_nonfinite,
                         max_skips_in_a_row=max_skips_in_a_row)
        self.clock = UpdateClock(clock)
        self.measures = AdaptiveMeasures(self, self.run, self.clock)
        schedule = sampler.schedule
        self.parts = {"adaptive": StatePart(schedule.state_dict, schedule.checked,
                                            lambda saved: schedule.load(*schedule.checked(saved)))}
        self.measures.arm()

    @property
    def history(self) -> list[dict]:
        """One row per update this optimizer trained (:func:`aikit.core.adaptive.history_row`)."""
        return self.run.history

    # --- the adaptive schedule's epoch, read fresh (it grows while training) -----------------------
    @property
    def epoch_schedule(self) -> EpochSchedule:
        return self.sampler.schedule.epoch(self._epoch)

    @epoch_schedule.setter
    def epoch_schedule(self, schedule: EpochSchedule) -> None:
        self._epoch = schedule.epoch

    @property
    def counts(self) -> np.ndarray:
        return self.epoch_schedule.counts(self.sampler.rank)

    @counts.setter
    def counts(self, _counts: np.ndarray) -> None:
        pass  # read from the plan

    @property
    def controller(self) -> GoodputController:
        return self.sampler.controller

    def set_epoch(self, epoch: int) -> None:
        self.clock.restart()  # an epoch's first update waits for the DataLoader: untimed
        super().set_epoch(epoch)

    def _log(self, step: int, batch: int, lr: tuple[float, ...]) -> None:
        if self.updates % self.log_steps == 0:
            row = self.history[-1]
            print(f"aikit adaptive: epoch {row['epoch']} update {row['step']} batch {batch} lr {lr[0]:.6g} "
                  f"noise scale {row['noise_scale']:.4g}", flush=True)

    def write_lr_schedule(self, path: str) -> None:
        """Write the LR of every update as a ``step,lr`` CSV (exact floats): with the sampler's
        trace, ``ConstantOptimizer`` and ``UpdateScheduler(ReplaySchedule(optimizer, path))``
        replay even an AdaScale run bit for bit (for optimizers whose groups share one LR)."""
        if len(self.history) != len(self.controller.batches):
            raise InvalidValue(
                f"this optimizer saw {len(self.history)} of the run's {len(self.controller.batches)} updates (it was "
                "resumed; the LRs before are not kept): write the schedule from the run that trained them all")
        write_schedule(path, [(row["step"], row["lr"]) for row in self.history])

    # --- checkpoints: the trace optimizer's state and the adaptive schedule's ------------------------
    def _check_position(self, state: dict) -> None:
        trace, schedule = state["trace"], self.sampler.schedule
        sizes, starts, _ = schedule.checked(state["adaptive"])
        problem = schedule.position_problem(sizes, starts, trace["epoch"], trace["step"], trace["micro"],
                                            self.sampler.rank)
        if problem:
            raise InvalidValue(f"the adaptive state's position does not exist: {problem}")

    def __repr__(self) -> str:
        return f"AdaptiveOptimizer({self.optimizer!r}, rule={self.rule!r}, ref_batch_size={self.ref_batch_size})"

