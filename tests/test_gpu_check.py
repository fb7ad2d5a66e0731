"""The GPU check's harness, proven on the CPU: ``bash scripts/gpu_check.sh --cpu`` runs tests/cuda on the
CPU device (their CUDA cases skip, naming why) and benchmarks/gpu.py's quick mode, writes its logs under
``$OUT`` (few files: the device tool brings back at most 8) and prints the table last, with every test
group and benchmark figure. The main collection leaves tests/cuda to this test (pyproject.toml's
``norecursedirs``), so CI runs those tests once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_gpu_check_runs_on_the_cpu_and_prints_its_table_last(tmp_path):
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))}
    env.update(OUT=str(tmp_path), PYTHON=sys.executable)
    done = subprocess.run(["bash", "scripts/gpu_check.sh", "--cpu"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=420)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    table = (tmp_path / "table.txt").read_text()
    assert done.stdout.rstrip().endswith(table.rstrip())  # the table comes last
    assert sorted(path.name for path in tmp_path.iterdir()) == ["bench.json", "bench.log", "env.txt", "table.txt",
                                                                "tests.log"]
    rows = {line[:44].strip(): line for line in table.splitlines()}
    groups = {path.stem.removeprefix("test_") for path in (ROOT / "tests" / "cuda").glob("test_*.py")}
    assert {f"tests: {group}" for group in groups} <= set(rows)
    for group in groups:  # each ran on the CPU; its CUDA cases skipped
        assert re.search(r"cpu \d+ ok.*; cuda \d+ skipped +PASS$", rows[f"tests: {group}"]), rows[f"tests: {group}"]
    for figure in ("GA / hand, transformer block", "GA / hand, launch-bound MLP", "token GA / torchtune-style",
                   "GA over 4 / one big batch", "bf16 / fp32, GA update", "host syncs in token GA micro-steps"):
        assert f"bench: {figure}" in rows
    assert rows["overall"].endswith("PASS")
    assert "no CUDA device here" in (tmp_path / "tests.log").read_text()  # the reason each CUDA case skipped
