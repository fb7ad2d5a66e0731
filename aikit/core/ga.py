"""Gradient-accumulation arithmetic, once for every framework and every way of training.

**One weighting model.** An update's gradient is

    Σᵢ wᵢ·gᵢ / Σᵢ wᵢ       over every micro-batch i of the update, on every micro-step and replica,

where gᵢ is the gradient of micro-batch i's loss, a *mean* over its own terms, and wᵢ is the
number of those terms: its samples for a per-sample mean (``accumulate(samples=n)``), its tokens
whose label is not ignored for a language model's per-token mean (``accumulate(weight=n)``).
That is the gradient of one mean over all the update's terms, one big-batch step; the mean of
the micro-batch means, (x₁/n₁ + x₂/n₂)/2, is not (Hugging Face's Trainer until transformers
#34191, torchtune #1875). A micro-batch with no terms (an idle replica, a sequence whose labels
are all ignored) has wᵢ = 0 and contributes exactly zero. A micro-batch's *weight* is always that
count wᵢ (what ``accumulate(weight=n)`` takes); its *share* is wᵢ / Σ wᵢ, the factor its gradient
enters the update with (:func:`sample_share`, :meth:`aikit.core.plan.Plan.share`).

Adapters accumulate Σ (wᵢ / unit)·gᵢ and multiply the sum once, at the update, by
:func:`mean_scale` (``unit · averaging replicas / Σ wᵢ``). The total Σ wᵢ is known in advance
for samples (the global batch: :func:`sample_share`), or only at the update's end for loss terms:
then it is summed over the replicas in the update's own collective, and may stay a framework
tensor on the device throughout (:func:`mean_scale` takes one). :func:`term_count` checks a
count a user passes.

Where the reduction over replicas *averages* over ``replicas`` (DDP, FSDP, Horovod's average)
rather than sums, every weight is multiplied by ``replicas`` (world scaling), read at each update,
never cached, so a resize scales right. When micro-batch sizes are not declared, the
micro-batches are taken to be equal and each weighs ``1 / micro-steps accumulated``
(:func:`equal_share`).

``reduction="sum"`` is Run:AI's AIkit's original arithmetic, for a *sum*-reduced loss (its own
tests compare with a big batch under ``MSELoss(reduction='sum')``): every micro-batch enters with
weight 1 (times the averaging replicas), so the update's gradient is the sum over the window,
which is the big batch's gradient of a summed loss. Declared sample shares, term counts and the
short window's correction are means' arithmetic and have no meaning there (:func:`reduction_name`).

Two refinements keep the framework adapters cheap and exact for samples:

* **one multiply per update**: weights are expressed relative to a *unit* (the weight of the
  micro-batch size most of the window shares, :func:`common_size`); a micro-batch of the unit
  size costs nothing, one of another size is multiplied by ``weight / unit``
  (:func:`relative_weight`), and the update multiplies the sum by ``unit`` once;
* **the short window at an epoch's end**: a window cut short holds fewer samples than planned;
  weights computed against the planned window are corrected at the update by
  :func:`short_window_factor` (planned / seen), the seen count being summed over replicas with
  the gradients. (Term counts need no correction: their total is always the one seen.)

Every function here is plain Python and property-tested against a direct mean over samples
and terms (tests/core/test_ga.py); plans (:meth:`aikit.core.plan.Plan.share`) and schedules
(:meth:`aikit.core.schedule.EpochSchedule.share`) take their weights from here.
"""

from __future__ import annotations

from typing import Any

from aikit.core.errors import InvalidValue
from aikit.core.validate import checked_int, non_negative_int

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


def term_count(value: object, name: str = "weight") -> int:
    """``value`` as a micro-batch's number of loss terms (an integer >= 0), or the aikit error
    that says what the count is: a float is refused, not rounded (a count of 2.5 tokens is a bug)."""
    return checked_int(value, name, 0, None, "an integer >= 0",
                       "the number of loss terms whose mean is this micro-batch's loss (for a language model, "
                       "its tokens whose label is not ignored: int((labels != -100).sum()))")


def mean_scale(total_weight: Any, unit: float = 1, averaging_replicas: int = 1) -> Any:
    """The factor that turns the accumulated Σ (wᵢ / ``unit``)·gᵢ, summed over the replicas (or
    averaged over ``averaging_replicas``), into the update's gradient Σ wᵢ·gᵢ / Σ wᵢ, where
    ``total_weight`` is Σ wᵢ over every micro-batch of every replica.

    A number is checked: an update whose micro-batches hold no terms at all has no mean, and is
    refused. A framework tensor (a count summed on a device) is not read, which would wait for
    the device: the adapter keeps it at least 1, so such an update's gradient is zero."""
    if isinstance(total_weight, (int, float)) and not total_weight > 0:
        raise InvalidValue(
            f"this update's micro-batches hold {total_weight:g} loss terms on every replica together, so it has no "
            "mean gradient: every label ignored, or every micro-batch empty? Feed at least one term per update "
            "(the update was not applied; its gradients are cleared)"
        )
    return unit * averaging_replicas / total_weight


def sample_share(samples: int, window_samples: int, averaging_replicas: int = 1) -> float:
    """The share of a micro-batch of ``samples`` in an update over ``window_samples`` samples, when
    the reduction over replicas averages over ``averaging_replicas`` (1 when it sums): the
    weighting model's case where the total, the global batch, is known before the update."""
    samples = non_negative_int(samples, "samples")
    window = non_negative_int(window_samples, "window_samples")
    if window == 0:
        raise InvalidValue("window_samples must be positive: an update needs at least one sample")
    if samples > window:
        raise InvalidValue(f"a micro-batch of {samples} samples cannot lie in a window of {window}")
    return mean_scale(window, samples, averaging_replicas)


def equal_share(micro_steps: int, reduction: str = "mean", num_replicas: int = 1,
                averaging_replicas: int = 1) -> float:
    """The share of each of ``micro_steps`` equal micro-batches on each of ``num_replicas`` replicas, when
    the reduction over replicas averages over ``averaging_replicas`` (1 when it sums): their mean
    over the window, or for ``reduction="sum"`` their sum."""
    micro_steps = non_negative_int(micro_steps, "micro_steps")
    if micro_steps == 0:
        raise InvalidValue("an update needs at least one micro-step")
    return averaging_replicas / accumulated_divisor(micro_steps, reduction, num_replicas)


def accumulated_divisor(micro_steps: Any, reduction: str, num_replicas: int = 1) -> Any:
    """What the sum of a window's equal micro-batch gradients, ``micro_steps`` on each of
    ``num_replicas`` replicas, is divided by: their number for their mean, 1 for their sum.
    ``micro_steps`` may be a framework's tensor (Keras counts micro-steps in its graph)."""
    if reduction_name(reduction) == "sum":
        return 1
    return micro_steps if num_replicas == 1 else micro_steps * num_replicas


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
