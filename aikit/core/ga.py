"""Gradient-accumulation arithmetic, once for every framework and every way of training.

An *update* consumes a *window* of samples, split into micro-batches over GA steps and
replicas. Each micro-batch's gradient is the mean of its samples' gradients (a mean loss), so
the update equals one big-batch step when every micro-batch gradient enters the sum with weight

    samples of the micro-batch / samples of the window                      (:func:`sample_weight`)

A replica with nothing in a step (an idle replica) has weight 0: it adds zeros and still joins
the reduction. Where the reduction *averages* over ``replicas`` (DDP, Horovod's average) rather
than sums, every weight is multiplied by ``replicas`` (world scaling), read at each update, never
cached, so a resize scales right. When micro-batch sizes are not declared, the micro-batches are
taken to be equal and each weighs ``1 / micro-steps accumulated`` (:func:`equal_weight`).

Two refinements keep the framework adapters cheap and exact:

* **one multiply per update**: weights are expressed relative to a *unit* (the weight of the
  micro-batch size most of the window shares, :func:`common_size`); a micro-batch of the unit
  size costs nothing, one of another size is multiplied by ``weight / unit``
  (:func:`relative_weight`), and the update multiplies the sum by ``unit`` once;
* **the short window at an epoch's end**: a window cut short holds fewer samples than planned;
  weights computed against the planned window are corrected at the update by
  :func:`short_window_factor` (planned / seen), the seen count being summed over replicas with
  the gradients.

Every function here is plain Python and property-tested against a direct mean over samples
(tests/core/test_ga.py); plans (:meth:`aikit.core.plan.Plan.weight`) and schedules
(:meth:`aikit.core.schedule.EpochSchedule.weight`) take their weights from here.
"""

from __future__ import annotations

from aikit.core.errors import checked_int


def sample_count(value: object, name: str) -> int:
    """``value`` as a non-negative int, or an aikit error (a ValueError) naming it."""
    return checked_int(value, name, 0, None, "a non-negative integer")


def sample_weight(samples: int, window_samples: int, averaging_replicas: int = 1) -> float:
    """Weight of a micro-batch of ``samples`` in an update over ``window_samples`` samples, when
    the reduction over replicas averages over ``averaging_replicas`` (1 when it sums)."""
    samples = sample_count(samples, "samples")
    window = sample_count(window_samples, "window_samples")
    if window == 0:
        raise ValueError("window_samples must be positive: an update needs at least one sample")
    if samples > window:
        raise ValueError(f"a micro-batch of {samples} samples cannot lie in a window of {window}")
    return samples * averaging_replicas / window


def equal_weight(micro_steps: int) -> float:
    """Weight of each of ``micro_steps`` equal micro-batches: their mean."""
    steps = sample_count(micro_steps, "micro_steps")
    if steps == 0:
        raise ValueError("an update needs at least one micro-step")
    return equal_weight_rule(steps)


def equal_weight_rule(micro_steps):
    """The rule of :func:`equal_weight` on any number, a framework's tensor included: the Keras
    wrapper applies it in its graph to the micro-steps it counted (a variable), so one traced
    update serves every count. No checks: the caller guarantees ``micro_steps >= 1``."""
    return 1.0 / micro_steps


def common_size(window_samples: int, micro_batches: int) -> int:
    """The micro-batch size most of a window of ``window_samples`` split into ``micro_batches``
    shares: a plan's ragged split gives ``G // k`` or one more samples to each."""
    window, parts = sample_count(window_samples, "window_samples"), sample_count(micro_batches, "micro_batches")
    if window == 0 or parts == 0:
        raise ValueError("a window needs samples and micro-batches")
    base, extra = divmod(window, parts)
    return max(base + (2 * extra > parts), 1)


def relative_weight(samples: int, unit_samples: int) -> float | None:
    """Factor that turns a micro-batch of ``unit_samples`` samples' weight into one of
    ``samples``; None when it is 1 (nothing to multiply)."""
    factor = sample_count(samples, "samples") / unit_samples
    return None if factor == 1 else factor


def short_window_factor(planned_samples: int, seen_samples: int) -> float:
    """Correction for weights computed against a window of ``planned_samples`` when the window
    held ``seen_samples`` (an epoch's last, short update): planned / seen."""
    planned, seen = sample_count(planned_samples, "planned_samples"), sample_count(seen_samples, "seen_samples")
    if seen == 0:
        raise ValueError("an update with no samples has no mean gradient: skip it instead")
    if seen > planned:
        raise ValueError(
            f"the update held {seen} samples, more than the {planned} of its global batch: feed exactly "
            "global_batch_size samples per update (fewer only in an epoch's last one)"
        )
    return planned / seen
