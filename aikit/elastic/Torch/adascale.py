"""AdaScale (Johnson et al., 2020) through a batch-size trace: eth-easl's ``AdaScaleOptimizer``.

A second algorithm over the one trace optimizer: the LR of every update is one micro-batch's LR
(the linear rule of its :class:`~aikit.core.lr_policy.LRPolicy`, at ``micro_batch``) times the
gain of the step's batch over a micro-batch, :func:`aikit.core.gradient_noise.gain` (the formula
the policy's ``adascale`` rule uses too), from the gradient noise measured in each update.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from aikit.core import gradient_noise
from aikit.core.errors import InvalidValue
from aikit.core.gradient_noise import NoiseEstimate, NoiseTracker, update_estimates
from aikit.elastic.Torch.eth_easl import EthEaslOptimizer, adascale_line
from aikit.elastic.Torch.trace_optim import mean_sq_norms
from aikit.runtime.Torch.noise import MicroBatchNorms

if TYPE_CHECKING:
    from aikit.elastic.Torch.sampler import CustomSampler

__all__ = ["AdaScaleOptimizer"]


class AdaScaleOptimizer(EthEaslOptimizer):
    """AdaScale through a batch-size trace: every update's LR is the base LR for one
    micro-batch, ``lr · micro_batch / ref_batch_size``, times the gain ``r`` of the step's batch
    over a micro-batch, and :attr:`progress` advances by ``r`` (the scale-invariant iteration
    count: drive an LR schedule with it, e.g. ``LambdaLR(optimizer, lambda _:
    f(optimizer.progress))``). eth-easl's argument order: ``(optimizer, sampler, log_steps,
    ref_batch_size)``, ``ref_batch_size`` 32 by default.

    The gain comes from the gradient noise of each update (:mod:`aikit.core.gradient_noise`):
    the squared norm of every micro-batch's mean gradient, taken by a gradient hook before it is
    added into ``.grad``, summed per param group on each replica and over the replicas in the
    update's one all-reduce, against the squared norm of the update's gradient. A replica with no
    micro-batch in a step adds nothing and counts no part. One :class:`~aikit.core.gradient_noise.NoiseTracker`
    per param group smooths ``|G|²`` and ``tr(Σ)`` (``decay``); each group's LR uses its own gain
    (as eth-easl's and fairscale's), :attr:`progress` the whole model's. Call ``step()`` once per
    micro-batch after its one ``backward()``.
    """

    rule = "linear"
    per_micro_batch = True
    takes_weights = False  # its gradient noise is measured from equal micro-batch means
    _extra_keys = ("adascale",)

    def __init__(self, optimizer: torch.optim.Optimizer, sampler: CustomSampler | None = None,
                 log_steps: int | None = None, ref_batch_size: int | None = None, *, decay: float = 0.99,
                 **options: Any):
        if options.get("warmup_steps"):
            raise InvalidValue("AdaScaleOptimizer has no warmup: the gain sets the LR from the measured noise")
        if ref_batch_size is None and options.get("ref_batchsize") is None:
            ref_batch_size = 32  # eth-easl's default
        super().__init__(optimizer, sampler, ref_batch_size, log_steps, **options)
        self.trackers = [NoiseTracker(decay) for _ in self.param_groups]
        self.progress = 0.0  # base-batch (micro-batch) steps' worth of progress so far
        self._gains = (1.0,) * len(self.param_groups)
        self.last_gain = 1.0
        dtype = torch.float64 if self.params[0].dtype == torch.float64 else torch.float32
        self.norms = MicroBatchNorms(self.param_groups, dtype)  # this update's micro-batch norms, per group

    def unhook(self) -> None:
        """Remove the gradient hooks (to train the model on with another optimizer)."""
        self.norms.remove()

    def redeal(self) -> None:
        self.norms.clear()  # the step cut short is retrained: so are its micro-batches' norms
        super().redeal()

    def step(self, closure=None) -> bool:
        self.norms.close()  # the micro-batch backpropagated since the last step()
        return super().step(closure)

    def _local_statistics(self) -> list[float]:
        return self.norms.take(self.engine.scaler).sum(0).tolist()  # zeros with no micro-batch here

    @torch.no_grad()
    def _observe(self, totals: list[float]) -> None:
        batch, micro = self.get_bs(), self.plan.micro_batch
        parts = batch // micro
        if parts >= 2:
            amp = self.engine.scaler.get_scale() if self.engine.scaler is not None else 1.0
            means = mean_sq_norms(self.param_groups, self.norms.dtype, self._gradient_scale() / amp)
            estimates = update_estimates([total * micro for total in totals], parts, batch, means)
            if estimates is not None:  # None where AMP skips the update (inf/NaN): so do we
                for tracker, noise in zip(self.trackers, estimates, strict=True):
                    tracker.update(noise)
        smoothed = [tracker.smoothed if tracker.updates else None for tracker in self.trackers]
        self._gains = tuple(self._gain(noise, batch) for noise in smoothed)
        model = None if None in smoothed else NoiseEstimate(grad_sq=sum(n.grad_sq for n in smoothed),
                                                            trace=sum(n.trace for n in smoothed))
        self.last_gain = self._gain(model, batch)  # the whole model's
        self.progress += self.last_gain

    def _updated(self, lr: tuple[float, ...]) -> None:
        if not self.updated:  # skipped (inf/NaN): no step made, so no progress
            self.progress -= self.last_gain

    def _gain(self, noise: NoiseEstimate | None, batch: int) -> float:
        if noise is None or batch == 0:
            return 1.0
        return gradient_noise.gain(noise.trace, noise.grad_sq, batch, self.plan.micro_batch)

    def gain(self) -> tuple[float, ...]:
        """Each param group's gain at the last update (1 before the first)."""
        return self._gains

    @property
    def grad_var_avg(self) -> np.ndarray:
        """eth-easl's smoothed variance of a micro-batch's gradient per group, ``tr(Σ) / micro_batch``."""
        return np.array([t.smoothed.trace / self.plan.micro_batch if t.updates else 0.0 for t in self.trackers])

    @property
    def grad_sqr_avg(self) -> np.ndarray:
        """eth-easl's smoothed ``|G|²`` per group."""
        return np.array([t.smoothed.grad_sq if t.updates else 1.0 for t in self.trackers])

    def adapt_lr(self) -> None:
        self.set_lr(self.current_lr())

    def current_lr(self) -> tuple[float, ...]:
        """Every group's LR for the current step with the last gains (a tuple, as eth-easl's):
        the policy's LR of one micro-batch times the group's gain."""
        micro = self.plan.micro_batch
        return tuple(self.policy.lr(lr, micro) * r for lr, r in zip(self.get_lr(), self._gains, strict=True))

    def _log_lines(self, step: int, batch: int, lr: tuple[float, ...]) -> list[str]:
        return [adascale_line(step, self.gain(), self.grad_var_avg, self.grad_sqr_avg),
                *super()._log_lines(step, batch, lr)]

    def _extra_state(self) -> dict:
        return {"adascale": {"trackers": [t.state_dict() for t in self.trackers], "progress": self.progress,
                             "gains": list(self._gains), "pending": self.norms.state()}}

    def check_state(self, state: dict) -> None:
        super().check_state(state)
        self._saved_trackers(state["adascale"])

    def _saved_trackers(self, saved: object) -> list[NoiseTracker]:
        keys = {"trackers", "progress", "gains", "pending"}
        if not isinstance(saved, dict) or set(saved) != keys or len(saved["trackers"]) != len(self.trackers) \
                or len(saved["gains"]) != len(self.trackers):
            raise InvalidValue(f"AdaScaleOptimizer state['adascale'] needs keys {sorted(keys)} with one tracker and "
                               f"one gain per param group ({len(self.trackers)})")
        trackers = [NoiseTracker() for _ in self.trackers]
        for tracker, tracker_state in zip(trackers, saved["trackers"], strict=True):
            tracker.load_state_dict(tracker_state)
        return trackers

    def _load_extra(self, state: dict) -> None:
        saved = state["adascale"]
        self.trackers = self._saved_trackers(saved)
        self.progress, self._gains = float(saved["progress"]), tuple(saved["gains"])
        self.norms.load(saved["pending"], self.device)
