"""aikit.core.agreement: settings as rows of small numbers, and what differs between rows."""

from __future__ import annotations

from aikit.core.agreement import disagreement, fingerprint, row_length


def test_equal_rows_agree_and_every_cell_fits_in_a_byte():
    settings = {"seed": 7, "trace": "ab" * 32, "shuffle": True, "lr": (0.1,), "big": 2**70}
    row = fingerprint(settings)
    assert len(row) == row_length(settings) and all(0 <= cell <= 255 for cell in row)
    assert disagreement(list(settings), [row, list(row), list(row)]) is None


def test_what_differs_is_named_with_the_ranks_holding_each_value():
    names = ["seed", "trace", "replicas"]
    rows = [fingerprint({"seed": 7, "trace": "a", "replicas": 3}),
            fingerprint({"seed": 8, "trace": "a", "replicas": 3}),
            fingerprint({"seed": 7, "trace": "b", "replicas": 3})]
    message = disagreement(names, rows)
    assert message.startswith("seed (ranks 0, 2: 7; rank 1: 8), trace (ranks 0, 1: #")
    assert "; rank 2: #" in message and "replicas" not in message
