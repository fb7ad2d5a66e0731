"""A range test's history on disk: ``lr,loss`` CSV that reads back to the same bits."""

from __future__ import annotations

import csv
import os

from aikit.core.validate import writable_file


def write_history(path: str | os.PathLike, history: dict) -> None:
    """Save a ``{"lr": [...], "loss": [...]}`` history as CSV with an ``lr,loss`` header;
    floats are written with ``repr`` so reading them back gives the same bits."""
    with open(writable_file(path, "give a file name, e.g. lr_finder.csv"), "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["lr", "loss"])
        writer.writerows(zip(history["lr"], history["loss"], strict=True))


def read_history(path: str | os.PathLike) -> dict:
    """Read a history written by :func:`write_history`."""
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    return {"lr": [float(row["lr"]) for row in rows], "loss": [float(row["loss"]) for row in rows]}
