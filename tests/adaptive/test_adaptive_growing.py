"""The adaptive batch with a per-device batch that grows (``max_device_batch``, as AdaptDL's):
every update is one even split of its batch, equals the big-batch step, replays bit for bit with
``CustomSampler(max_device_batch=...)``, measures the noise of one-part updates against the
previous update's gradient, and resumes through ElasticState to the same bits."""

from __future__ import annotations

import pytest
import torch
from adaptive_common import Clock, big_batch_history, dataset, loss_of, make_model, train
from test_adaptive_torch import assert_replays, with_weights

from aikit.core.gradient_noise import estimate
from aikit.elastic.Torch import (
    AdaptiveOptimizer,
    AdaptiveSampler,
    CustomSampler,
    ElasticState,
    LinearRuleMomentumOptimizer,
    LinearRuleOptimizer,
)

DEVICE, BASE, MAX = 16, 8, 64


def growing(data, model, rule="linear", clock=None, **options):
    sampler = AdaptiveSampler(data, base_batch=BASE, max_batch=MAX, max_device_batch=DEVICE, seed=5, **options)
    optimizer = AdaptiveOptimizer(torch.optim.SGD(model.parameters(), lr=0.02), sampler, rule, clock=clock or Clock())
    return sampler, optimizer


@pytest.fixture(scope="module")
def run():
    data, model = dataset(), make_model()
    start = [p.detach().clone() for p in model.parameters()]
    clock = Clock()
    sampler, optimizer = growing(data, model, clock=clock)
    history, samples = train(model, data, 3, sampler=sampler, optimizer=optimizer, clock=clock)
    return data, start, sampler, optimizer, history, samples


def test_the_per_device_batch_grows_with_the_batch_in_even_micro_batches(run):
    _, _, sampler, _, _, samples = run
    batches = sampler.controller.batches
    assert batches[0] == BASE and max(batches) > DEVICE  # grown past one device's batch: accumulating
    sizes = {}
    for epoch, update, ids in samples:
        sizes.setdefault((epoch, update), []).append(len(ids))
    for (epoch, update), micro in sizes.items():
        batch = sum(micro)
        steps = -(-batch // DEVICE)  # the fewest micro-batches that fit one device
        assert micro == [batch // steps] * steps, (epoch, update, micro)
    assert len({m for micro in sizes.values() for m in micro}) > 2  # the micro-batch changed with the batch


def test_every_update_equals_the_big_batch_step(run):
    data, start, sampler, _, history, _ = run
    steps = []
    for epoch in range(3):
        plan = sampler.schedule.epoch(epoch)
        steps += [(plan.step_indices(step), 0.02 * int(plan.batch_sizes[step]) / BASE) for step in range(len(plan))]
    expected = big_batch_history(with_weights(make_model(), start), data, steps)
    assert len(history) == len(expected) == len(sampler.controller.batches)
    for got, want in zip(history, expected, strict=True):
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


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
    replay = CustomSampler(data, str(tmp_path / "trace.csv"), seed=5, max_device_batch=DEVICE)
    optimizer = LinearRuleOptimizer(torch.optim.SGD(model.parameters(), lr=0.02), replay, ref_batchsize=BASE)
    assert_replays(history, model, data, replay, optimizer, epochs=3)


def test_a_one_part_update_measures_the_noise_against_the_previous_update():
    data, model, clock = dataset(), make_model(), Clock()
    start = [p.detach().clone() for p in model.parameters()]
    sampler, optimizer = growing(data, model, rule="adascale", clock=clock)  # grows 8 -> 14: two one-part sizes
    estimates = {}
    record = optimizer.controller.noise.update
    optimizer.controller.noise.update = lambda noise: (
        estimates.__setitem__(len(optimizer.controller.batches), noise), record(noise))  # update -> raw estimate
    history, _ = train(model, data, 2, sampler=sampler, optimizer=optimizer, clock=clock)
    plans, x, y = [sampler.schedule.epoch(e) for e in range(2)], *data.tensors
    indices = [plan.step_indices(step) for plan in plans for step in range(len(plan))]
    pairs = [u for u in range(1, len(indices)) if max(len(indices[u - 1]), len(indices[u])) <= DEVICE]
    assert any(len(indices[u - 1]) != len(indices[u]) for u in pairs)  # unequal parts too
    model = make_model()

    def gradient(update):  # the update's mean gradient, at the parameters it started from
        with_weights(model, history[update - 1] if update else start).zero_grad()
        index = torch.as_tensor(indices[update])
        loss_of(model, x[index], y[index]).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()]), len(index)

    assert 0 not in estimates  # the first update has no previous one
    for update in pairs:
        (before, b0), (now, b1) = gradient(update - 1), gradient(update)
        want = estimate([float(before.square().sum()), float(now.square().sum())], [b0, b1],
                        float(((b0 * before + b1 * now) / (b0 + b1)).square().sum()))
        got = estimates[update]
        assert (got.grad_sq, got.trace) == pytest.approx((want.grad_sq, want.trace), rel=1e-9)


def test_an_adascale_run_resumes_to_the_same_bits(tmp_path):
    data, model, clock = dataset(), make_model(), Clock()
    sampler, optimizer = growing(data, model, rule="adascale", clock=clock)
    full, _ = train(model, data, 2, sampler=sampler, optimizer=optimizer, clock=clock)
    batches = list(sampler.controller.batches)
    stop = len(batches) // 2
    assert batches[stop - 1] <= DEVICE and len(set(batches[stop:])) > 1  # the state holds a previous gradient

    model, clock = make_model(), Clock()
    sampler, optimizer = growing(data, model, rule="adascale", clock=clock)
    state = ElasticState(tmp_path, model=model, optimizer=optimizer, verbose=False)

    def commit_at():
        if len(sampler.controller.batches) == stop and optimizer.micro == 0 and not state.commits:
            state.commit()

    train(model, data, 2, sampler=sampler, optimizer=optimizer, clock=clock, after_step=commit_at)
    model, clock_2 = make_model(seed=9), Clock()
    clock_2.now = clock.now
    sampler, optimizer = growing(data, model, rule="adascale", clock=clock_2)
    state = ElasticState(tmp_path, model=model, optimizer=optimizer, verbose=False)
    assert state.restore()
    rest, _ = train(model, data, 2, sampler=sampler, optimizer=optimizer, clock=clock_2)
    assert sampler.controller.batches == batches
    for got, want in zip(rest, full[stop:], strict=True):
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize(("options", "message"), [
    ({"base_batch": 17}, r"base_batch=17: every update is split evenly over the replicas; .*use 16 or 18"),
    ({"max_batch": 67}, r"max_batch=67: every update is split evenly .*use 65 or 70"),
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
