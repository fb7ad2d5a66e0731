"""examples/lr_finder_digits.py runs, saves its plot and history, and suggests LRs on the curve."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from aikit.core.lr_range import read_history

EXAMPLE = Path(__file__).parents[2] / "examples" / "lr_finder_digits.py"
pytestmark = pytest.mark.slow


def test_the_torch_example_saves_a_png_and_a_csv_and_prints_lrs_from_the_history(tmp_path):
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--framework", "torch", "--num-iter", "40", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "MPLBACKEND": "Agg"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "lr_finder_torch.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    history = read_history(tmp_path / "lr_finder_torch.csv")
    line = next(line for line in done.stdout.splitlines() if line.startswith("torch: "))
    suggested = dict(part.split() for part in line.removeprefix("torch: ").split(", "))
    assert sorted(suggested) == ["bottom", "minimum", "slide", "steepest", "valley"]
    for method in ("steepest", "valley"):
        assert min(history["lr"]) <= float(suggested[method]) <= max(history["lr"])
