"""The GA sums' arithmetic on ``keras.ops``, for TensorFlow and JAX: a graph or XLA runs it (the
accumulation in place where the backend assigns in place). Keras on torch runs every operation
eagerly, one allocation each, so :mod:`aikit.runtime.Keras.torch` does the same with grouped
in-place kernels. ``totals`` are the GA optimizer's accumulators (Keras variables), none None."""

from __future__ import annotations

import keras

ops = keras.ops


def add_to(optimizer, totals: list, values: list) -> None:
    """Add each of ``values`` to its total (the optimizer's ``assign_add``: TensorFlow adds a
    sparse ``IndexedSlices`` by a scatter)."""
    for total, value in zip(totals, values, strict=True):
        optimizer.assign_add(total, value)


def divided(totals: list, divisor) -> list:
    """The totals' values over ``divisor`` (a number or a scalar tensor): the update's gradients."""
    if isinstance(divisor, int) and divisor == 1:
        return [total.value for total in totals]
    return [total.value / ops.cast(divisor, total.dtype) for total in totals]


def clear(totals: list) -> None:
    """Set every total to zero."""
    for total in totals:
        total.assign(ops.zeros_like(total.value))


def nonfinite(totals: list):
    """1 when any of ``totals`` holds an inf or NaN, else 0: a float32 scalar (what a reduction
    over replicas sums)."""
    if not totals:
        return ops.zeros((), "float32")
    finite = ops.all(ops.stack([ops.all(ops.isfinite(total.value)) for total in totals]))
    return ops.cast(ops.logical_not(finite), "float32")  # (few operations: a graph visits an untaken branch's too)
