"""aikit.core.goodput: the throughput model and the controller that picks the global batch.

The controller's choice is checked against a closed form: with one device, no GA and
``seconds = per_sample * B + per_update``, goodput ∝ B / ((per_sample·B + per_update)(φ + B))
for noise scale φ, whose maximum is at B* = sqrt(per_update · φ / per_sample)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aikit.core.goodput import TIMINGS_KEPT, BatchSplit, GoodputController, ThroughputModel
from aikit.core.gradient_noise import NoiseEstimate
from aikit.core.plan import largest_even_batch, make_plan
from aikit.core.schedule import split_minimums

EVERY_UPDATE = {"min_estimates": 1, "interval": 1}  # decide at every update from the first estimate


def timed(model_coefficients, plan):
    per_micro, per_sample, per_update = model_coefficients
    return plan.steps * (per_micro + per_sample * plan.batch_size) + per_update


@settings(max_examples=50, deadline=None)
@given(
    per_micro=st.floats(0, 0.1), per_sample=st.floats(1e-4, 1e-2), per_update=st.floats(0, 0.5),
)
def test_the_throughput_model_recovers_exact_coefficients(per_micro, per_sample, per_update):
    model = ThroughputModel()
    for micro, steps in [(8, 1), (32, 1), (32, 4), (16, 2)]:
        model.observe(micro, steps, steps * (per_micro + per_sample * micro) + per_update)
    found = model.coefficients()
    assert found == pytest.approx((per_micro, per_sample, per_update), abs=1e-9)


def test_one_slow_update_does_not_move_the_fit():
    model = ThroughputModel()
    for micro in (8, 16, 32):
        for seconds in (0.01 * micro + 0.1,) * 4 + (50.0,) * (micro == 16):
            model.observe(micro, 1, seconds)
    assert model.seconds(64, 1) == pytest.approx(0.01 * 64 + 0.1)


def test_the_fit_follows_the_latest_timings_and_its_state_stays_bounded():
    """A machine that slowed down (another job on it) is fitted at its new speed once the latest
    TIMINGS_KEPT timings of each configuration are the slow ones, and a run of any length saves
    that many per configuration (a longer saved list loads as its latest)."""
    model = ThroughputModel()
    for micro in (8, 16):
        for seconds in [0.01 * micro + 0.1] * 3 * TIMINGS_KEPT + [0.02 * micro + 0.2] * TIMINGS_KEPT:
            model.observe(micro, 1, seconds)
    assert model.seconds(32, 1) == pytest.approx(0.02 * 32 + 0.2)
    saved = model.state_dict()
    assert [len(seconds) for _, _, seconds in saved["times"]] == [TIMINGS_KEPT, TIMINGS_KEPT]
    longer = {"times": [[8, 1, [9.0] * 5 + [0.3] * TIMINGS_KEPT], [16, 1, [0.52] * 3]]}
    restored = ThroughputModel()
    restored.load_state_dict(longer)
    assert [seconds for _, _, seconds in restored.state_dict()["times"]] == [[0.3] * TIMINGS_KEPT, [0.52] * 3]


def test_with_few_configurations_the_model_assumes_what_it_can_identify():
    model = ThroughputModel()
    model.observe(32, 2, 1.5)  # truth: 0.02 s per sample + 0.22 s per update
    # one micro-batch size: half of a micro-step's 0.75 s counts as fixed (AdaptDL's prior)
    assert model.coefficients() == pytest.approx((0.375, 0.375 / 32, 0))
    assert model.seconds(32, 2) == pytest.approx(1.5)  # what was measured is predicted as measured
    assert model.seconds(64, 2) == pytest.approx(2.25)  # optimistic about a larger micro-batch (truth 2.78)
    model.observe(64, 2, 2.78)
    assert model.coefficients() == pytest.approx((0, 0.02, 0.22))


def controller_after(batch_noise, coefficients, *, devices=1, max_device=10_000, **bounds):
    """A controller that has timed one update at each of three batches and seen the noise, and
    decides at every update from the first estimate (the decision rule alone)."""
    trace, grad_sq = batch_noise
    c = GoodputController(max_device, devices, **EVERY_UPDATE, **bounds)
    for batch in (c.ref_batch_size, 2 * c.ref_batch_size, 4 * c.ref_batch_size):
        c.batch = batch
        c.observe(timed(coefficients, c.plan(batch)), NoiseEstimate(grad_sq=grad_sq, trace=trace))
    c.batch = c.ref_batch_size
    return c


@pytest.mark.parametrize("phi", [100.0, 900.0, 4000.0])
def test_the_controller_finds_the_closed_form_optimum(phi):
    per_sample, per_update = 1e-3, 0.2
    c = controller_after((phi, 1.0), (0.0, per_sample, per_update), ref_batch_size=16, max_batch=4096)
    optimum = math.sqrt(per_update * phi / per_sample)
    while c.propose() is not None:  # at most doubling each time, the model trusted near what it measured
        update, old, new, _ = c.changes[-1]
        assert update == 3 and old < new <= 2 * old
    assert c.goodput(round(optimum)) <= 1.05 * c.goodput(c.batch)  # within the threshold of the optimum
    assert c.batch >= optimum / 2


def test_one_change_moves_the_batch_by_at_most_max_change():
    c = controller_after((4000.0, 1.0), (0.0, 1e-3, 0.2), ref_batch_size=16, max_batch=4096, max_change=1.5)
    assert c.propose() == 24  # the optimum is 894
    c.batch = 894
    assert c.propose() is None or c.batch >= 894 / 1.5
    with pytest.raises(ValueError, match=r"max_change must be a factor above 1 \(2.0: at most double or halve\)"):
        GoodputController(64, ref_batch_size=64, max_batch=128, max_change=1)


def test_no_noise_keeps_the_base_batch():
    # a noiseless gradient: a bigger batch adds no progress, only time
    c = controller_after((0.0, 1.0), (0.0, 1e-3, 0.2), ref_batch_size=64, max_batch=4096)
    assert c.propose() is None and c.batch == 64


def test_more_devices_make_a_bigger_batch_pay():
    # the same noise and per-sample cost; 8 devices process 8 micro-batches at once
    one = controller_after((500.0, 1.0), (0.01, 1e-3, 0.05), devices=1, max_device=64, ref_batch_size=64,
                           max_batch=2048, max_change=math.inf)
    eight = controller_after((500.0, 1.0), (0.01, 1e-3, 0.05), devices=8, max_device=64, ref_batch_size=64,
                             max_batch=2048, max_change=math.inf)
    assert (eight.propose() or eight.batch) > (one.propose() or one.batch)


def test_a_change_needs_more_than_the_threshold():
    # goodput at the optimum (424) is 4.5 % above the base batch's: no change at 5 %, a change at 3 %
    per_sample, per_update, phi = 1e-3, 0.2, 900.0
    base = 270

    def rel(b):
        return b / ((per_sample * b + per_update) * (phi + b))

    gain = rel(424) / rel(base)
    assert 1.03 < gain < 1.05
    kept = controller_after((phi, 1.0), (0.0, per_sample, per_update), ref_batch_size=base, max_batch=4096)
    assert kept.propose() is None
    moved = controller_after((phi, 1.0), (0.0, per_sample, per_update), ref_batch_size=base, max_batch=4096,
                             threshold=0.03)
    assert moved.propose() == pytest.approx(424, abs=1)


def test_every_update_is_recorded_for_replay_and_the_state_resumes_exactly():
    c = controller_after((900.0, 1.0), (0.0, 1e-3, 0.2), ref_batch_size=16, max_batch=4096)
    new = c.propose()
    c.observe(0.5, NoiseEstimate(1.0, 800.0))
    assert c.batches == [16, 32, 64, new]
    again = GoodputController(10_000, ref_batch_size=16, max_batch=4096)
    again.load_state_dict(c.state_dict())
    assert again.state_dict() == c.state_dict()
    assert again.goodput(100) == c.goodput(100)


def test_nothing_is_proposed_before_an_update_is_timed():
    c = GoodputController(64, ref_batch_size=64, max_batch=512)
    assert c.propose() is None


def test_candidates_cover_the_bounds_in_steps_of_the_device_count():
    c = GoodputController(64, 4, ref_batch_size=64, max_batch=200, min_batch=10)
    found = c.candidates().tolist()
    assert found[0] == 10 and found[-1] == 200 and 12 in found and 13 not in found and 64 in found
    huge = GoodputController(64, 1, ref_batch_size=64, max_batch=10**9)
    assert len(huge.candidates()) <= 1004


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ref_batch_size": 64, "max_batch": 32}, r"min_batch <= ref_batch_size <= max_batch, got 64, 64, 32"),
        ({"ref_batch_size": 64, "max_batch": 128, "min_batch": 100}, "got 100, 64, 128"),
        ({"ref_batch_size": 64, "max_batch": 128, "threshold": -1}, "threshold must be a non-negative fraction"),
        ({"ref_batch_size": 0, "max_batch": 128}, "ref_batch_size must be a positive integer, got 0"),
        ({"ref_batch_size": 65, "max_batch": 128, "policy": "error"}, "global_batch_size 65 does not split evenly"),
    ],
)
def test_bad_settings_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GoodputController(32, 2, **kwargs)


def test_bad_timings_and_states_are_refused():
    model = ThroughputModel()
    for bad in (0, -1.0, math.nan, math.inf, True):
        with pytest.raises(ValueError, match="seconds must be a positive finite duration"):
            model.observe(8, 1, bad)
    with pytest.raises(ValueError, match="no update timed yet"):
        model.coefficients()
    c = GoodputController(64, ref_batch_size=64, max_batch=512)
    before = c.state_dict()
    with pytest.raises(ValueError):
        c.load_state_dict({**before, "batches": [64, "x"]})
    assert c.state_dict() == before


def test_the_plan_is_aikits():
    c = GoodputController(48, 3, ref_batch_size=96, max_batch=1000)
    assert c.plan(256) == make_plan(256, 48, 3)


def test_policy_error_evaluates_only_the_batches_that_split_evenly():
    """Keras feeds equal micro-batches: with policy "error" a batch that does not split evenly
    over the devices is no candidate (evaluating it would raise instead of proposing)."""
    c = GoodputController(32, 2, ref_batch_size=64, max_batch=256, policy="error", **EVERY_UPDATE)
    found = c.candidates().tolist()
    # 66 = 2 devices x 2 steps x 16.5, 130 = 2 x 3 x 21.7: uneven; 68 and 132 split evenly
    assert 66 not in found and 68 in found and 130 not in found and 132 in found
    assert all(c.plan(b).is_even for b in found)
    for batch in (64, 128, 256):
        c.batch = batch
        c.observe(0.01 * batch + 0.2, NoiseEstimate(grad_sq=1.0, trace=1000.0))
    c.batch = 64
    assert c.propose() in found


def test_an_untimed_update_or_one_at_another_batch_is_recorded_as_it_ran():
    c = GoodputController(64, ref_batch_size=64, max_batch=512)
    c.observe(None, NoiseEstimate(grad_sq=1.0, trace=1e4))  # compiled: not timed
    assert c.batches == [64] and c.throughput.configurations == 0 and c.propose() is None
    c.observe(0.5, None, batch=32)  # an epoch's shorter last update
    assert c.batches == [64, 32] and c.batch == 64
    assert c.throughput.state_dict()["times"] == [[32, 1, [0.5]]]
    with pytest.raises(ValueError, match="batch must be a positive integer, got 0"):
        c.observe(0.5, batch=0)


@pytest.mark.parametrize("noise_every, noise_until", [(None, None), (4, None), (3, 7), (1, 0)])
def test_an_epochs_last_update_takes_what_its_split_can_run(noise_every, noise_until):
    """``BatchSplit.largest`` (one update, no arrays: asked twice an update) splits every update
    as the schedule's ``split_minimums`` does: two micro-batches where it measures the noise."""
    split = BatchSplit(per_device=8, devices=1, grows=True, noise_every=noise_every, noise_until=noise_until)
    for update in range(12):
        least = int(split_minimums(update, update + 1, 1, noise_every, noise_until)[0])
        for left in (1, 2, 3, 15, 16, 17, 31, 33, 40):
            assert split.largest(left, update) == largest_even_batch(left, 8, 1, least), (update, left)
