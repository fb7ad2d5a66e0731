"""aikit.core.plan.micro_batch_slices: the micro-batches of one update cover its G samples exactly once
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aikit.core.plan import make_plan, micro_batch_slices

plans = st.builds(make_plan, st.integers(1, 600), st.integers(1, 80), st.integers(1, 9),
                  policy=st.sampled_from(["ragged", "fewer_devices"]))


@given(plans)
def test_devices_slices_cover_the_window_once(plan):
    covered = [i for d in range(plan.gpus) for s in micro_batch_slices(plan, d)
               for i in range(plan.global_batch_size)[s]]
    assert sorted(covered) == list(range(plan.global_batch_size))


@given(plans)
def test_slices_have_the_plans_sizes(plan):
    for d in range(plan.gpus):
        assert tuple(s.stop - s.start for s in micro_batch_slices(plan, d)) == plan.device_batch_sizes(d)
    steps = micro_batch_slices(plan)
    assert tuple(s.stop - s.start for s in steps) == plan.step_batch_sizes
    assert steps[0].start == 0 and steps[-1].stop == plan.global_batch_size


@pytest.mark.parametrize("device", [3, -1, True, "0"])
def test_bad_device_is_named(device):
    with pytest.raises(ValueError, match=rf"device must be an integer in \[0, 2\] for this plan, got {device!r}"):
        micro_batch_slices(make_plan(256, 64, 3), device)
