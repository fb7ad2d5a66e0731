"""The schedule's guarantees: exact global batches, disjoint replicas, no repeats, defined ends."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aikit.core.schedule import Schedule
from aikit.core.trace import Trace, TraceExhaustedError


@st.composite
def schedules(draw, policy=None):
    mb = draw(st.integers(1, 8))
    replicas = draw(st.integers(1, 5))
    dataset = draw(st.integers(mb * 4, 400))
    sizes = draw(st.lists(st.integers(1, dataset // mb).map(lambda k: k * mb), min_size=1, max_size=60))
    when = policy or draw(st.sampled_from(["error", "stop", "repeat_last", "cycle"]))
    return Schedule(Trace(sizes, when), dataset, replicas, mb, seed=draw(st.integers(0, 2**31)))


def epochs_of(schedule, limit=6):
    """The epochs a user can train: every full one (up to ``limit``) and a 'stop' tail."""
    found = []
    for e in range(limit):
        try:
            found.append(schedule.epoch(e))
        except TraceExhaustedError:
            break
    return found


@settings(max_examples=150, deadline=None)
@given(schedules())
def test_replicas_split_each_step_exactly_and_disjointly(schedule):
    for epoch in epochs_of(schedule):
        for step in range(len(epoch)):
            parts = [
                np.concatenate(epoch.micro_batches(step, r) or [np.empty(0, int)]) for r in range(schedule.num_replicas)
            ]
            joined = np.concatenate(parts)
            assert len(joined) == epoch.batch_sizes[step] == len(set(joined.tolist()))
            assert sorted(joined.tolist()) == sorted(epoch.step_indices(step).tolist())
            for r in range(schedule.num_replicas):
                batches = epoch.micro_batches(step, r)
                assert len(batches) == epoch.counts(r)[step] <= epoch.micro_steps[step]
                assert all(len(b) == schedule.micro_batch for b in batches)  # static shapes


@settings(max_examples=150, deadline=None)
@given(schedules())
def test_no_sample_repeats_within_an_epoch_and_steps_follow_the_trace(schedule):
    next_step = 0
    for epoch in epochs_of(schedule):
        used = np.concatenate([epoch.step_indices(s) for s in range(len(epoch))])
        assert len(used) == len(set(used.tolist())) == epoch.samples <= schedule.dataset_size
        assert epoch.first_step == next_step  # every trace step once, in order
        assert epoch.batch_sizes.tolist() == schedule.trace.window(next_step, next_step + len(epoch)).tolist()
        next_step += len(epoch)
        if epoch.complete:  # what is left out could not hold the next step
            following = (
                schedule.trace.window(next_step, next_step + 1)[0]
                if (not schedule.trace.is_finite or next_step < len(schedule.trace))
                else None
            )
            assert following is None or epoch.samples + following > schedule.dataset_size


@settings(max_examples=100, deadline=None)
@given(schedules())
def test_zero_weight_replicas_and_weights(schedule):
    for epoch in epochs_of(schedule, 2):
        counts = np.stack([epoch.counts(r) for r in range(schedule.num_replicas)])
        assert (counts.sum(axis=0) == epoch.micro_batches_per_step).all()
        assert (counts.max(axis=0) - counts.min(axis=0) <= 1).all()  # replicas differ by at most one
        for step in range(len(epoch)):
            # a micro-batch's weight times all micro-batches is the whole update
            assert epoch.share(step) * epoch.micro_batches_per_step[step] == pytest.approx(1.0)


def test_a_replica_without_a_micro_batch_is_marked_not_fed_a_dummy():
    epoch = Schedule([32, 96], 128, num_replicas=4, micro_batch=32).epoch(0)
    assert [epoch.counts(r).tolist() for r in range(4)] == [[1, 1], [0, 1], [0, 1], [0, 0]]
    assert epoch.micro_batches(0, 3) == [] and epoch.micro_batches(1, 3) == []
    assert epoch.micro_steps.tolist() == [1, 1]


def test_every_replica_sees_the_same_permutation_and_epochs_differ():
    a = Schedule([64] * 10, 640, 2, 32, seed=7)
    b = Schedule([64] * 10, 640, 2, 32, seed=7)
    assert (a.epoch(0).order == b.epoch(0).order).all()
    assert not (a.epoch(0).order == Schedule([64] * 20, 640, 2, 32, seed=7).epoch(1).order).all()
    assert Schedule([64] * 10, 640, 2, 32, shuffle=False).epoch(0).step_indices(1).tolist() == list(range(64, 128))


def test_epoch_ends_pack_whole_steps():
    schedule = Schedule([64, 64, 128, 256, 64], 300, 2, 32)
    first, second = schedule.epoch(0), schedule.epoch(1)
    assert first.batch_sizes.tolist() == [64, 64, 128]  # 256 more would overflow 300: next epoch
    assert second.first_step == 3 and second.batch_sizes.tolist() == [256]
    assert schedule.full_epochs() == 2


def test_trace_end_error_names_the_fix_and_is_not_an_index_error():
    schedule = Schedule([64, 64, 128, 256, 64], 300, 2, 32)
    with pytest.raises(TraceExhaustedError, match=r"epoch 2 needs steps past the end .* covers 2 full epochs") as err:
        schedule.epoch(2)
    assert not isinstance(err.value, IndexError)
    assert "when_exhausted='stop'" in str(err.value)


def test_stop_trains_the_partial_last_epoch_then_ends():
    schedule = Schedule(Trace([64, 64, 128, 256, 64], "stop"), 300, 2, 32)
    tail = schedule.epoch(2)
    assert (tail.complete, tail.first_step, tail.batch_sizes.tolist()) == (False, 4, [64])
    with pytest.raises(TraceExhaustedError):
        schedule.epoch(3)


def test_a_trace_that_fills_its_last_epoch_exactly_has_no_partial_epoch():
    schedule = Schedule(Trace([100, 200, 300], "stop"), 300, 1, 100)
    assert schedule.full_epochs() == 2
    with pytest.raises(TraceExhaustedError):
        schedule.epoch(2)


def test_repeating_traces_never_end():
    schedule = Schedule(Trace([64, 128], "cycle"), 256, 2, 32)
    assert schedule.full_epochs() == float("inf")
    assert schedule.epoch(50).samples <= 256


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"trace": [64, 100]},
            r"row 1 \(step 1\): batch size 100 is not a multiple of minibatch_size 32; use 96 or 128",
        ),
        (
            {"trace": [64, 96], "balanced": True, "num_replicas": 2},
            r"row 1 \(step 1\): batch size 96 is not a multiple of minibatch_size x num_replicas 64",
        ),
        ({"trace": [64, 640]}, r"row 1 \(step 1\): batch size 640 is larger than the data set \(300 samples\)"),
        ({"trace": [64], "dataset_size": 0}, "dataset_size must be a positive integer, got 0"),
        ({"trace": [64], "num_replicas": -2}, "num_replicas must be a positive integer, got -2"),
    ],
)
def test_bad_settings_are_refused_with_the_row(kwargs, message):
    settings_ = {"dataset_size": 300, "micro_batch": 32, "micro_name": "minibatch_size", **kwargs}
    with pytest.raises(ValueError, match=message):
        Schedule(**settings_)


def test_bad_epoch_number():
    with pytest.raises(ValueError, match="epoch must be a non-negative integer, got -1"):
        Schedule([64], 300, 1, 32).epoch(-1)


@st.composite
def growing_schedules(draw):
    """Schedules whose micro-batch is each step's even split under ``max_device_batch``."""
    from aikit.core.plan import largest_even_batch

    device, replicas = draw(st.integers(1, 40)), draw(st.integers(1, 4))
    noise_every = draw(st.sampled_from([None, 1, 3]))
    dataset = draw(st.integers(8 * replicas, 500))
    sizes = [largest_even_batch(b, device, replicas, 2) for b in
             draw(st.lists(st.integers(2 * replicas, dataset), min_size=1, max_size=30))]
    return Schedule(Trace(sizes, "stop"), dataset, replicas, seed=draw(st.integers(0, 2**31)),
                    max_device_batch=device, noise_every=noise_every)


@given(growing_schedules())
@settings(max_examples=60, deadline=None)
def test_a_growing_micro_batch_splits_each_step_evenly_in_the_fewest_micro_batches(schedule):
    device, replicas = schedule.max_device_batch, schedule.num_replicas
    plan = schedule.epoch(0)
    for step in range(len(plan)):
        batches = [b for r in range(replicas) for b in plan.micro_batches(step, r)]
        dealt = np.sort(np.concatenate(batches))
        assert np.array_equal(dealt, np.sort(plan.step_indices(step)))  # exactly the step's samples
        size, micro = int(plan.batch_sizes[step]), plan.micro_size(step)
        least = 2 if schedule.noise_every and (plan.first_step + step) % schedule.noise_every == 0 else 1
        fewest = max(-(-least // replicas), -(-size // (replicas * device)))
        assert {len(b) for b in batches} == {micro} and micro <= device
        assert len(batches) == fewest * replicas  # the fewest steps, the same on every replica
        assert plan.share(step) == micro / size


def test_a_step_that_cannot_split_evenly_is_refused_naming_the_nearest():
    with pytest.raises(ValueError, match=r"row 1 \(step 1\): batch size 7 does not split evenly .*use 6 or 8"):
        Schedule([8, 7], 100, 1, max_device_batch=4)
    # 7 fits one pass of 8, but every second step (0, 2, ...) is split in two; a repeating trace may put it there
    Schedule(Trace([8, 7], "stop"), 100, 1, max_device_batch=8, noise_every=2)
    with pytest.raises(ValueError, match=r"batch size 7 .* \(2 or more in all\); use 6 or 8"):
        Schedule(Trace([8, 7], "cycle"), 100, 1, max_device_batch=8, noise_every=2)
    with pytest.raises(ValueError, match="noise_every splits steps that max_device_batch would run whole"):
        Schedule([8], 100, 1, 4, noise_every=2)
