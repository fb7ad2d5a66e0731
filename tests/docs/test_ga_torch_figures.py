"""The torch GA speed figures the docs quote are the benchmark's: one set, the one
``benchmarks/ga_torch.py --rounds 60 --updates 3 --save benchmarks/results/ga_torch.json`` wrote,
in docs/torch.md's table and README.md's row."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = json.loads((ROOT / "benchmarks" / "results" / "ga_torch.json").read_text())["results"]
ROWS = {"cnn even": "digits CNN, even (4 × 64)", "cnn ragged": "digits CNN, ragged (64, 64, 64, 63)",
        "mlp even": "MLP with 1.1 M parameters, even", "mlp ragged": "MLP with 1.1 M parameters, ragged",
        "tiny even": "a model of one linear layer (the wrapper's own Python), even",
        "tiny ragged": "a model of one linear layer, ragged"}
LOOPS = ("aikit step()", "aikit accumulate(samples)", "hand-written again (resolution)")


def cell(config: str, loop: str) -> str:
    found = RESULTS[config].get(loop)
    if found is None:
        return "–"
    return f"{found['extra_us']:+.0f} µs" if config.startswith("tiny") else f"{found['ratio']:.3f}"


def test_docs_torch_table_holds_the_benchmarks_figures():
    page = (ROOT / "docs" / "torch.md").read_text().splitlines()
    for config, label in ROWS.items():
        expected = f"| {label} | " + " | ".join(cell(config, loop) for loop in LOOPS) + " |"
        assert expected in page, expected


def test_the_readme_quotes_the_same_ratios():
    row = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `ga_torch.py`"))
    ratios = (f"CNN {cell('cnn even', LOOPS[0])} / {cell('cnn even', LOOPS[1])} / {cell('cnn ragged', LOOPS[1])}, "
              f"MLP {cell('mlp even', LOOPS[0])} / {cell('mlp even', LOOPS[1])} / {cell('mlp ragged', LOOPS[1])}")
    assert row.endswith(f"| {ratios} |"), (row, ratios)
