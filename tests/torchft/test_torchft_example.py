"""examples/torchft_digits.py --demo: two replica groups, one SIGKILLed after 20 updates and
started again; it heals from the live one, both end at the same accuracy, above the target (the
example exits 21 below it). About 1-2 minutes on a loaded 2-core machine: AIKIT_TORCHFT_ALL=1."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, every_case, require_torchft

pytestmark = pytest.mark.torchft


@every_case
def test_the_example_loses_a_group_heals_it_and_reaches_its_target(tmp_path):
    require_torchft()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "RUST_LOG": "error"}
    done = subprocess.run([sys.executable, "examples/torchft_digits.py", "--demo",
                           "--checkpoints", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "group1: SIGKILL after update 20" in done.stdout and "group1 was lost; starting it again" in done.stdout
    assert re.search(r"aikit torchft: group1 healed from a live group at update \d+", done.stdout), done.stdout[-3000:]
    final = re.findall(r"(group\d): epoch 7 done, .* test accuracy (\d\.\d+)", done.stdout)
    assert sorted(group for group, _ in final) == ["group0", "group1"]
    assert len({accuracy for _, accuracy in final}) == 1 and float(final[0][1]) >= 0.9, final
