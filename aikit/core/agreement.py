"""Do the replicas agree on what they train? Each replica's settings as a few small numbers,
gathered by a collective the run makes anyway, compared alike on every replica.

Two replicas given different traces (or seeds, or data set sizes) each deal themselves their own
micro-batches: they train on, diverge silently, and fail much later in a collective whose sizes
no longer match ("Connection closed by peer"). A :func:`fingerprint` is 9 numbers per setting,
each in 0..255, so it travels exactly in any float dtype (bfloat16 included) as a row of a table
that the other replicas fill with zeros: one sum over the replicas gathers every row.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping

from aikit.core.errors import InvalidValue

_INT, _HASH = 0, 1
_WIDTH = 9  # a kind byte, then 8 bytes


def fingerprint(settings: Mapping[str, object]) -> list[int]:
    """One replica's row: for each setting, in order, an integer in ``0..2**64-1`` as itself,
    anything else as the first 8 bytes of the SHA-256 of its ``repr``."""
    row: list[int] = []
    for value in settings.values():
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64:
            row += [_INT, *value.to_bytes(8, "little")]
        else:
            row += [_HASH, *hashlib.sha256(repr(value).encode()).digest()[:8]]
    return row


def row_length(settings: Mapping[str, object]) -> int:
    return _WIDTH * len(settings)


def own_row(settings: Mapping[str, object], rank: int, num_replicas: int) -> list[float]:
    """The table ``rank`` adds to a sum over the replicas: its :func:`fingerprint` in its row,
    zeros in the others' (empty without settings)."""
    width = row_length(settings)
    table = [0.0] * (width * num_replicas)
    table[rank * width:(rank + 1) * width] = fingerprint(settings)
    return table


def rows_of(table: list[float], num_replicas: int) -> list[list[int]]:
    """Every replica's row of a table summed over the replicas (each cell back to its integer)."""
    width = len(table) // num_replicas
    return [[round(value) for value in table[rank * width:(rank + 1) * width]] for rank in range(num_replicas)]


def disagreement(names: list[str], rows: list[list[int]]) -> str | None:
    """None when every replica's row is the same; else what differs, and which ranks hold
    which value, the same text on every replica, e.g. ``seed (rank 0: 7; rank 1: 8)``."""
    differ = []
    for index, name in enumerate(names):
        values: dict[str, list[int]] = {}
        for rank, row in enumerate(rows):
            cell = row[index * _WIDTH:(index + 1) * _WIDTH]
            number = int.from_bytes(bytes(cell[1:]), "little")
            shown = str(number) if cell[0] == _INT else f"#{number:016x}"
            values.setdefault(shown, []).append(rank)
        if len(values) > 1:
            held = "; ".join(f"{_ranks(ranks)}: {shown}" for shown, ranks in values.items())
            differ.append(f"{name} ({held})")
    return ", ".join(differ) if differ else None


def check_agreement(names: list[str], rows: list[list[int]]) -> None:
    """Refuse, on every replica alike, a run whose replicas were given different settings: they
    would each train their own run, diverge, and fail much later in a collective."""
    problem = disagreement(names, rows)
    if problem is not None:
        raise InvalidValue(
            f"the replicas were not given the same run; they differ in {problem}: start every worker with the "
            "same trace, data set, seed and settings (and, resuming, from the same checkpoint)")


class Agreement:
    """When the replicas compare their settings, in the rows a collective gathers anyway: at their
    first collective, and again after the world formed anew."""

    def __init__(self, num_replicas: int) -> None:
        self.pending = num_replicas > 1
        self._table: tuple[list[str], int] = ([], 1)  # the settings and replicas of the table :meth:`table` gave

    def again(self, num_replicas: int) -> None:
        """Compare at the next collective (with more than one replica; local)."""
        self.pending = num_replicas > 1

    def check(self, names: list[str], rows: list[list[int]]) -> None:
        """Compare the gathered rows now, refused alike on every replica where they differ."""
        self.pending = False
        check_agreement(names, rows)

    def table(self, settings: Callable[[], Mapping[str, object]], rank: int, num_replicas: int) -> list[float]:
        """What ``rank`` adds to a sum over the replicas: its :func:`own_row` of ``settings()``
        where a comparison is pending, else nothing."""
        own = settings() if self.pending else {}
        self._table = list(own), num_replicas
        return own_row(own, rank, num_replicas)

    def compared(self, summed: list[float] | None, table: list[float], rest: list[float]) -> list[float]:
        """The sums of ``rest``, which followed ``table`` in ``summed`` (``rest`` itself where
        nothing was summed), the table's rows compared first where it held any."""
        if summed is not None:
            table, rest = summed[:len(table)], summed[len(table):]
        names, num_replicas = self._table
        if names:
            self.check(names, rows_of(table, num_replicas))
        return rest


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
