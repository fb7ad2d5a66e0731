"""The Keras GA speed figures the docs quote are the benchmark's: one set, the one
``benchmarks/ga_keras.py --save benchmarks/results/ga_keras.json`` wrote, in docs/keras.md's
table and README.md's row, and no other figure of it anywhere (three sets had drifted apart)."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = json.loads((ROOT / "benchmarks" / "results" / "ga_keras.json").read_text())["results"]
BACKENDS = {"tensorflow": "TensorFlow", "jax": "JAX", "torch": "torch"}
MODELS = {"mlp": "MLP", "attention": "attention block"}
TABLE_ROW = re.compile(r"^\| (TensorFlow|JAX|torch) \| (MLP|attention block), [^|]+ \| ([\d.]+) ms \| ([\d.]+) ms \| "
                       r"([\d.]+) \(<= [\d.]+\) \|$", re.M)


def test_docs_keras_table_holds_the_benchmarks_figures():
    page = (ROOT / "docs" / "keras.md").read_text()
    rows = {(backend, model): figures for backend, model, *figures in TABLE_ROW.findall(page)}
    expected = {(BACKENDS[backend], MODELS[model]): [f"{run['keras_ms']:.1f}", f"{run['aikit_ms']:.1f}",
                                                     f"{run['ratio']:.2f}"]
                for backend, models in RESULTS.items() for model, run in models.items()}
    assert rows == expected


def test_the_readme_quotes_the_same_ratios():
    ratios = ", ".join(f"{BACKENDS[backend]} " + " / ".join(f"{models[m]['ratio']:.2f}" for m in MODELS)
                       for backend, models in RESULTS.items())
    row = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `ga_keras.py`"))
    assert row.endswith(f"| {ratios} |"), (row, ratios)


def test_no_other_keras_ga_speed_figure_is_quoted():
    """A line that speaks of the Keras GA's speed against Keras' own holds a number only in the
    checked table and row above."""
    for name in ("README.md", "docs/keras.md"):
        for line in (ROOT / name).read_text().splitlines():
            speaks = "ga_keras" in line or re.search(r"time (per update )?of Keras' own|Keras' own GA's time", line)
            if speaks and not (TABLE_ROW.match(line) or line.startswith("| `ga_keras.py`")):
                assert not re.search(r"\d\.\d", line), f"{name}: {line}"
