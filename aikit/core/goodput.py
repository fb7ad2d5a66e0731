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
  devices there are), proposes a change only between updates, every ``interval`` updates once
  ``min_estimates`` noise estimates are in, only when the predicted goodput gain exceeds
  ``threshold`` (5 % by default, as Pollux), and records the batch of every update so that the
  run can be replayed as a trace.
* :class:`BatchSplit` is how an adaptive run (:mod:`aikit.core.adaptive`, PyTorch and Keras
  alike) runs each update with policy ``"error"``: the batches it can take, their micro-batches,
  and the largest an epoch's last update can take of what is left.

Framework-free: adapters time their updates, compute the noise estimate
(:func:`aikit.core.gradient_noise.estimate`) and apply the batch the controller chooses.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from aikit.core.errors import InvalidValue
from aikit.core.gradient_noise import NoiseEstimate, NoiseTracker, gains
from aikit.core.plan import Plan, even_micro_batches, even_split_problems, largest_even_batch, make_plan
from aikit.core.schedule import split_minimums, splits_for_noise
from aikit.core.validate import checked_bool, checked_float, non_negative_int, positive_int

__all__ = ["BatchSplit", "GoodputController", "ThroughputModel"]

CANDIDATES = 1000  # batches scored at a decision: every one in the bounds, or about this many spread geometrically
ENUMERATED = 2**20  # bounds holding more multiples of the unit are sampled geometrically, not listed
TIMINGS_KEPT = 100  # the latest timings of each configuration the throughput model's medians read


@dataclass(frozen=True)
class BatchSplit:
    """How every update of an adaptive run runs on the devices, so that the plan the controller
    scores is the deal the schedule makes (:mod:`aikit.core.adaptive`).

    ``grows=False``: whole micro-batches of exactly ``per_device`` samples (static shapes: XLA,
    or a model that wants one shape), dealt round-robin; a batch the controller may choose is a
    multiple of ``per_device x devices``, an epoch's last update any multiple of ``per_device``.
    ``grows=True``: every update split evenly over the devices in the fewest micro-batches of at
    most ``per_device`` (:func:`aikit.core.plan.even_micro_batches`, what policy ``"error"``
    plans), so the per-device batch grows with the batch, as AdaptDL's does; with
    ``noise_every`` every ``noise_every``-th update (0, k, 2k, ...) runs in two micro-batches or
    more, where one device measures the gradient noise, before update ``noise_until`` (None:
    throughout; an adaptive run that holds its batch measures nothing from then on).
    """

    per_device: int  # the micro-batch (fixed), or the most one device holds (grows)
    devices: int
    grows: bool
    noise_every: int | None = None
    noise_until: int | None = None

    @property
    def unit(self) -> int:
        """Every batch the controller may choose is a multiple of this."""
        return self.devices if self.grows else self.per_device * self.devices

    def least(self, first: int, end: int) -> np.ndarray:
        """The fewest micro-batches of updates ``first..end-1`` (over all devices)."""
        return split_minimums(first, end, 1, self.noise_every, self.noise_until)

    def micro_sizes(self, sizes: list[int] | np.ndarray, first: int) -> np.ndarray | None:
        """The micro-batch of updates ``first, first + 1, ...`` of ``sizes`` (None when fixed:
        ``per_device`` always)."""
        if not self.grows:
            return None
        return even_micro_batches(sizes, self.per_device, self.devices, self.least(first, first + len(sizes)))

    def largest(self, left: int, update: int) -> int:
        """The largest batch of at most ``left`` samples update ``update`` can run (0: none):
        what an epoch's last update takes of the samples left."""
        if self.grows:  # one update: no arrays (the adaptive schedule asks twice an update)
            least = 2 if splits_for_noise(update, self.noise_every, self.noise_until) else 1
            return largest_even_batch(left, self.per_device, self.devices, least)
        return left // self.per_device * self.per_device

    def runs(self, batches: np.ndarray) -> np.ndarray:
        """Which of ``batches`` every update can run (bool per batch): a batch the controller
        chooses may fall on any update, those that measure the noise included."""
        batches = np.asarray(batches, dtype=np.int64)
        if not self.grows:
            return batches % self.unit == 0
        return np.logical_and.reduce([even_micro_batches(batches, self.per_device, self.devices, least) > 0
                                      for least in self._minimums()])

    def problem(self, name: str, batch: int) -> str | None:
        """Why ``batch`` (the argument ``name``) is not one every update can run (None when it is)."""
        if not self.grows:
            if batch % self.unit == 0:
                return None
            unit = self.unit
            return (f"{name}={batch} is not a multiple of micro_batch x replicas = {self.per_device} x "
                    f"{self.devices} = {unit}: every update is whole micro-batches on every replica; use {name}="
                    f"{max(unit, batch // unit * unit)} or {-(-batch // unit) * unit}")
        for least in self._minimums():  # the updates between and those that measure the noise
            problems = even_split_problems([batch], self.per_device, self.devices, least)
            if problems:
                return (f"{name}={batch}: every update is split evenly over the replicas"
                        f"{f', every {self.noise_every}th in two or more' if least == 2 else ''}; "
                        + problems[0].split(": ", 1)[1])
        return None

    def _minimums(self) -> tuple[int, ...]:
        return (1, 2) if self.noise_every else (1,)


class ThroughputModel:
    """Seconds per update as a function of the micro-batch and the GA steps, fitted from
    measurements. Each configuration's median time over its latest :data:`TIMINGS_KEPT` updates
    is used, so one slow update (a hiccup of a shared machine) does not move the fit, the fit
    follows a machine whose speed drifts, and neither a decision's cost nor the saved state grows
    with the run's length.

    Only what the measurements identify is fitted: one configuration gives time proportional to
    samples; a second adds the per-update cost; the per-micro-step cost needs configurations
    that differ in GA steps at the same samples per update (until then it counts as per-update
    cost, which a single GA-step count cannot tell apart). While every measurement has the same
    micro-batch, half of a micro-step's time counts as its fixed cost (AdaptDL's prior in
    ``fit_perf_params``): the model is then optimistic about larger micro-batches, so a run
    whose per-device batch may grow tries one and measures it, instead of never learning.
    """

    def __init__(self) -> None:
        self._times: dict[tuple[int, int], deque[float]] = defaultdict(_latest_timings)
        self._fit: tuple[float, float, float] | None = None  # coefficients of the measurements so far

    def observe(self, micro_batch: int, micro_steps: int, seconds: float) -> None:
        """One update of ``micro_steps`` micro-steps of ``micro_batch`` samples per device took ``seconds``."""
        key = (positive_int(micro_batch, "micro_batch"), positive_int(micro_steps, "micro_steps"))
        seconds = checked_float(seconds, "seconds", "a positive finite duration", lambda time: 0 < time < math.inf)
        self._times[key].append(seconds)
        self._fit = None

    @property
    def configurations(self) -> int:
        return len(self._times)

    def coefficients(self) -> tuple[float, float, float]:
        """``(per_micro_step, per_sample, per_update)`` in seconds, all non-negative."""
        if not self._times:
            raise InvalidValue("no update timed yet: call observe() first")
        if self._fit is None:  # once per new measurement: propose() evaluates every candidate with it
            self._fit = self._fitted()
        return self._fit

    def _fitted(self) -> tuple[float, float, float]:
        rows, times = [], []
        for (micro, micro_steps), seconds in self._times.items():
            rows.append((micro_steps, micro_steps * micro, 1.0))
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

    def seconds(self, micro_batch: int, micro_steps: int) -> float:
        """Predicted seconds of one update."""
        per_micro, per_sample, per_update = self.coefficients()
        return micro_steps * (per_micro + per_sample * micro_batch) + per_update

    def state_dict(self) -> dict:
        return {"times": [[micro, micro_steps, list(seconds)]
                          for (micro, micro_steps), seconds in self._times.items()]}

    def load_state_dict(self, state: dict) -> None:
        if set(state) != {"times"}:
            raise InvalidValue(f"not a ThroughputModel state: keys {sorted(state)}")
        times = defaultdict(_latest_timings)
        for micro, micro_steps, seconds in state["times"]:
            times[int(micro), int(micro_steps)] = _latest_timings(float(s) for s in seconds)  # longer: its latest
        self._times, self._fit = times, None


def _latest_timings(seconds: Iterable[float] = ()) -> deque[float]:
    return deque(seconds, maxlen=TIMINGS_KEPT)


class GoodputController:
    """Picks the global batch that maximises predicted goodput, within bounds.

    Args:
        max_device_batch: the most samples one device holds in a micro-batch.
        devices: devices (replicas) training.
        ref_batch_size: the batch the LR was tuned for; statistical efficiency is relative to
            it, and the run starts there.
        max_batch: the largest global batch to consider.
        min_batch: the smallest (default ``ref_batch_size``: as in AdaptDL, the batch only grows
            above the one the user started with).
        threshold: change the batch only for a predicted goodput gain above this fraction.
        decay: smoothing of the noise estimates (:class:`~aikit.core.gradient_noise.NoiseTracker`).
        policy: the plan policy for uneven splits (:func:`~aikit.core.plan.make_plan`); an
            adaptive run (:mod:`aikit.core.adaptive`, PyTorch and Keras) plans with ``"error"``:
            every update split evenly (``split``, a :class:`BatchSplit`).
        max_change: a change moves the batch by at most this factor (up or down). The
            throughput model is fitted on the micro-batches measured so far and is trusted only
            near them: on MNIST-1D, fitted on micro-batches of 16 and 32, it predicted batch 1024
            3.6x the goodput, and the run that jumped there trained worse. Within a factor each
            step is measured before the next, and a need that persists is met a few decisions later.
        min_estimates: noise estimates to average before the first change (default: the
            smoothing's horizon, ``1 / (1 - decay)``; a single estimate is very noisy: on
            MNIST-1D deciding after 5 instead of 20 missed the target in one seed of three).
        interval: updates between decisions (each fits the throughput model and scores every
            candidate batch: milliseconds, not worth paying at every update).
        fixed_micro_batch: with policy ``"error"``, every batch in whole micro-batches of
            exactly ``max_device_batch`` on every device (static shapes), instead of split
            evenly in micro-batches of at most that many.
        noise_every: with policy ``"error"``, every ``noise_every``-th update runs in two
            micro-batches or more (one device measures the noise there): a candidate must split
            so too.
    """

    def __init__(self, max_device_batch: int, devices: int = 1, *, ref_batch_size: int | None = None, max_batch: int,
                 min_batch: int | None = None, threshold: float = 0.05, decay: float = 0.95, policy: str = "ragged",
                 max_change: float = 2.0, min_estimates: int | None = None, interval: int = 10,
                 fixed_micro_batch: bool = False, noise_every: int | None = None) -> None:
        self.max_device_batch = positive_int(max_device_batch, "max_device_batch")
        self.devices = positive_int(devices, "devices")
        if ref_batch_size is None:
            raise InvalidValue("ref_batch_size is required: the global batch the LR was tuned for (the run starts "
                               "there)")
        self.ref_batch_size = positive_int(ref_batch_size, "ref_batch_size")
        self.max_batch = positive_int(max_batch, "max_batch")
        self.min_batch = self.ref_batch_size if min_batch is None else positive_int(min_batch, "min_batch")
        if not self.min_batch <= self.ref_batch_size <= self.max_batch:
            raise InvalidValue(
                f"need min_batch <= ref_batch_size <= max_batch, got {self.min_batch}, {self.ref_batch_size}, "
                f"{self.max_batch}: the run starts at ref_batch_size and moves within the bounds"
            )
        threshold = checked_float(threshold, "threshold", "a non-negative fraction (0.05 for 5 %)",
                                  lambda fraction: 0 <= fraction < math.inf)
        max_change = checked_float(max_change, "max_change", "a factor above 1 (2.0: at most double or halve)",
                                   lambda factor: 1 < factor <= math.inf)
        make_plan(self.ref_batch_size, self.max_device_batch, self.devices, policy=policy)  # the policy can run it
        self.threshold, self.policy, self.max_change = float(threshold), policy, float(max_change)
        self.throughput = ThroughputModel()
        self.noise = NoiseTracker(decay)
        self.min_estimates = round(1 / (1 - self.noise.decay)) if min_estimates is None else \
            non_negative_int(min_estimates, "min_estimates")
        self.interval = positive_int(interval, "interval")
        self.split = self._split(fixed_micro_batch, noise_every)
        self.batch = self.ref_batch_size
        self.batches: list[int] = []  # the global batch of every update so far: a replayable trace
        self.changes: list[tuple[int, int, int, float]] = []  # (update, old batch, new batch, predicted gain)

    def _split(self, fixed_micro_batch: object, noise_every: object) -> BatchSplit | None:
        checked_bool(fixed_micro_batch, "fixed_micro_batch")
        noise_every = None if noise_every is None else positive_int(noise_every, "noise_every")
        if self.policy != "error":
            if fixed_micro_batch or noise_every:
                raise InvalidValue("fixed_micro_batch and noise_every describe equal micro-batches: give "
                                   f"policy='error', got policy={self.policy!r}")
            return None
        return BatchSplit(self.max_device_batch, self.devices, not fixed_micro_batch, noise_every)

    def plan(self, batch: int) -> Plan:
        """The plan ``batch`` runs with on these devices."""
        return make_plan(batch, self.max_device_batch, self.devices, policy=self.policy)

    def observe(self, seconds: float | None, noise: NoiseEstimate | None = None, *, batch: int | None = None) -> None:
        """Record one update at the current batch: its duration (None: not timed, e.g. it
        included compiling the training step) and, where the update had two or more parts, its
        noise estimate. ``batch``: the batch the update ran at when it was not the controller's
        (an epoch's last, shorter update); it is recorded, timed and measured as such."""
        batch = self.batch if batch is None else positive_int(batch, "batch")
        plan = self.plan(batch) if seconds is not None else None
        self.record(batch, noise, [] if plan is None else [(plan.device_batch, plan.micro_steps, seconds)])

    def record(self, batch: int, noise: NoiseEstimate | None = None,
               timings: Iterable[tuple[int, int, float]] = ()) -> None:
        """Record one update of ``batch`` samples: its noise estimate (None where it measured
        none) and its timings, each ``(micro_batch, micro_steps, seconds)``: what an update of
        ``micro_steps`` micro-steps of ``micro_batch`` samples per device took (:mod:`aikit.core.adaptive` gives
        two per timed update)."""
        for micro, micro_steps, seconds in timings:
            self.throughput.observe(micro, micro_steps, seconds)
        if noise is not None:
            self.noise.update(noise)
        self.batches.append(batch)

    def candidates(self) -> np.ndarray:
        """Global batches to evaluate: every batch in the bounds the plan can run (with policy
        ``"error"``, those every update splits evenly: ``split``), or about a thousand of
        them spread geometrically when there are more; and the bounds and the current batch."""
        unit = self.split.unit if self.split else self.devices
        low = max(self.min_batch, 1)
        first, last = -(-low // unit), self.max_batch // unit
        if last - first < ENUMERATED:
            found = np.arange(first, last + 1, dtype=np.int64) * unit
            found = found[self._runs(found)]
            if len(found) > CANDIDATES:  # about a thousand of those that run, spread geometrically
                found = found[np.unique(np.geomspace(1, len(found), CANDIDATES).round().astype(np.int64) - 1)]
        else:
            found = np.unique(np.geomspace(low, self.max_batch, CANDIDATES).round().astype(np.int64) // unit * unit)
        found = np.unique(np.concatenate([found, [self.min_batch, self.ref_batch_size, self.max_batch, self.batch]]))
        return found[(found > 0) & self._runs(found)]

    def _runs(self, batches: np.ndarray) -> np.ndarray:
        """Which of ``batches`` the plan runs: every one, or with policy "error" the even splits."""
        return self.split.runs(batches) if self.split else np.ones(len(batches), dtype=bool)

    def plans(self, batches: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(micro-batch, GA steps)`` of :meth:`plan` for many batches at once."""
        if self.policy == "fewer_devices":  # a divisor search per batch
            plans = [self.plan(int(b)) for b in batches]
            return np.array([p.device_batch for p in plans]), np.array([p.micro_steps for p in plans])
        devices = np.minimum(self.devices, batches)
        micro_steps = -(-batches // (devices * self.max_device_batch))
        return -(-batches // (devices * micro_steps)), micro_steps

    def goodput(self, batch: int) -> float:
        """Predicted training progress per second at ``batch``, in base-batch samples per second."""
        return float(self.goodputs(np.array([positive_int(batch, "batch")]))[0])

    def goodputs(self, batches: np.ndarray) -> np.ndarray:
        """:meth:`goodput` of many batches at once."""
        batches = np.asarray(batches, dtype=np.int64)
        micro, micro_steps = self.plans(batches)
        samples_per_second = batches / self.throughput.seconds(micro, micro_steps)
        noise = self.noise.smoothed
        efficiency = gains(noise.trace, noise.grad_sq, batches, self.ref_batch_size) * self.ref_batch_size / batches
        return samples_per_second * efficiency

    def propose(self) -> int | None:
        """The new global batch to use from the next update on, or None to keep the current
        one. Decides every ``interval`` updates, once an update was timed and ``min_estimates``
        noise estimates (one at least) are in: the first updates are not timed, and the first
        estimates are too noisy."""
        if (not self.throughput.configurations or self.noise.updates < max(1, self.min_estimates)
                or len(self.batches) % self.interval):
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

    def change_reason(self) -> str:
        """Why the last change (``changes[-1]``) was made, for its log line."""
        return f"predicted goodput gain {(self.changes[-1][3] - 1) * 100:.1f}%"

    def state_dict(self) -> dict:
        return {"batch": self.batch, "batches": list(self.batches), "changes": [list(c) for c in self.changes],
                "throughput": self.throughput.state_dict(), "noise": self.noise.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if set(state) != {"batch", "batches", "changes", "throughput", "noise"}:
            raise InvalidValue(f"not a GoodputController state: keys {sorted(state)}")
        batch = positive_int(state["batch"], "batch")
        throughput, noise = ThroughputModel(), NoiseTracker()
        throughput.load_state_dict(state["throughput"])
        noise.load_state_dict(state["noise"])
        batches = [positive_int(b, "batches[i]") for b in state["batches"]]
        changes = [(int(u), int(a), int(b), float(g)) for u, a, b, g in state["changes"]]
        # everything checked and converted: only now replace
        self.batch, self.throughput, self.noise, self.batches, self.changes = batch, throughput, noise, batches, changes
