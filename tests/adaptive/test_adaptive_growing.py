"""The adaptive batch with a per-device batch that grows (``max_device_batch``, as AdaptDL's):
every update is one even split of its batch, every fourth in two halves at least so that one
device measures the noise, equals the big-batch step, replays bit for bit with
``CustomSampler(max_device_batch=..., noise_every=...)``, and resumes through ElasticState to
the same bits."""

from __future__ import annotations

import pytest
import torch
from adaptive_common import (
    Clock,
    adaptive_pair,
    assert_big_batch_updates,
    assert_replays,
    dataset,
    make_model,
    recorded_run,
    train,
    with_weights,
)

from aikit.autolrs.Torch import ReplaySchedule
from aikit.elastic.Torch import (
    AdaptiveSampler,
    ConstantOptimizer,
    CustomSampler,
    ElasticState,
    LinearRuleMomentumOptimizer,
    LinearRuleOptimizer,
)
from aikit.ga.Torch.optim import UpdateScheduler

DEVICE, BASE, MAX = 16, 8, 64


def growing(data, model, rule="linear", clock=None, **options):
    return adaptive_pair(data, model, rule, clock, base_batch=BASE, max_batch=MAX, max_device_batch=DEVICE, **options)


@pytest.fixture(scope="module")
def run():
    return recorded_run(lambda data, model, clock: growing(data, model, clock=clock, min_estimates=5))


def test_the_per_device_batch_grows_with_the_batch_in_even_micro_batches(run):
    _, _, sampler, _, _, samples = run
    batches = sampler.controller.batches
    assert batches[0] == BASE and max(batches) > DEVICE  # grown past one device's batch: accumulating
    sizes = {}
    for epoch, update, ids in samples:
        sizes.setdefault((epoch, update), []).append(len(ids))
    for (epoch, update), micro in sizes.items():
        batch = sum(micro)
        steps = max(-(-batch // DEVICE), 2 if update % 4 == 0 else 1)  # the fewest that fit (two to measure)
        assert micro == [batch // steps] * steps, (epoch, update, micro)
    assert len({m for micro in sizes.values() for m in micro}) > 2  # the micro-batch changed with the batch


def test_every_update_equals_the_big_batch_step(run):
    data, start, sampler, _, history, _ = run
    assert_big_batch_updates(data, start, sampler, history, BASE, epochs=3)


def test_every_epoch_trains_each_sample_once_and_leaves_out_fewer_than_its_last_split(run):
    data, _, sampler, _, _, samples = run
    for epoch in range(3):
        seen = [i for e, _, ids in samples if e == epoch for i in ids]
        plan = sampler.schedule.epoch(epoch)
        assert len(seen) == len(set(seen)) == plan.samples
        assert len(data) - plan.samples < -(-MAX // DEVICE)  # what no even split of the rest could take


def test_the_trace_replays_the_run_bit_for_bit_with_max_device_batch(run, tmp_path):
    data, start, sampler, _, history, _ = run
    sampler.write_trace(tmp_path / "trace.csv")
    model = with_weights(make_model(), start)
    replay = CustomSampler(data, str(tmp_path / "trace.csv"), seed=5, max_device_batch=DEVICE, noise_every=4)
    optimizer = LinearRuleOptimizer(torch.optim.SGD(model.parameters(), lr=0.02), replay, ref_batchsize=BASE)
    assert_replays(history, model, data, replay, optimizer, epochs=3)


def test_one_device_measures_the_noise_on_every_update_of_two_parts_or_more(run):
    _, _, _, optimizer, _, samples = run
    parts = {}
    for _, update, _ in samples:
        parts[update] = parts.get(update, 0) + 1
    measured = [u for u in range(len(parts)) if parts[u] >= 2]
    assert {u for u in parts if u % 4 == 0} <= set(measured) < set(parts)  # one-part updates in between
    assert optimizer.controller.noise.updates == len(measured)


@pytest.mark.parametrize("hold_after", [None, 400])
def test_an_adascale_run_resumes_to_the_same_bits(tmp_path, hold_after):
    """Through ElasticState, from the middle of the run: where it holds its batch (after 400
    samples, past the resume), the resumed run holds at the same update."""
    data, model, clock = dataset(), make_model(), Clock()
    sampler, optimizer = growing(data, model, rule="adascale", clock=clock, min_estimates=5, hold_after=hold_after)
    full, _ = train(model, data, 2, sampler=sampler, optimizer=optimizer, clock=clock)
    batches, held_from = list(sampler.controller.batches), sampler.schedule.held_from
    stop = len(batches) // 2
    if hold_after is None:
        assert len(set(batches[stop:])) > 1  # a change after the resume
    else:
        assert stop < held_from < len(batches)  # the hold after the resume

    model, clock = make_model(), Clock()
    sampler, optimizer = growing(data, model, rule="adascale", clock=clock, min_estimates=5, hold_after=hold_after)
    state = ElasticState(tmp_path, model=model, optimizer=optimizer, verbose=False)

    def commit_at():
        if len(sampler.controller.batches) == stop and optimizer.micro_step == 0 and not state.commits:
            state.commit()

    train(model, data, 2, sampler=sampler, optimizer=optimizer, clock=clock, after_step=commit_at)
    model, clock_2 = make_model(seed=9), Clock()
    clock_2.now = clock.now
    sampler, optimizer = growing(data, model, rule="adascale", clock=clock_2, min_estimates=5, hold_after=hold_after)
    state = ElasticState(tmp_path, model=model, optimizer=optimizer, verbose=False)
    assert state.restore()
    rest, _ = train(model, data, 2, sampler=sampler, optimizer=optimizer, clock=clock_2)
    assert sampler.controller.batches == batches and sampler.schedule.held_from == held_from
    for got, want in zip(rest, full[stop:], strict=True):
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


HOLD = 300  # samples: the hold comes in epoch 1 of the 256-sample data set, after the batch has grown


@pytest.fixture(scope="module")
def held_run():
    return recorded_run(lambda data, model, clock: growing(data, model, "adascale", clock=clock, min_estimates=5,
                                                           hold_after=HOLD))


def test_a_held_run_keeps_its_batch_measures_nothing_and_replays_with_noise_until(held_run, tmp_path):
    data, start, sampler, optimizer, history, samples = held_run
    schedule, batches = sampler.schedule, sampler.controller.batches
    held = schedule.held_from
    assert held is not None and sum(batches[:held]) >= HOLD > sum(batches[:held - 1])
    assert len(set(batches[:held])) > 1  # it decided before the hold
    ends = {start - 1 for start in schedule.starts[1:]}  # an epoch's last update takes what is left
    assert {b for update, b in enumerate(batches) if update >= held and update not in ends} == {batches[held]}
    parts = {}
    for _, update, _ in samples:
        parts[update] = parts.get(update, 0) + 1
    assert all(parts[u] == -(-batches[u] // DEVICE) for u in parts if u >= held)  # none split to measure
    measured = [u for u in parts if parts[u] >= 2 and u < held]
    assert optimizer.controller.noise.updates == len(measured)
    assert len({row["lr"] for row in optimizer.history[held + 1:] if row["batch_size"] == batches[held]}) == 1

    sampler.write_trace(tmp_path / "trace.csv")
    optimizer.write_lr_schedule(tmp_path / "lr.csv")
    model = with_weights(make_model(), start)
    replay = CustomSampler(data, str(tmp_path / "trace.csv"), seed=5, max_device_batch=DEVICE, noise_every=4,
                           noise_until=held)
    constant = ConstantOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), replay)
    scheduler = UpdateScheduler(ReplaySchedule(constant, tmp_path / "lr.csv"))
    assert_replays(history, model, data, replay, constant, epochs=3, scheduler=scheduler)


@pytest.mark.parametrize(("options", "message"), [
    ({"base_batch": 17}, r"base_batch=17: every update is split evenly over the replicas; .*use 16 or 18"),
    ({"max_batch": 67}, r"max_batch=67: every update is split evenly .*use 65 or 70"),
    ({"base_batch": 15}, r"base_batch=15: every update is split evenly over the replicas, every 4th in two or "
                         r"more; .*use 14 or 16"),
    ({"micro_batch": 4}, r"give micro_batch \(fixed, static shapes\) or max_device_batch .*one of them"),
])
def test_bad_settings_are_refused_naming_the_fix(options, message):
    settings = {"base_batch": BASE, "max_batch": MAX, "max_device_batch": DEVICE, **options}
    with pytest.raises(ValueError, match=message):
        AdaptiveSampler(dataset(), **settings)


def test_replay_refuses_optimizers_that_scale_from_one_fixed_micro_batch():
    sampler = CustomSampler(48, [16, 32], max_device_batch=16, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match=r"micro-batch varies by step \(max_device_batch\): .*minibatch_size"):
        LinearRuleMomentumOptimizer(torch.optim.SGD(make_model().parameters(), lr=0.1), sampler, 16)
    with pytest.raises(ValueError, match=r"give minibatch_size .* or max_device_batch .*not both"):
        CustomSampler(64, [16, 32], minibatch_size=8, max_device_batch=16)


@pytest.mark.parametrize("replicas", [1, 2])
def test_epoch_views_grown_update_by_update_equal_the_views_built_at_once(replicas):
    """The views an adaptive run reads after every update are appended to, not rebuilt (an epoch
    of tens of thousands of updates would cost its length each update): they must hold exactly
    what a schedule loaded from the run's state builds in one go, and refuse writes."""
    settings = dict(base_batch=8, max_batch=64, max_device_batch=16, num_replicas=replicas, rank=0, seed=1)
    sampler = AdaptiveSampler(1000, **settings)
    schedule, seen = sampler.schedule, []
    for done in range(1, 300):
        if done % 37 == 0:  # the controller changes its batch now and then, mid-epoch
            schedule.controller.batch = [24, 64, 48, 8][done // 37 % 4]  # batches it can propose
        schedule.extend(done)
        for epoch in range(max(0, len(schedule.starts) - 2), len(schedule.starts)):
            view = schedule.epoch(epoch)
            seen.append((epoch, view.batch_sizes.copy(), view.micro_sizes.copy()))
    assert len(schedule.starts) >= 4 and len(set(schedule.sizes)) >= 4  # several epochs and batches
    with pytest.raises(ValueError, match="read-only"):
        schedule.epoch(0).batch_sizes[0] = 2

    fresh = AdaptiveSampler(1000, **settings)
    fresh.schedule.load(*fresh.schedule.checked(schedule.state_dict()))
    for epoch, sizes, micro in seen:
        whole = fresh.schedule.epoch(epoch)
        assert sizes.tolist() == whole.batch_sizes[: len(sizes)].tolist()
        assert micro.tolist() == whole.micro_sizes[: len(micro)].tolist()
        assert (sizes % (replicas * micro) == 0).all()  # each an even split over the replicas
