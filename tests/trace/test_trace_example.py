"""The trace example trains for real under torchrun: two replicas, the trace's batch sizes,
and a held-out accuracy a user would accept."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aikit.core.schedule import Schedule

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_variable_train_digits_under_torchrun_reaches_its_target():
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    done = subprocess.run(
        [torchrun, "--standalone", "--nproc-per-node", "2", str(ROOT / "examples" / "variable_train_digits.py"),
         "--epochs", "2", "--target", "0.9"],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=240, cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("2 replica(s), 1438 training images")
    first = Schedule(str(ROOT / "examples" / "trace.csv"), 1438, 2, 32).epoch(0)  # what the trace asks for
    sizes = f"{int(first.batch_sizes.min())}..{int(first.batch_sizes.max())}"
    assert f"epoch 0: {len(first)} steps, batch sizes {sizes}" in done.stdout
    assert sum(line.startswith("epoch ") for line in lines) == 2
