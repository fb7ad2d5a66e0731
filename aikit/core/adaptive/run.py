"""What an adaptive run does around each update, for both adapters: its LR, the record of what it
measured, its history row and the controller's decision (:class:`AdaptiveRun`)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from aikit.core.adaptive.packing import AdaptiveSchedule
from aikit.core.errors import InvalidValue
from aikit.core.gradient_noise import NoiseEstimate, NoiseTracker
from aikit.core.scaling import adaptive_lr, adaptive_rule_name

if TYPE_CHECKING:
    from aikit.core.goodput import GoodputController

log = logging.getLogger("aikit.adaptive")


HISTORY_KEYS = ("epoch", "step", "batch_size", "ga_steps", "micro_batch", "lr", "seconds", "grad_sq", "trace",
                "noise_scale")


def history_row(epoch: int, step: int, batch: int, ga_steps: int, micro_batch: int, lr: float, seconds: float | None,
                noise: NoiseTracker) -> dict:
    """One update of an adaptive run, as both adapters record it: its epoch, its step (the
    update's number in the run), its global batch, GA steps (the busiest replica's) and
    micro-batch, its LR, its cycle in seconds (None where not timed), and the smoothed ``|G|²``,
    ``tr(Σ)`` and noise scale after it (``nan`` before the first estimate)."""
    smoothed = noise.smoothed if noise.updates else None
    measured = (math.nan,) * 3 if smoothed is None else (smoothed.grad_sq, smoothed.trace, smoothed.noise_scale)
    values = (epoch, step, batch, ga_steps, micro_batch, lr, seconds, *measured)
    return dict(zip(HISTORY_KEYS, values, strict=True))


def learning_rate(controller: GoodputController, base_lr: float, batch: int, rule: str, step: int = 0,
                  warmup_steps: int = 0) -> float:
    """The LR of an update at ``batch``: :func:`aikit.core.scaling.adaptive_lr` over
    ``controller.ref_batch_size`` with the controller's smoothed noise (None before a first estimate)."""
    noise = controller.noise
    return adaptive_lr(base_lr, batch, controller.ref_batch_size, rule, noise.smoothed if noise.updates else None,
                       step, warmup_steps)


class AdaptiveRun:
    """What an adaptive run does around each update, for both adapters: the LR of its batch
    (:meth:`lr`), the record of what it measured (:meth:`record`), then (:meth:`finish`) its
    history row, the controller's decision, logged, and the next batches decided.

    PyTorch records before its update's step (the noise of its micro-batches is known once they
    are backpropagated, so AdaScale's LR for the update includes it); Keras after it (the noise is
    measured inside the update's all-reduce, after its LR was set).
    """

    def __init__(self, schedule: AdaptiveSchedule, rule: str = "adascale") -> None:
        self.schedule = schedule
        self.rule = adaptive_rule_name(rule)
        self.history: list[dict] = []  # one history_row per update
        self._recorded: tuple[int, int, int, float | None] | None = None

    @property
    def controller(self) -> GoodputController:
        return self.schedule.controller

    def lr(self, base_lr: float, batch: int, step: int = 0, warmup_steps: int = 0) -> float:
        """The LR of an update at ``batch`` from ``base_lr`` (the LR tuned at the base batch)."""
        return learning_rate(self.controller, base_lr, batch, self.rule, step, warmup_steps)

    def record(self, batch: int, micro_batch: int, micro_steps: int, timing: tuple[float, float] | None,
               noise: NoiseEstimate | None) -> None:
        """One update of ``batch`` samples in ``micro_steps`` micro-steps of ``micro_batch`` samples per
        device: its timing (:func:`update_timing`: two measurements for the throughput model) and
        its noise estimate go to the controller."""
        timings = [] if timing is None else [(micro_batch, micro_steps, timing[0]), (micro_batch, 1, timing[1])]
        if self.schedule.holds(len(self.controller.batches)):
            noise = None  # a held update measures nothing: its batch and LR stay as they were at the hold
        self.controller.record(batch, noise, timings)
        self._recorded = (batch, micro_batch, micro_steps, None if timing is None else timing[0])

    def finish(self, epoch: int, lr: float, *, log_change: bool = True,
               say: Callable[[str], None] | None = None, applied: bool = True) -> dict:
        """After the recorded update: its history row (returned, and kept in :attr:`history`), the
        controller's decision (logged where ``log_change``, and passed to ``say``), and the
        batches decided up to ``lookahead`` updates ahead. An update not ``applied`` (AMP or the
        finiteness check skipped it for inf/NaN) takes no decision: its samples were spent, so
        it keeps its place in the trace, but it measured nothing a decision could rest on."""
        if self._recorded is None:
            raise InvalidValue("no update recorded since the last finish(): record() it first")
        (batch, micro, micro_steps, seconds), self._recorded = self._recorded, None
        controller = self.controller
        update = len(controller.batches) - 1
        row = history_row(epoch, update, batch, micro_steps, micro, lr, seconds, controller.noise)
        self.history.append(row)
        old = controller.batch
        new = None if self.schedule.held or not applied else controller.propose()
        if new is not None and (log_change or say is not None):
            plan = controller.plan(new)
            message = (f"adaptive batch: update {update}: global batch {old} -> {new} from update "
                       f"{update + 1 + self.schedule.lookahead} ({plan.micro_steps} GA steps x {plan.device_batch} "
                       f"per device on {controller.devices} replica(s)), {controller.change_reason()}, "
                       f"noise scale {row['noise_scale']:.4g}, lr {lr:.4g}")
            if log_change:
                log.info(message)
            if say is not None:
                say(message)
        self.schedule.extend(update + 1)
        return row
