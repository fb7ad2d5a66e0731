"""What a trace optimizer measures in each update, its numbers riding in the update's one all-reduce.

:class:`UpdateNoise` is the gradient noise a measured LR rule (AdaScale) reads, smoothed by a
:class:`~aikit.runtime.Torch.noise.NoiseMeter` (nothing where the rule reads none);
:class:`AdaptiveMeasures` an adaptive run's, each update's noise and timing recorded in its
:class:`~aikit.core.adaptive.AdaptiveRun` for the controller; :class:`AdaScaleGains` eth-easl's
AdaScale, the gains and progress of that noise. The optimizer calls them at fixed points:
``end_micro_step`` once a ``step()``'s micro-batch is done, ``statistics`` and ``observe`` around the
all-reduce, ``updated`` after the update, ``restart`` at a new position, ``clear`` when a step cut
short is dealt again.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from aikit.core.adaptive import AdaptiveRun, UpdateClock, update_timing
from aikit.core.errors import InvalidValue
from aikit.core.gradient_noise import NoiseEstimate, gain
from aikit.runtime.Torch.noise import NoiseMeter

TraceOptimizer = Any  # the optimizer that measures (not imported: it imports this module)


class UpdateNoise:
    """The gradient noise of ``optimizer``'s updates in ``noise`` (None: nothing measured)."""

    def __init__(self, optimizer: TraceOptimizer, noise: NoiseMeter | None) -> None:
        self.optimizer, self.noise = optimizer, noise

    def end_micro_step(self) -> None:
        """The micro-batch of a ``step()`` is done (its closure run): its norms a part of their own."""
        if self.noise is not None:
            self.noise.norms.close()

    def restart(self) -> None:
        """The optimizer stands at a new position (norms a checkpoint held stay)."""

    def updated(self, lr: tuple[float, ...]) -> None:
        """After the update (applied or skipped: ``optimizer.updated``), the position on the next step."""

    def clear(self) -> None:
        if self.noise is not None:
            self.noise.norms.clear()

    def remove(self) -> None:
        """Remove the gradient hooks (to go on with another optimizer)."""
        if self.noise is not None:
            self.noise.norms.remove()

    def statistics(self) -> list[float]:
        """What this replica adds to the update's all-reduce: its micro-batches' norms per group."""
        return [] if self.noise is None else self.noise.statistics(self.optimizer.engine.scaler)

    def observe(self, totals: list[float]) -> None:
        """The update's reduced statistics in, before its LR is set: its gradient noise, smoothed."""
        if self.noise is not None:
            optimizer = self.optimizer
            schedule, step = optimizer.epoch_schedule, optimizer.step_index
            self.noise.observe(totals, int(schedule.micro_batches_per_step[step]), optimizer.batch,
                               schedule.micro_size(step), optimizer._gradient_scale(), optimizer.engine.scaler)

    def smoothed(self) -> NoiseEstimate | None:
        """The smoothed noise the LR policy reads (None where nothing is measured yet)."""
        return None if self.noise is None else self.noise.smoothed()


class AdaptiveMeasures(UpdateNoise):
    """An adaptive ``optimizer``'s updates: the whole model's noise and the update's timing
    (``clock``) recorded in ``run``, whose controller's smoothed noise the LR reads."""

    def __init__(self, optimizer: TraceOptimizer, run: AdaptiveRun, clock: UpdateClock) -> None:
        super().__init__(optimizer, optimizer.noise)
        self.run, self.clock = run, clock

    def end_micro_step(self) -> None:
        super().end_micro_step()
        self.clock.end_micro_step()  # the update's own work comes after its last micro-step's mark

    def restart(self) -> None:
        """No norms pending, the next update untimed."""
        self.noise.norms.clear()
        self.clock.restart()
        self.arm()

    def updated(self, lr: tuple[float, ...]) -> None:
        """The update's history row, the controller's decision (none after a skipped update) and
        the next batches decided."""
        optimizer = self.optimizer
        self.run.finish(optimizer.epoch, lr[0], log_change=optimizer.sampler.rank == 0, applied=optimizer.updated)
        self.arm()

    def arm(self) -> None:
        """Record micro-batch norms only for an update of two parts or more: a one-part update
        (one device, one micro-batch) cannot measure the noise, so its hooks cost nothing; nor
        does an update of a run that holds its batch (it measures nothing)."""
        optimizer = self.optimizer
        schedule, step, sampler = optimizer.epoch_schedule, optimizer.step_index, optimizer.sampler
        self.noise.norms.active = not sampler.schedule.holds(schedule.first_step + step) and (
            sampler.num_replicas > 1 or step >= len(schedule) or schedule.micro_steps[step] >= 2)

    def statistics(self) -> list[float]:
        """This replica's micro-batch norms per param group and its timing of the update."""
        optimizer = self.optimizer
        schedule, step = optimizer.epoch_schedule, optimizer.step_index
        even = int(schedule.batch_sizes[step]) % (schedule.micro_size(step) * optimizer.sampler.num_replicas) == 0
        timing = self.clock.measure(timed=even, ends_at_last_mark=True)  # a replica short of a micro-batch: untimed
        return [*super().statistics(), *timing]

    @torch.no_grad()
    def observe(self, totals: list[float]) -> None:
        """The update's noise and timing to the controller, before its LR is set (AdaScale's
        gain includes this update's noise)."""
        optimizer = self.optimizer
        groups, schedule, step = len(optimizer.param_groups), optimizer.epoch_schedule, optimizer.step_index
        batch, micro = int(schedule.batch_sizes[step]), schedule.micro_size(step)
        parts, noise = int(schedule.micro_batches_per_step[step]), None
        if parts >= 2 and self.noise.norms.active:  # one part alone cannot tell noise from signal
            estimates = self.noise.measure(totals[:groups], parts, batch, micro, optimizer._gradient_scale(),
                                           optimizer.engine.scaler, whole=True)
            noise = estimates[0] if estimates else None  # None: an inf/NaN step AMP skips
        timing = update_timing(totals[groups:], optimizer.sampler.num_replicas)
        self.run.record(batch, micro, int(schedule.micro_steps[step]), timing, noise)

    def smoothed(self) -> NoiseEstimate | None:
        return self.optimizer.controller.noise.measured


class AdaScaleGains(UpdateNoise):
    """eth-easl's AdaScale: each param group's gain of the step's batch over a micro-batch from its
    smoothed noise, the whole model's (:attr:`last_gain`) and their sum, :attr:`progress` (put back
    where an update was skipped); saved as ``{"trackers", "progress", "gains", "pending"}``."""

    def __init__(self, optimizer: TraceOptimizer, noise: NoiseMeter) -> None:
        super().__init__(optimizer, noise)
        noise.owner = "AdaScaleOptimizer state['adascale']"  # what a refused state is called
        self.gains = (1.0,) * len(optimizer.param_groups)
        self.last_gain, self.progress = 1.0, 0.0
        self._progress_before = 0.0  # put back where the update is skipped (restored, not subtracted: exact)

    def observe(self, totals: list[float]) -> None:
        super().observe(totals)  # the update's noise, smoothed per group
        batch, micro = self.optimizer.batch, self.optimizer.epoch_schedule.micro_batch
        self.gains = tuple(_gain(self.noise.smoothed(group), batch, micro) for group in range(len(self.gains)))
        self.last_gain = _gain(self.noise.smoothed(), batch, micro)
        self._progress_before, self.progress = self.progress, self.progress + self.last_gain

    def updated(self, lr: tuple[float, ...]) -> None:
        if not self.optimizer.updated:  # skipped (inf/NaN): no step made, so no progress
            self.progress = self._progress_before

    def averages(self) -> tuple[np.ndarray, np.ndarray]:
        """eth-easl's ``grad_var_avg`` (``tr(Σ) / micro_batch``) and ``grad_sqr_avg`` (``|G|²``) per group."""
        micro = self.optimizer.epoch_schedule.micro_batch
        return (np.array([t.smoothed.trace / micro if t.updates else 0.0 for t in self.noise.trackers]),
                np.array([t.smoothed.grad_sq if t.updates else 1.0 for t in self.noise.trackers]))

    def save(self) -> dict:
        return {**self.noise.save(), "progress": self.progress, "gains": list(self.gains)}

    def check(self, saved: dict) -> None:
        groups = len(self.gains)
        if not isinstance(saved, dict) or set(saved) != {"trackers", "progress", "gains", "pending"} \
                or len(saved["gains"]) != groups or len(saved["trackers"]) != groups:
            raise InvalidValue(f"AdaScaleOptimizer state['adascale'] needs keys ['gains', 'pending', 'progress', "
                               f"'trackers'] with one tracker and one gain per param group ({groups})")
        self.noise.check(saved)

    def load(self, saved: dict) -> None:
        self.noise.load(saved)
        self.progress, self.gains = float(saved["progress"]), tuple(saved["gains"])


def _gain(noise: NoiseEstimate | None, batch: int, micro: int) -> float:
    return 1.0 if noise is None or batch == 0 else gain(noise.trace, noise.grad_sq, batch, micro)
