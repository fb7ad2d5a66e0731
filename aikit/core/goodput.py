"""Choosing the global batch while training: goodput = throughput x statistical efficiency.

Pollux (Qiao et al., OSDI'21; AdaptDL) showed the batch worth training with grows as training
proceeds: a bigger batch processes more samples per second on more devices (throughput), but
each sample is worth less once the batch is past the gradient noise scale (statistical
efficiency, :func:`aikit.core.gradient_noise.efficiency`). Their product, *goodput*, is the
training progress per second; this module predicts it for every candidate global batch and
picks the best.

* :class:`ThroughputModel` fits seconds per update from measured updates as
  ``steps * (per_micro_step + per_sample * micro_batch) + per_update`` (non-negative least
  squares): the per-micro-step overhead and the per-update cost (optimizer step, all-reduce)
  are what a larger batch amortises.
* :class:`GoodputController` evaluates every global batch in its bounds through the plan
  aikit would run it with (:func:`aikit.core.plan.make_plan`: GA steps and micro-batch on the
  devices there are), proposes a change only between updates and only when the predicted
  goodput gain exceeds ``threshold`` (5 % by default, as Pollux), and records the batch of every
  update so that the run can be replayed as a trace.

Framework-free: adapters time their updates, compute the noise estimate
(:func:`aikit.core.gradient_noise.estimate`) and apply the batch the controller chooses.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
from scipy.optimize import nnls

from aikit.core.errors import InvalidValue
from aikit.core.gradient_noise import NoiseEstimate, NoiseTracker, gains
from aikit.core.plan import make_plan
from aikit.core.validate import checked_float, positive_int

__all__ = ["GoodputController", "ThroughputModel"]


class ThroughputModel:
    """Seconds per update as a function of the micro-batch and the GA steps, fitted from
    measurements. Each configuration's median time is used, so one slow update (a hiccup of a
    shared machine) does not move the fit.

    Only what the measurements identify is fitted: one configuration gives time proportional to
    samples; a second adds the per-update cost; the per-micro-step cost needs configurations
    that differ in GA steps at the same samples per update (until then it counts as per-update
    cost, which a single GA-step count cannot tell apart). While every measurement has the same
    micro-batch, half of a micro-step's time counts as its fixed cost (AdaptDL's prior in
    ``fit_perf_params``): the model is then optimistic about larger micro-batches, so a run
    whose per-device batch may grow tries one and measures it, instead of never learning.
    """

    def __init__(self) -> None:
        self._times: dict[tuple[int, int], list[float]] = defaultdict(list)
        self._fit: tuple[float, float, float] | None = None  # coefficients of the measurements so far

    def observe(self, micro_batch: int, steps: int, seconds: float) -> None:
        """One update of ``steps`` micro-steps of ``micro_batch`` samples per device took ``seconds``."""
        key = (positive_int(micro_batch, "micro_batch"), positive_int(steps, "steps"))
        seconds = checked_float(seconds, "seconds", "a positive finite duration", lambda time: 0 < time < math.inf)
        self._times[key].append(seconds)
        self._fit = None

    @property
    def configurations(self) -> int:
        return len(self._times)

    def coefficients(self) -> tuple[float, float, float]:
        """``(per_micro_step, per_sample, per_update)`` in seconds, all non-negative."""
        if not self._times:
            raise ValueError("no update timed yet: call observe() first")
        if self._fit is None:  # once per new measurement: propose() evaluates every candidate with it
            self._fit = self._fitted()
        return self._fit

    def _fitted(self) -> tuple[float, float, float]:
        rows, times = [], []
        for (micro, steps), seconds in self._times.items():
            rows.append((steps, steps * micro, 1.0))
            times.append(float(np.median(seconds)))
        rows = np.asarray(rows)
        used = [1]  # per sample first, then per update, then per micro-step: each only if the data identify it
        for column in (2, 0):
            if np.linalg.matrix_rank(rows[:, [*used, column]]) > len(used):
                used.append(column)
        fit, _ = nnls(rows[:, used], np.asarray(times))
        full = np.zeros(3)
        full[used] = fit
        if 0 not in used and len({micro for micro, _ in self._times}) == 1:
            full[0] = full[1] * rows[0, 1] / rows[0, 0] / 2  # AdaptDL's prior: half of a micro-step is fixed cost
            full[1] /= 2
        return float(full[0]), float(full[1]), float(full[2])

    def seconds(self, micro_batch: int, steps: int) -> float:
        """Predicted seconds of one update."""
        per_micro, per_sample, per_update = self.coefficients()
        return steps * (per_micro + per_sample * micro_batch) + per_update

    def state_dict(self) -> dict:
        return {"times": [[micro, steps, list(seconds)] for (micro, steps), seconds in self._times.items()]}

    def load_state_dict(self, state: dict) -> None:
        if set(state) != {"times"}:
            raise ValueError(f"not a ThroughputModel state: keys {sorted(state)}")
        times = defaultdict(list)
        for micro, steps, seconds in state["times"]:
            times[int(micro), int(steps)] = [float(s) for s in seconds]
        self._times, self._fit = times, None


class GoodputController:
    """Picks the global batch that maximises predicted goodput, within bounds.

    Args:
        max_device_batch: the most samples one device holds in a micro-batch.
        devices: devices (replicas) training.
        base_batch: the batch the LR was tuned for; statistical efficiency is relative to it.
        max_batch: the largest global batch to consider.
        min_batch: the smallest (default ``base_batch``: as in AdaptDL, the batch only grows
            above the one the user started with).
        threshold: change the batch only for a predicted goodput gain above this fraction.
        decay: smoothing of the noise estimates (:class:`~aikit.core.gradient_noise.NoiseTracker`).
        policy: the plan policy for uneven splits (:func:`~aikit.core.plan.make_plan`).
        max_change: a change moves the batch by at most this factor (up or down). The
            throughput model is fitted on the micro-batches measured so far and is trusted only
            near them: on MNIST-1D, fitted on micro-batches of 16 and 32, it predicted batch 1024
            3.6x the goodput, and the run that jumped there trained worse. Within a factor each
            step is measured before the next, and a need that persists is met a few decisions later.
    """

    def __init__(
        self,
        max_device_batch: int,
        devices: int = 1,
        *,
        base_batch: int,
        max_batch: int,
        min_batch: int | None = None,
        threshold: float = 0.05,
        decay: float = 0.95,
        policy: str = "ragged",
        max_change: float = 2.0,
    ) -> None:
        self.max_device_batch = positive_int(max_device_batch, "max_device_batch")
        self.devices = positive_int(devices, "devices")
        self.base_batch = positive_int(base_batch, "base_batch")
        self.max_batch = positive_int(max_batch, "max_batch")
        self.min_batch = self.base_batch if min_batch is None else positive_int(min_batch, "min_batch")
        if not self.min_batch <= self.base_batch <= self.max_batch:
            raise ValueError(
                f"need min_batch <= base_batch <= max_batch, got {self.min_batch}, {self.base_batch}, "
                f"{self.max_batch}: the run starts at base_batch and moves within the bounds"
            )
        threshold = checked_float(threshold, "threshold", "a non-negative fraction (0.05 for 5 %)",
                                  lambda fraction: 0 <= fraction < math.inf)
        max_change = checked_float(max_change, "max_change", "a factor above 1 (2.0: at most double or halve)",
                                   lambda factor: 1 < factor <= math.inf)
        make_plan(self.base_batch, self.max_device_batch, self.devices, policy=policy)  # the policy can run it
        self.threshold, self.policy, self.max_change = float(threshold), policy, float(max_change)
        self.throughput = ThroughputModel()
        self.noise = NoiseTracker(decay)
        self.batch = self.base_batch
        self.batches: list[int] = []  # the global batch of every update so far: a replayable trace
        self.changes: list[tuple[int, int, int, float]] = []  # (update, old batch, new batch, predicted gain)

    def plan(self, batch: int):
        """The plan ``batch`` runs with on these devices."""
        return make_plan(batch, self.max_device_batch, self.devices, policy=self.policy)

    def observe(self, seconds: float | None, noise: NoiseEstimate | None = None, *, batch: int | None = None) -> None:
        """Record one update at the current batch: its duration (None: not timed, e.g. it
        included compiling the training step) and, where the update had two or more parts, its
        noise estimate. ``batch``: the batch the update ran at when it was not the controller's
        (an epoch's last, shorter update); it is recorded, timed and measured as such."""
        batch = self.batch if batch is None else positive_int(batch, "batch")
        if seconds is not None:
            plan = self.plan(batch)
            self.throughput.observe(plan.batch_size, plan.steps, seconds)
        if noise is not None:
            self.noise.update(noise)
        self.batches.append(batch)

    def candidates(self) -> np.ndarray:
        """Global batches to evaluate: every multiple of the device count in the bounds, or
        about a thousand of them spread geometrically when there are more. With policy
        ``"error"`` (equal micro-batches only, as Keras feeds them) only the batches that split
        evenly over the devices are candidates."""
        low = max(self.min_batch, 1)
        multiples = range(-(-low // self.devices) * self.devices, self.max_batch + 1, self.devices)
        found = np.array(multiples if len(multiples) <= 1000 else
                         np.unique(np.geomspace(low, self.max_batch, 1000).round()), dtype=np.int64)
        found = np.unique(np.concatenate([found, [self.min_batch, self.base_batch, self.max_batch, self.batch]]))
        if self.policy == "error":
            found = found[[self._splits_evenly(int(b)) for b in found]]
        return found

    def _splits_evenly(self, batch: int) -> bool:
        try:
            self.plan(batch)
        except InvalidValue:  # policy "error" refuses it
            return False
        return True

    def plans(self, batches: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(micro-batch, GA steps)`` of :meth:`plan` for many batches at once."""
        if self.policy == "fewer_devices":  # a divisor search per batch
            plans = [self.plan(int(b)) for b in batches]
            return np.array([p.batch_size for p in plans]), np.array([p.steps for p in plans])
        devices = np.minimum(self.devices, batches)
        steps = -(-batches // (devices * self.max_device_batch))
        return -(-batches // (devices * steps)), steps

    def goodput(self, batch: int) -> float:
        """Predicted training progress per second at ``batch``, in base-batch samples per second."""
        return float(self.goodputs(np.array([positive_int(batch, "batch")]))[0])

    def goodputs(self, batches: np.ndarray) -> np.ndarray:
        """:meth:`goodput` of many batches at once."""
        batches = np.asarray(batches, dtype=np.int64)
        micro, steps = self.plans(batches)
        samples_per_second = batches / self.throughput.seconds(micro, steps)
        noise = self.noise.smoothed
        efficiency = gains(noise.trace, noise.grad_sq, batches, self.base_batch) * self.base_batch / batches
        return samples_per_second * efficiency

    def propose(self) -> int | None:
        """The new global batch to use from the next update on, or None to keep the current
        one. Needs at least one timed update and one noise estimate."""
        if not self.throughput.configurations or not self.noise.updates:
            return None
        current = self.goodput(self.batch)
        candidates = self.candidates()
        near = (candidates <= self.batch * self.max_change) & (candidates * self.max_change >= self.batch)
        candidates = candidates[near]
        scores = dict(zip(candidates.tolist(), self.goodputs(candidates).tolist(), strict=True))
        best = max(scores, key=lambda b: (scores[b], -abs(b - self.batch)))
        gain = scores[best] / current if current > 0 else math.inf
        if best == self.batch or gain <= 1 + self.threshold:
            return None
        self.changes.append((len(self.batches), self.batch, best, gain))
        self.batch = best
        return best

    def state_dict(self) -> dict:
        return {"batch": self.batch, "batches": list(self.batches), "changes": [list(c) for c in self.changes],
                "throughput": self.throughput.state_dict(), "noise": self.noise.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if set(state) != {"batch", "batches", "changes", "throughput", "noise"}:
            raise ValueError(f"not a GoodputController state: keys {sorted(state)}")
        batch = positive_int(state["batch"], "batch")
        throughput, noise = ThroughputModel(), NoiseTracker()
        throughput.load_state_dict(state["throughput"])
        noise.load_state_dict(state["noise"])
        batches = [positive_int(b, "batches[i]") for b in state["batches"]]
        changes = [(int(u), int(a), int(b), float(g)) for u, a, b, g in state["changes"]]
        # everything checked and converted: only now replace
        self.batch, self.throughput, self.noise, self.batches, self.changes = batch, throughput, noise, batches, changes
