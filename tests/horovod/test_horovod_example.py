"""The main example, examples/torch_elastic_digits.py, trains under a real horovodrun."""

from __future__ import annotations

import re

import pytest

pytestmark = [pytest.mark.horovod, pytest.mark.slow]


def test_elastic_digits_trains_under_horovodrun(horovodrun):
    output = horovodrun("examples/torch_elastic_digits.py", "--epochs", "5").stdout
    # the plan comes from Horovod's world: 2 processes, 256 = 2 GA steps x 2 ranks x 64
    assert "devices: 2 used of 2 available" in output
    assert "GA steps per update: 2" in output
    assert "engine: horovod (2 process(es))" in output
    accuracy = [float(a) for a in re.findall(r"held-out accuracy: ([\d.]+)%", output)]
    assert len(accuracy) == 1, output[-2000:]  # printed by the master (rank 0) only
    assert accuracy[0] >= 70.0  # chance is 10%; 5 epochs of 256-sample updates get well past it
