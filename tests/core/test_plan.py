"""The elastic plan: seed 002's table, the two rules the original broke, the uneven policies."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aikit.core.plan import even_micro_batches, even_split_problems, largest_even_batch, make_plan


@pytest.mark.parametrize(
    ("gpus", "steps", "batch_size"),
    [(1, 4, 64), (2, 2, 64), (4, 1, 64), (8, 1, 32)],
)
def test_seed_002_table(gpus, steps, batch_size):
    plan = make_plan(256, 64, gpus)
    assert (plan.steps, plan.batch_size, plan.gpus, plan.global_batch_size) == (steps, batch_size, gpus, 256)
    assert plan.is_even


@pytest.mark.parametrize(("g", "m", "n"), [(256, 64, 3), (100, 30, 1), (4, 1, 8), (10, 1, 8), (97, 10, 3)])
@pytest.mark.parametrize("policy", ["ragged", "fewer_devices"])
def test_uneven_cases_keep_both_rules(g, m, n, policy):
    plan = make_plan(g, m, n, policy=policy)
    assert sum(map(sum, plan.micro_batch_sizes)) == g  # the global batch is exact
    assert plan.batch_size <= m  # no device over its limit
    assert plan.gpus <= n


def test_ragged_default_uses_every_device_at_fewest_steps():
    plan = make_plan(256, 64, 3)  # the Run:AI original gave 85 per GPU and a global batch of 255
    assert plan.policy == "ragged"
    assert plan.micro_batch_sizes == ((43, 43, 43), (43, 42, 42))
    assert plan.step_batch_sizes == (129, 127)
    assert [plan.share(s, d) for s in range(2) for d in range(3)] == [43 / 256] * 4 + [42 / 256] * 2


def test_g100_m30_on_one_device_splits_evenly_in_four_steps():
    plan = make_plan(100, 30, 1)  # the original gave 3 steps of 33 = 99
    assert (plan.steps, plan.batch_size, plan.is_even) == (4, 25, True)


def test_fewer_devices_uses_an_even_split():
    plan = make_plan(256, 64, 3, policy="fewer_devices")
    assert (plan.gpus, plan.steps, plan.batch_size, plan.available_gpus) == (2, 2, 64, 3)


def test_error_policy_names_the_nearest_even_batches():
    with pytest.raises(ValueError, match=r"global_batch_size 256 .* use global_batch_size 252 or 258"):
        make_plan(256, 64, 3, policy="error")


def test_more_devices_than_samples_leaves_the_extra_devices_out():
    plan = make_plan(4, 1, 8)  # the original gave a batch size of 0
    assert (plan.gpus, plan.steps, plan.batch_size) == (4, 1, 1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 64), "global_batch_size must be a positive integer, got 0"),
        ((256, -1), "max_device_batch must be a positive integer, got -1"),
        ((256.0, 64), "global_batch_size must be a positive integer, got 256.0"),
        ((256, 64, 0), "gpus must be a positive integer, got 0"),
        ((256, True), "max_device_batch must be a positive integer, got True"),
        (("256", 64), "global_batch_size must be a positive integer, got '256'"),
    ],
)
def test_bad_numbers_are_refused_by_name(args, message):
    with pytest.raises(ValueError, match=message):
        make_plan(*args)


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="policy must be one of"):
        make_plan(256, 64, 2, policy="round")


def test_master_is_rank_zero_only():
    assert make_plan(256, 64, 2, rank=0).master
    assert not make_plan(256, 64, 2, rank=1).master


def test_summary_states_the_plan():
    text = make_plan(256, 64, 3).summary()
    assert "3 used of 3" in text and "GA steps per update: 2" in text and "[43, 42, 42]" in text


@given(
    g=st.integers(1, 5000),
    m=st.integers(1, 600),
    n=st.integers(1, 16),
    policy=st.sampled_from(["ragged", "fewer_devices"]),
)
def test_every_plan_is_exact_and_within_limits(g, m, n, policy):
    plan = make_plan(g, m, n, policy=policy)
    sizes = [s for step in plan.micro_batch_sizes for s in step]
    assert sum(sizes) == g
    assert max(sizes) <= m
    assert 1 <= plan.gpus <= n
    assert all(sum(step) > 0 for step in plan.micro_batch_sizes)  # no step without samples
    if policy == "fewer_devices":
        assert plan.is_even
    else:
        assert max(sizes) - min(sizes) <= 1  # ragged by at most one sample
        assert plan.steps == -(-g // (plan.gpus * m))  # the fewest sequential steps possible
        assert abs(sum(plan.share(s, d) for s in range(plan.steps) for d in range(plan.gpus)) - 1) < 1e-9
        device_totals = [sum(plan.device_batch_sizes(d)) for d in range(plan.gpus)]
        assert max(device_totals) - min(device_totals) <= 1  # balanced work per update


@given(g=st.integers(1, 5000), m=st.integers(1, 600), n=st.integers(1, 16))
def test_error_policy_accepts_exactly_the_even_splits(g, m, n):
    ragged = make_plan(g, m, n)
    if ragged.is_even:
        strict = make_plan(g, m, n, policy="error")
        assert strict.micro_batch_sizes == ragged.micro_batch_sizes
    else:
        with pytest.raises(ValueError, match="does not split evenly"):
            make_plan(g, m, n, policy="error")


@given(b=st.integers(1, 3000), m=st.integers(1, 300), n=st.integers(1, 12), least=st.integers(1, 4))
def test_an_even_split_is_exact_within_the_bound_with_the_fewest_micro_batches(b, m, n, least):
    micro = int(even_micro_batches([b], m, n, least)[0])
    fewest = max(-(-least // n), -(-b // (n * m)))  # GA steps: fewer would overfill a device or the minimum
    if micro:
        steps = b // (n * micro)
        assert steps * n * micro == b and micro <= m and steps * n >= least  # exact, within bounds
        assert steps == fewest
    else:
        assert b % (n * fewest) != 0  # no even split at the fewest steps
        assert even_split_problems([b], m, n, least)  # and the reason is given


@given(limit=st.integers(0, 2000), m=st.integers(1, 100), n=st.integers(1, 8), least=st.integers(1, 3))
def test_the_largest_even_batch_is_the_largest_below_the_limit(limit, m, n, least):
    found = largest_even_batch(limit, m, n, least)
    assert found <= limit and (found == 0 or even_micro_batches([found], m, n, least)[0] > 0)
    above = range(found + 1, limit + 1)
    assert not even_micro_batches(list(above), m, n, least).any() if above else True


def test_an_uneven_batch_is_refused_naming_the_nearest_even_ones():
    assert even_split_problems([67, 64], 16, 1) == [
        "row 0 (step 0): batch size 67 does not split evenly over 1 replica(s) in micro-batches of at most "
        "max_device_batch 16; use 65 or 70"]
