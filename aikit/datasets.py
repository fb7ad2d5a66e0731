"""The embedded data set: scikit-learn's 1,797 real 8x8 handwritten digits (no download).

Returned as NumPy arrays so every framework adapter and example shares one split.
"""

from __future__ import annotations

import numpy as np

from aikit.optional import require


def digits(test_fraction: float = 0.2, seed: int = 0, dtype=np.float32):
    """``(x_train, y_train, x_test, y_test)``: images ``(n, 1, 8, 8)`` scaled to [0, 1]
    (channels first; use ``x.transpose(0, 2, 3, 1)`` for Keras' channels-last) and int64
    labels, split by a seeded, stratified-by-chance shuffle."""
    load_digits = require("sklearn.datasets", "aikit.datasets").load_digits

    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be between 0 and 1, got {test_fraction!r}")
    data = load_digits()
    images = (data.images / 16.0).astype(dtype)
    x = images.reshape(len(images), 1, 8, 8)  # reshape, not [:, None]: canonical strides for torch
    y = data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = round(len(y) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]
