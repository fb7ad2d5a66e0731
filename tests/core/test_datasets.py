"""The data sets every example and benchmark shares: the same split on every call, real text, and
language-model batches whose label count is the number of loss terms."""

from __future__ import annotations

import numpy as np
import pytest

from aikit.core.errors import InvalidType, InvalidValue
from aikit.datasets import IGNORE, PAD, pad_batch, stdlib_text


@pytest.fixture(scope="module")
def small():
    return stdlib_text(max_len=64, max_bytes=300_000)


def test_stdlib_text_is_the_same_split_on_every_call(small):
    again = stdlib_text(max_len=64, max_bytes=300_000)
    assert [s.tolist() for s in small[0]] == [s.tolist() for s in again[0]]
    assert [s.tolist() for s in small[1]] == [s.tolist() for s in again[1]]


def test_stdlib_text_is_python_source_in_sequences_of_varying_length(small):
    train, val = small
    lengths = np.array([len(s) for s in train + val])
    assert lengths.min() >= 16 and lengths.max() == 65  # min_len .. max_len + 1
    assert len(set(lengths.tolist())) > 30  # paragraphs, not fixed windows
    text = b"".join(bytes(s.astype(np.uint8)) for s in train)
    assert b"def " in text and b"import " in text and b"return" in text
    assert all(s.dtype == np.int64 and s.min() >= 0 and s.max() < 256 for s in train + val)


def test_validation_holds_about_its_fraction_of_the_bytes(small):
    train, val = small
    train_bytes, val_bytes = sum(map(len, train)), sum(map(len, val))
    assert 300_000 <= train_bytes + val_bytes < 300_000 + 200_000  # stops after the file that crosses it
    assert 0.05 < val_bytes / (train_bytes + val_bytes) < 0.2


def test_pad_batch_shifts_labels_and_counts_the_loss_terms():
    sequences = [np.array([5, 6, 7, 8]), np.array([9, 10]), np.array([1, 2, 3])]
    inputs, labels = pad_batch(sequences)
    assert inputs.tolist() == [[5, 6, 7], [9, PAD, PAD], [1, 2, PAD]]
    assert labels.tolist() == [[6, 7, 8], [10, IGNORE, IGNORE], [2, 3, IGNORE]]
    assert int((labels != IGNORE).sum()) == sum(len(s) - 1 for s in sequences)


@pytest.mark.parametrize("call, error, message", [
    (lambda: pad_batch([]), InvalidValue, "pad_batch() needs at least one sequence"),
    (lambda: pad_batch([np.array([1, 2]), np.array([3])]), InvalidValue,
     "sequence 1 has 1 token(s): a language model needs at least 2"),
    (lambda: stdlib_text(max_len=0), InvalidValue, "max_len must be a positive integer, got 0"),
    (lambda: stdlib_text(max_len=8, min_len=20), InvalidValue, "min_len must be an integer in 2..max_len + 1 = 9"),
    (lambda: stdlib_text(val_fraction=1.0), InvalidValue, "val_fraction must be a fraction in [0, 1), got 1.0"),
    (lambda: stdlib_text(max_bytes="1e6"), InvalidType, "max_bytes must be a positive integer, got '1e6'"),
    (lambda: stdlib_text(max_bytes=10), InvalidValue, "max_bytes=10 leaves no training text: raise max_bytes"),
])
def test_bad_arguments_are_refused_by_name(call, error, message):
    with pytest.raises(error) as raised:
        call()
    assert message in str(raised.value)
