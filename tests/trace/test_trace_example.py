"""The trace example trains for real under torchrun: two replicas, the trace's batch sizes,
and a held-out accuracy a user would accept."""

from pathlib import Path

import pytest

from aikit.core.schedule import Schedule

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_variable_train_digits_under_torchrun_reaches_its_target(torchrun):
    done = torchrun(ROOT / "examples" / "variable_train_digits.py", "--epochs", "2", "--target", "0.9")
    lines = done.stdout.splitlines()
    assert lines[0].startswith("2 replica(s), 1438 training images")
    first = Schedule(str(ROOT / "examples" / "trace.csv"), 1438, 2, 32).epoch(0)  # what the trace asks for
    sizes = f"{int(first.batch_sizes.min())}..{int(first.batch_sizes.max())}"
    assert f"epoch 0: {len(first)} steps, batch sizes {sizes}" in done.stdout
    assert sum(line.startswith("epoch ") for line in lines) == 2
