"""Run:AI's AIkit's test helper ``runai.utils.random`` (run-ai/runai, MIT), as its GA tests use it."""

from __future__ import annotations

import random as r


def number(a: int = 10, b: int = 100) -> int:
    return r.randint(a, b)


def shape() -> tuple[int, ...]:
    return tuple([number(2, 5) for _ in range(number(2, 4))])
