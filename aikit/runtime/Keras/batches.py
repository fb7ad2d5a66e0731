"""Arrays in batches, with NumPy alone: the LR finder's data on JAX and torch (TensorFlow keeps
``tf.data``), for ``(x, y)`` or ``(x, y, sample_weight)`` tuples of arrays."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from aikit.core.errors import InvalidType, InvalidValue


def check_lengths(data, name: str) -> None:
    """Refuse arrays ``(x, y[, sample_weight])`` of different lengths, naming each length."""
    lengths = [len(part) for part in data]
    if len(set(lengths)) > 1:
        parts = ", ".join(f"{part} {length}" for part, length in zip(("x", "y", "sample_weight"), lengths,
                                                                      strict=False))
        raise InvalidValue(f"`{name}` holds arrays of different lengths ({parts}): give one entry per sample in each")


class ArrayBatches:
    """``data`` in batches of ``batch_size``, in a fresh seeded order each pass when ``shuffle``,
    every pass again when ``repeat``."""

    def __init__(self, data, name: str, batch_size: int, shuffle: bool, repeat: bool = False, seed: int = 0):
        if not (isinstance(data, (tuple, list)) and len(data) in (2, 3)):
            raise InvalidType(f"`{name}` has unsupported type: {type(data)}. Expected a tuple (x, y) of arrays, or "
                              "(x, y, sample_weight)")
        check_lengths(data, name)
        self.data = [np.asarray(part) for part in data]
        self.batch_size, self.shuffle, self.repeat = batch_size, shuffle, repeat
        self.rng = np.random.default_rng(seed)

    def __iter__(self) -> Iterator[tuple]:
        while True:
            n = len(self.data[0])
            order = self.rng.permutation(n) if self.shuffle else np.arange(n)
            for start in range(0, n, self.batch_size):
                rows = order[start:start + self.batch_size]
                yield tuple(part[rows] for part in self.data)
            if not self.repeat or n == 0:
                return
