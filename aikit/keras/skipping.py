"""The Keras GA wrapper's skip of an update whose gradient is inf or NaN, in its graph.

As Keras' ``LossScaleOptimizer`` and a torch ``GradScaler`` skip one: a condition at the update (a
``tf.cond``, a ``jax.lax.cond``: no read from the device; on torch a Python ``if`` on one number
read per update, as a GradScaler reads one) leaves the weights, the wrapped optimizer's
``iterations`` and its LR schedule as they were and clears the sums; ``skipped`` and
``skipped_in_a_row`` count the skips. Under a multi-replica strategy each replica flags its sums if
any is not finite and the flags are summed to one number in the update, so every replica takes
the same branch (a replica's own sums differ: one alone cannot decide). A graph cannot warn or
raise without a read that would stall it, so the words (:mod:`aikit.core.skips`'s, the torch
wrapper's) come where Keras runs Python: an ``apply`` run eagerly on one replica warns at the first
skip and raises :class:`~aikit.core.errors.TrainingFailed` after ``max_skips_in_a_row`` in a row;
``Model.fit`` warns at its end (``finalize_variable_values``) if its compiled steps skipped any. A
wrapped ``LossScaleOptimizer`` checks its own gradients (and lowers its scale on an overflow, which
a skip here would hide from it): there the wrapper checks nothing, as the torch one under a
GradScaler.
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
    def _checks_finite(self) -> bool:
        """Whether this wrapper skips non-finite updates itself (not where a LossScaleOptimizer does)."""
        return self.skip_nonfinite and not isinstance(self.inner, keras.optimizers.LossScaleOptimizer)

    @property
    def skipped(self) -> int:
        """Updates skipped for an inf/NaN gradient (the weights and ``iterations`` left as they were)."""
        return int(to_numpy(self._counts.skipped))

    @property
    def skipped_in_a_row(self) -> int:
        """Updates skipped for an inf/NaN gradient since the last update applied."""
        return int(to_numpy(self._counts.in_a_row))

    def _replicas_nonfinite(self, sums):
        """How many replicas hold an inf or NaN in their ``sums``, from a replica context (every
        replica must take the same branch; a subclass that averages elsewhere sums there too)."""
        return seam.replicas_sum(self._nonfinite_count(sums))

    @staticmethod
    def _nonfinite_count(sums):
        """1 if this replica's ``sums`` hold an inf or NaN, else 0 (float32: what a reduction sums)."""
        return seam.nonfinite([s for s in sums if s is not None])

    def _update_if_finite(self, nonfinite, update, skip) -> None:
        """``update()`` if ``nonfinite()`` (the replicas' count of non-finite sums) is 0, else
        ``skip()``: one condition of the backend's, each branch counting (an update ends a run of
        skips; a skip adds one to both counts)."""
        if not self._checks_finite:
            update()
            return

        def updated() -> None:  # a branch returns nothing, whatever its call returned
            update()
            self._counts.in_a_row.assign(0)

        def skipped() -> None:
            skip()
            self._counts.skipped.assign_add(1)
            self._counts.in_a_row.assign_add(1)

        seam.cond(ops.equal(nonfinite(), 0), updated, skipped, self._state_variables())

    def _check_skips(self) -> None:
        """After an ``apply`` run eagerly on one replica: the first skip warned about once, a run
        of ``max_skips_in_a_row`` refused."""
        in_a_row = self.skipped_in_a_row
        if not in_a_row:
            return
        self._warn("inf or NaN")
        if self.max_skips_in_a_row is not None and in_a_row >= self.max_skips_in_a_row:
            self._counts.in_a_row.assign(0)  # caught, training may go on: another run to fail
            raise too_many_skips(in_a_row, self.skipped, "inf or NaN", updated=False)

    def _report_skips(self) -> None:
        """At the end of ``Model.fit``: the updates its compiled steps skipped, warned once. Keras on
        JAX takes the variables' values out of them for the fit and puts them back at its end; a
        fit that failed before its first step (``jax.jit``'s "incompatible devices") put none back,
        and its error, on its way out through this call, must not become another one here."""
        if self._checks_finite and self._counts.skipped._value is not None and self.skipped:
            self._warn(f"inf or NaN: {self.skipped} update(s) skipped, the last {self.skipped_in_a_row} in a row")

    def _warn(self, detail: str) -> None:
        if not self._warned:
            self._warned = True
            warning = nonfinite_warning(detail, self.max_skips_in_a_row, KERAS_COUNTS)
            warnings.warn(warning, stacklevel=user_stacklevel())

