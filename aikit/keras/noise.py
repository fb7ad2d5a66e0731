"""Gradient noise measured by the Keras GA optimizer, in the graph, for the cost of one scalar.

:class:`NoiseOptimizer` is aikit's Keras GA :class:`~aikit.keras.optimizers.Optimizer` that also
keeps what :mod:`aikit.core.gradient_noise` needs to measure ``|G|²`` and ``tr(Σ)``:

* every micro-step, before its gradient is added to the accumulators, each replica adds the
  squared norm of that micro-batch's gradient to a per-replica scalar (``ON_READ``, no
  communication): every micro-batch on every replica is one *part* of the update;
* at the update, that scalar rides in the wrapped optimizer's own gradient all-reduce (one more
  element in the same ``all_reduce`` call, so no second collective: the wrapped optimizer's
  Keras ``_all_reduce_sum_gradients`` is replaced, on that instance, by one that adds it), giving the sum of the
  parts' squared norms over all replicas, and the squared norm of the reduced (mean) gradient
  is taken from the same reduced gradients. On JAX and torch no optimizer reduces (the optimizer
  sees one replica: XLA reduces a mesh's gradients inside each micro-step), so the update
  measures its parts and its mean gradient itself.

Three numbers per update (parts, sum of part norms, norm of the mean) are read from Python
between updates by :meth:`NoiseOptimizer.noise`, which returns the unbiased estimate
(:func:`aikit.core.gradient_noise.update_estimates`, as PyTorch's: Keras feeds micro-batches of one size,
so the sample-weighted sum of the part norms is the plain sum times that size). Each replica's
gradients are its micro-batch mean divided by the replicas (Keras' loss scaling under
``tf.distribute``, or ``tf.nn.compute_average_loss``), so a part's gradient is ``replicas`` times
what the replica hands to ``apply``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from aikit.core.errors import InvalidValue
from aikit.core.ga import accumulated_divisor, reduction_name
from aikit.core.gradient_noise import NoiseEstimate, update_estimates
from aikit.core.validate import positive_int
from aikit.keras.optimizers import Optimizer
from aikit.runtime.Keras.backend import keras, ops, seam, to_numpy

__all__ = ["NoiseOptimizer"]


@keras.saving.register_keras_serializable(package="aikit")
class NoiseOptimizer(Optimizer):
    """aikit's Keras GA optimizer that measures the gradient noise of every update.

    Same arguments and behaviour as :class:`aikit.keras.optimizers.Optimizer` (the updates are
    bit for bit the same); after each update :meth:`noise` gives the unbiased ``|G|²`` and
    ``tr(Σ)`` of its micro-batches. The wrapped optimizer must not clip or loss-scale the
    gradients: the measured parts would then not add up to the gradient it applies. For the same
    reason the update must be the mean of the parts (``reduction="mean"``, the default): the
    estimate of ``|G|²`` is the squared norm of that mean.
    """

    def __init__(self, optimizer: keras.optimizers.Optimizer, steps: int = 1, name: str | None = None, **kwargs):
        _check_measurable(optimizer, kwargs.get("reduction"))
        kwargs["reduction"] = "mean"  # given, not the compiled loss's: a summed loss is refused
        super().__init__(optimizer, steps, name=name, **kwargs)
        _check_unchanged(self.inner)
        with keras.name_scope(self.name, caller=self):
            self._norms = PartNorms.made()  # variables of this optimizer's state (Keras tracks a named tuple's)

    def _check_weighable(self, weight) -> None:
        raise InvalidValue(
            f"NoiseOptimizer measures gradient noise from equal micro-batch means, so it takes no weight (got "
            f"{weight}): train token-weighted micro-batches with aikit.keras.Optimizer"
        )

    def apply(self, grads, trainable_variables=None, weight=None):
        """Add this micro-batch's squared gradient norm to the replica's sum, then accumulate."""
        if weight is not None:
            self._check_weighable(weight)
        grads = list(grads)
        present = [g for g in grads if g is not None]
        seam.check_apply_context(self.built)
        if present:
            self.assign_add(self._norms.micro_sq_norms, _sq_norm(present) * float(seam.replicas()) ** 2)
        super().apply(grads, trainable_variables)

    def _skip(self, sums) -> None:
        super()._skip(sums)
        self.assign(self._norms.micro_sq_norms, ops.zeros((), "float64"))  # a skipped update's parts: not measured

    def build(self, variables):
        super().build(variables)
        if seam.UPDATE_ALL_REDUCES:
            # from now on the wrapped optimizer's gradient all-reduce carries the part norms. Set once
            # (not around each update): replicas may trace the update concurrently, in threads.
            self.inner._all_reduce_sum_gradients = self._all_reduce_with_part_norms

    def _update(self, sums, variables) -> None:
        if not seam.UPDATE_ALL_REDUCES:  # no all-reduce to ride: the parts and the mean measured here
            divisor = ops.cast(accumulated_divisor(self._accumulated + 1, self.reduction), "float64")
            self._record_noise(self._norms.micro_sq_norms.value,
                               [ops.cast(s.value, "float64") / divisor for s in sums if s is not None], 1)
        super()._update(sums, variables)

    def _all_reduce_with_part_norms(self, grads_and_vars):
        """Keras' gradient all-reduce with one more element: this replica's part norms. Runs once
        per replica inside the update; the reduced gradients are the update's mean gradient."""
        keras_reduce = type(self.inner)._all_reduce_sum_gradients
        local = self._norms.micro_sq_norms.value
        reduced = keras_reduce(self.inner, [*grads_and_vars, (local, None)])  # Keras needs no variable for it
        (part_sq_norms, _), reduced = reduced[-1], reduced[:-1]
        self._record_noise(part_sq_norms, [g for g, _ in reduced if g is not None], seam.replicas())
        return reduced

    def _record_noise(self, part_sq_norms, mean: list, num_replicas: int) -> None:
        """What the update measured: its parts, their squared norms summed, its mean gradient's squared norm."""
        norms = self._norms
        norms.parts.assign((self._accumulated + 1) * num_replicas)
        norms.part_sq_norms.assign(part_sq_norms)
        norms.mean_sq_norm.assign(_sq_norm(mean) if mean else ops.zeros((), "float64"))
        self.assign(norms.micro_sq_norms, ops.zeros((), "float64"))

    def noise(self, part_samples: int) -> NoiseEstimate | None:
        """The unbiased ``|G|²`` and ``tr(Σ)`` of the last update, whose micro-batches each held
        ``part_samples`` samples on one replica; None when it had a single part (one replica and
        one micro-step: nothing to tell noise from signal), a norm that is not finite, or no
        update ran yet."""
        return self._norms.estimate(positive_int(part_samples, "part_samples"))


class PartNorms(NamedTuple):
    """What the last update measured (its parts, the micro-batches over all replicas; the sum of
    their squared norms; the squared norm of their mean) and this replica's sum of squared
    micro-batch norms towards the coming update (``ON_READ``, no communication)."""

    parts: Any
    part_sq_norms: Any
    mean_sq_norm: Any
    micro_sq_norms: Any

    @classmethod
    def made(cls) -> PartNorms:
        """New variables, zero (in the optimizer's name scope)."""
        kept = {"trainable": False, "aggregation": "only_first_replica"}
        return cls(keras.Variable(0, name="noise_parts", dtype="int64", **kept),
                   keras.Variable(0.0, name="noise_part_sq_norms", dtype="float64", **kept),
                   keras.Variable(0.0, name="noise_mean_sq_norm", dtype="float64", **kept),
                   keras.Variable(0.0, name="micro_sq_norms", dtype="float64", trainable=False,
                                  synchronization="on_read", aggregation="sum"))

    def estimate(self, part_samples: int) -> NoiseEstimate | None:
        """:func:`aikit.core.gradient_noise.update_estimates` of the last update (None: no estimate)."""
        parts = int(to_numpy(self.parts))
        estimates = update_estimates([float(to_numpy(self.part_sq_norms)) * part_samples], parts,
                                     parts * part_samples, [float(to_numpy(self.mean_sq_norm))])
        return estimates[0] if estimates else None


def _sq_norm(tensors: list):
    """The squared norm of ``tensors`` together, in float64 (summed tensor by tensor, in order)."""
    return ops.sum(ops.stack([ops.sum(ops.square(ops.cast(t, "float64"))) for t in tensors]))


def _check_measurable(optimizer: object, reduction: str | None) -> None:
    """Refuse what a NoiseOptimizer cannot measure: an optimizer another one serves, a summed update."""
    if "_all_reduce_sum_gradients" in getattr(optimizer, "__dict__", {}):  # (a dict is a saved config)
        raise InvalidValue("the optimizer already serves another NoiseOptimizer: give each its own optimizer")
    if reduction_name(reduction or "mean") == "sum":
        raise InvalidValue(
            "NoiseOptimizer needs reduction='mean', got 'sum': it estimates |G|² from the mean of the micro-batch "
            "gradients, and a summed update is not that mean; train a mean loss with reduction='mean', or keep "
            "reduction='sum' with aikit.keras.Optimizer (no noise measurement)"
        )


def _check_unchanged(inner: keras.optimizers.Optimizer) -> None:
    """Refuse a wrapped optimizer that changes the gradients before applying them (the parts would not add up)."""
    changed = {name: value for name in ("clipnorm", "clipvalue", "global_clipnorm", "loss_scale_factor")
               if (value := getattr(inner, name, None)) is not None}
    if changed:
        raise InvalidValue(
            f"NoiseOptimizer measures the raw micro-batch gradients, but the wrapped optimizer changes them "
            f"before applying ({', '.join(f'{k}={v}' for k, v in changed.items())}): create it without these "
            "arguments, or train with aikit.keras.Optimizer (no noise measurement)"
        )
