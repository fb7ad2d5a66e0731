"""Real data without a download: scikit-learn's 1,797 8x8 handwritten digits (the quick demo),
and the Python standard library's own source files as text for a small language model.

Returned as NumPy arrays so every framework adapter, example and benchmark shares one split.
"""

from __future__ import annotations

import math
import re
import sysconfig
import zlib
from pathlib import Path

import numpy as np

from aikit.core.errors import InvalidValue
from aikit.core.validate import checked_float, checked_int, positive_int
from aikit.optional import require


def digits(test_fraction: float = 0.2, seed: int = 0, dtype=np.float32):
    """``(x_train, y_train, x_test, y_test)``: images ``(n, 1, 8, 8)`` scaled to [0, 1]
    (channels first; use ``x.transpose(0, 2, 3, 1)`` for Keras' channels-last) and int64
    labels, split by a seeded, stratified-by-chance shuffle."""
    load_digits = require("sklearn.datasets", "aikit.datasets").load_digits

    checked_float(test_fraction, "test_fraction", "between 0 and 1", lambda fraction: 0 < fraction < 1)
    data = load_digits()
    images = (data.images / 16.0).astype(dtype)
    x = images.reshape(len(images), 1, 8, 8)  # reshape, not [:, None]: canonical strides for torch
    y = data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = round(len(y) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


PAD = 0  # a byte source text does not contain
IGNORE = -100  # torch's default ignore_index: a label that is no loss term
_NOT_TEXT = {"site-packages", "dist-packages", "test", "tests", "__pycache__", "idlelib", "lib2to3", "turtledemo"}


def stdlib_text(max_len: int = 256, max_bytes: int | None = None, val_fraction: float = 0.1,
                min_len: int = 16) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``(train, val)``: real text on every machine without a download, the Python standard
    library's own ``.py`` sources, as byte-token sequences (int64 arrays, vocabulary 256).

    A sequence is one paragraph (the lines between blank lines) cut into pieces of at most
    ``max_len + 1`` bytes (a language model's inputs and shifted labels), pieces shorter than
    ``min_len`` dropped, so lengths vary as a corpus' documents do. Files are taken in an order
    fixed by a checksum of their path, and each goes wholly to ``val`` or ``train`` (no file in
    both) so that ``val`` holds about ``val_fraction`` of the bytes; ``max_bytes`` stops reading
    once that many bytes are in, for quick runs. The same Python version gives the same split."""
    max_len = positive_int(max_len, "max_len")
    min_len = checked_int(min_len, "min_len", 2, max_len + 1, f"an integer in 2..max_len + 1 = {max_len + 1}")
    val_fraction = checked_float(val_fraction, "val_fraction", "a fraction in [0, 1)", lambda f: 0 <= f < 1)
    budget = math.inf if max_bytes is None else positive_int(max_bytes, "max_bytes")
    train: list[np.ndarray] = []
    val: list[np.ndarray] = []
    taken = {"train": 0, "val": 0}
    for path in _stdlib_sources():
        if taken["train"] + taken["val"] >= budget:
            break
        split = "val" if taken["val"] < val_fraction * (taken["train"] + taken["val"] + 1) else "train"
        pieces = _pieces(path.read_bytes(), max_len + 1, min_len)
        (val if split == "val" else train).extend(pieces)
        taken[split] += sum(len(piece) for piece in pieces)
    if not train or (val_fraction and not val):
        raise InvalidValue(f"max_bytes={max_bytes} leaves no {'training' if not train else 'validation'} text: "
                           "raise max_bytes")
    return train, val


def _stdlib_sources() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    paths = [path for path in root.rglob("*.py") if not _NOT_TEXT.intersection(path.relative_to(root).parts)]
    if not paths:
        raise FileNotFoundError(f"no Python sources under {root}: stdlib_text() needs the standard library's files")
    return sorted(paths, key=lambda path: (zlib.crc32(path.relative_to(root).as_posix().encode()), path.name))


def _pieces(data: bytes, size: int, min_len: int) -> list[np.ndarray]:
    pieces = []
    for paragraph in re.split(rb"\n[ \t]*\n", data):
        tokens = np.frombuffer(paragraph + b"\n", dtype=np.uint8).astype(np.int64)
        pieces.extend(piece for start in range(0, len(tokens), size)
                      if len(piece := tokens[start:start + size]) >= min_len)
    return pieces


def pad_batch(sequences: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``(inputs, labels)`` of a language model for ``sequences`` of different lengths: each
    sequence but its last token as inputs, each but its first as labels, padded to the longest
    with :data:`PAD` and :data:`IGNORE`. ``(labels != IGNORE).sum()`` is the batch's number of
    loss terms, what a token-mean loss divides by."""
    if not sequences:
        raise InvalidValue("pad_batch() needs at least one sequence")
    width = max(len(sequence) for sequence in sequences) - 1
    inputs = np.full((len(sequences), width), PAD, dtype=np.int64)
    labels = np.full((len(sequences), width), IGNORE, dtype=np.int64)
    for row, sequence in enumerate(sequences):
        if len(sequence) < 2:
            raise InvalidValue(f"sequence {row} has {len(sequence)} token(s): a language model needs at least 2")
        inputs[row, :len(sequence) - 1] = sequence[:-1]
        labels[row, :len(sequence) - 1] = sequence[1:]
    return inputs, labels
