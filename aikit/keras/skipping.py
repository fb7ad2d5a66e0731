"""The Keras GA wrapper's skip of an update whose gradient is inf or NaN, in its graph.

As Keras' ``LossScaleOptimizer`` and a torch ``GradScaler`` skip one: a condition at the update
(no read from the device: a ``tf.cond``, a ``jax.lax.cond``, on torch both branches kept by
``where``) leaves the weights, the wrapped optimizer's ``iterations`` and its LR
schedule as they were and clears the sums; ``skipped`` and ``skipped_in_a_row`` count the skips.
Under a multi-replica strategy each replica counts its sums that are not finite and the counts
are summed to one number in the update, so every replica takes the same branch (a replica's own
sums differ: one alone cannot decide). A graph cannot warn or raise without a read that would
stall it, so the words (:mod:`aikit.core.skips`'s, the torch wrapper's) come where Keras runs
Python: an ``apply`` run eagerly on one replica warns at the first skip and raises
:class:`~aikit.core.errors.TrainingFailed` after ``max_skips_in_a_row`` in a row; ``Model.fit``
warns at its end (``finalize_variable_values``) if its compiled steps skipped any. A wrapped
``LossScaleOptimizer`` checks its own gradients (and lowers its scale on an overflow, which a skip
here would hide from it): there the wrapper checks nothing, as the torch one under a GradScaler.
"""

from __future__ import annotations

import warnings

from aikit.core.skips import checked_max_skips, nonfinite_warning, too_many_skips, user_stacklevel
from aikit.core.validate import checked_bool
from aikit.runtime.Keras.backend import keras, ops, seam, to_numpy

KERAS_COUNTS = "optimizer.iterations did not advance, optimizer.skipped counts the skips"


class SkipCounts:
    """``skipped`` and ``skipped_in_a_row``: variables of the optimizer's state (JAX's step carries
    them), held outside Keras' tracking so that they stay out of the variables it saves (a count of
    this object's, as torch's ``skipped``: weights saved before load as they were)."""

    def __init__(self, name: str) -> None:
        self.skipped, self.in_a_row = (keras.Variable(0, name=f"{name}_{what}", dtype="int64", trainable=False,
                                                      aggregation="only_first_replica")
                                       for what in ("skipped", "in_a_row"))


class SkippedUpdates:
    """What :class:`aikit.keras.optimizers.Optimizer` counts and decides of a non-finite update."""

    def _init_skips(self, skip_nonfinite: bool, max_skips_in_a_row: int | None) -> None:
        self.skip_nonfinite = checked_bool(skip_nonfinite, "skip_nonfinite")
        self.max_skips_in_a_row = checked_max_skips(max_skips_in_a_row)
        self._counts = SkipCounts(self.name)
        self._warned = False

    @property
    def _skip_counts(self) -> list:
        counts = self.__dict__.get("_counts")
        return [] if counts is None else [counts.skipped, counts.in_a_row]

    @property
    def _skipped(self):
        return self._counts.skipped

    @property
    def _skipped_in_a_row(self):
        return self._counts.in_a_row

    @property
    def _checks_finite(self) -> bool:
        """Whether this wrapper skips non-finite updates itself (not where a LossScaleOptimizer does)."""
        return self.skip_nonfinite and not isinstance(self.inner, keras.optimizers.LossScaleOptimizer)

    @property
    def skipped(self) -> int:
        """Updates skipped for an inf/NaN gradient (the weights and ``iterations`` left as they were)."""
        return int(to_numpy(self._skipped))

    @property
    def skipped_in_a_row(self) -> int:
        """Updates skipped for an inf/NaN gradient since the last update applied."""
        return int(to_numpy(self._skipped_in_a_row))

    def _replicas_nonfinite(self, sums):
        """How many of the replicas' ``sums`` hold an inf or NaN, from a replica context (every
        replica must take the same branch; a subclass that averages elsewhere sums there too)."""
        return seam.replicas_sum(self._nonfinite_count(sums))

    @staticmethod
    def _nonfinite_count(sums):
        """How many of this replica's ``sums`` hold an inf or NaN (float32: what a reduction sums)."""
        counts = [ops.cast(ops.logical_not(ops.all(ops.isfinite(s.value))), "float32") for s in sums if s is not None]
        return ops.sum(ops.stack(counts)) if counts else ops.zeros((), "float32")

    def _update_if_finite(self, nonfinite, update, skip):
        """``update()`` if ``nonfinite()`` (the replicas' count of non-finite sums) is 0, else
        ``skip()``: one condition of the backend's; whether it updated, a tensor."""
        if not self._checks_finite:
            update()
            return ops.convert_to_tensor(True)

        def updated() -> None:  # a branch returns nothing, whatever its call returned
            update()

        def skipped() -> None:
            skip()

        finite = ops.equal(nonfinite(), 0)
        seam.cond(finite, updated, skipped, self._state_variables())
        return finite

    def _count_skip(self, is_update, applied) -> None:
        """Count the update this micro-step made, if it was one and was skipped."""
        skipped = ops.logical_and(is_update, ops.logical_not(applied))
        self._skipped.assign_add(ops.cast(skipped, "int64"))
        in_a_row = self._skipped_in_a_row.value
        self._skipped_in_a_row.assign(ops.where(skipped, in_a_row + 1, ops.where(is_update, 0, in_a_row)))

    def _check_skips(self) -> None:
        """After an ``apply`` run eagerly on one replica: the first skip warned about once, a run
        of ``max_skips_in_a_row`` refused."""
        in_a_row = self.skipped_in_a_row
        if not in_a_row:
            return
        self._warn("inf or NaN")
        if self.max_skips_in_a_row is not None and in_a_row >= self.max_skips_in_a_row:
            self._skipped_in_a_row.assign(0)  # caught, training may go on: another run to fail
            raise too_many_skips(in_a_row, self.skipped, "inf or NaN", updated=False)

    def _report_skips(self) -> None:
        """At the end of ``Model.fit``: the updates its compiled steps skipped, warned once."""
        if self._checks_finite and self.skipped:
            self._warn(f"inf or NaN: {self.skipped} update(s) skipped, the last {self.skipped_in_a_row} in a row")

    def _warn(self, detail: str) -> None:
        if not self._warned:
            self._warned = True
            warning = nonfinite_warning(detail, self.max_skips_in_a_row, KERAS_COUNTS)
            warnings.warn(warning, stacklevel=user_stacklevel())

