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

``reduction="sum"`` is Run:AI's AIkit's original arithmetic, for a *sum*-reduced loss (its own
tests compare with a big batch under ``MSELoss(reduction='sum')``): every micro-batch enters with
weight 1 (times the averaging replicas), so the update's gradient is the sum over the window,
which is the big batch's gradient of a summed loss. Declared sample shares and the short
window's correction are means' arithmetic and have no meaning there (:func:`reduction_name`).

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

from typing import Any

from aikit.core.errors import InvalidValue
from aikit.core.validate import non_negative_int

REDUCTIONS = ("mean", "sum")


def reduction_name(value: object) -> str:
    """``value`` if it is one of :data:`REDUCTIONS`, or an aikit error naming it and the fix."""
    if not isinstance(value, str) or value not in REDUCTIONS:
        raise InvalidValue(
            f"reduction must be 'mean' or 'sum', got {value!r}: 'mean' for a mean loss (aikit's default: the "
            "update is the mean over the window), 'sum' for a sum-reduced loss (Run:AI's AIkit's original "
            "arithmetic: the micro-batch gradients are summed)"
        )
    return value


def sample_weight(samples: int, window_samples: int, averaging_replicas: int = 1) -> float:
    """Weight of a micro-batch of ``samples`` in an update over ``window_samples`` samples, when
    the reduction over replicas averages over ``averaging_replicas`` (1 when it sums)."""
    samples = non_negative_int(samples, "samples")
    window = non_negative_int(window_samples, "window_samples")
    if window == 0:
        raise InvalidValue("window_samples must be positive: an update needs at least one sample")
    if samples > window:
        raise InvalidValue(f"a micro-batch of {samples} samples cannot lie in a window of {window}")
    return samples * averaging_replicas / window


def equal_weight(micro_steps: int, reduction: str = "mean", replicas: int = 1, averaging_replicas: int = 1) -> float:
    """Weight of each of ``micro_steps`` equal micro-batches on each of ``replicas`` replicas, when
    the reduction over replicas averages over ``averaging_replicas`` (1 when it sums): their mean
    over the window, or for ``reduction="sum"`` their sum."""
    steps = non_negative_int(micro_steps, "micro_steps")
    if steps == 0:
        raise InvalidValue("an update needs at least one micro-step")
    return averaging_replicas / accumulated_divisor(steps, reduction, replicas)


def accumulated_divisor(micro_steps: Any, reduction: str, replicas: int = 1) -> Any:
    """What the sum of a window's equal micro-batch gradients, ``micro_steps`` on each of
    ``replicas`` replicas, is divided by: their number for their mean, 1 for their sum.
    ``micro_steps`` may be a framework's tensor (Keras counts micro-steps in its graph)."""
    if reduction_name(reduction) == "sum":
        return 1
    return micro_steps if replicas == 1 else micro_steps * replicas


def common_size(window_samples: int, micro_batches: int) -> int:
    """The micro-batch size most of a window of ``window_samples`` split into ``micro_batches``
    shares: a plan's ragged split gives ``G // k`` or one more samples to each."""
    window, parts = non_negative_int(window_samples, "window_samples"), non_negative_int(micro_batches, "micro_batches")
    if window == 0 or parts == 0:
        raise InvalidValue("a window needs samples and micro-batches")
    base, extra = divmod(window, parts)
    return max(base + (2 * extra > parts), 1)


def relative_weight(samples: int, unit_samples: int) -> float | None:
    """Factor that turns a micro-batch of ``unit_samples`` samples' weight into one of
    ``samples``; None when it is 1 (nothing to multiply)."""
    factor = non_negative_int(samples, "samples") / unit_samples
    return None if factor == 1 else factor


def short_window_factor(planned_samples: int, seen_samples: int) -> float:
    """Correction for weights computed against a window of ``planned_samples`` when the window
    held ``seen_samples`` (an epoch's last, short update): planned / seen."""
    planned, seen = non_negative_int(planned_samples, "planned_samples"), non_negative_int(seen_samples, "seen_samples")
    if seen == 0:
        raise InvalidValue("an update with no samples has no mean gradient: skip it instead")
    if seen > planned:
        raise InvalidValue(
            f"the update held {seen} samples, more than the {planned} of its global batch: feed exactly "
            "global_batch_size samples per update (fewer only in an epoch's last one)"
        )
    return planned / seen
