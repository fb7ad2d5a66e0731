"""Static shapes on XLA: training through a trace of changing batch sizes compiles a bounded
number of graphs. Runs in .venv-xla (scripts/install_xla.sh) on XLA:CPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from capabilities import skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
XLA_PYTHON = ROOT / ".venv-xla" / "bin" / "python"

pytestmark = pytest.mark.xla


def xla_python() -> Path:
    if not XLA_PYTHON.exists():
        skip_or_fail("XLA", f"{XLA_PYTHON} is missing: run scripts/install_xla.sh (torch 2.9.0 + torch_xla 2.9.0)")
    return XLA_PYTHON


def test_compilations_stop_growing_after_warmup_and_match_cpu():
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "1", "PYTHONPATH": str(ROOT)}
    env.pop("XLA_FLAGS", None)
    done = subprocess.run([str(xla_python()), str(Path(__file__).with_name("xla_train.py"))], env=env,
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    compiles = summary["compiles_per_epoch"]
    assert summary["distinct_batch_sizes"] == 8
    # the first epoch compiles every graph the run needs; later epochs, with other batch sizes
    # in other orders, compile nothing new
    assert compiles[1] == compiles[-1], compiles
    assert compiles[-1] < summary["updates"], summary
    assert summary["max_abs_diff_vs_cpu"] < 1e-4, summary


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
