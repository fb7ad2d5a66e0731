"""The adaptive batch in one process: every update equals the big-batch step over its samples
across plan changes, every sample of an epoch is trained once, the batches replay bit for bit
with CustomSampler and a trace optimizer, DataLoader prefetching cannot move a change, and a
run resumes through ElasticState to the same bits."""

from __future__ import annotations

import logging

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
from aikit.core.gradient_noise import gain
from aikit.elastic.Torch import (
    AdaptiveOptimizer,
    AdaptiveSampler,
    ConstantOptimizer,
    CustomSampler,
    ElasticState,
    LinearRuleOptimizer,
    RootRuleOptimizer,
)
from aikit.ga.Torch.optim import UpdateScheduler

MICRO, BASE, MAX = 4, 8, 64


def adaptive(data, model, rule="linear", lookahead=0, clock=None, **options):
    return adaptive_pair(data, model, rule, clock, base_batch=BASE, max_batch=MAX, micro_batch=MICRO,
                         lookahead=lookahead, **options)


@pytest.fixture(scope="module")
def run():
    return recorded_run(adaptive)


def test_the_controller_changes_the_plan_and_logs_each_change(caplog):
    data, model, clock = dataset(), make_model(), Clock()
    sampler, optimizer = adaptive(data, model, clock=clock)
    with caplog.at_level(logging.INFO, logger="aikit.adaptive"):
        train(model, data, 1, sampler=sampler, optimizer=optimizer, clock=clock)
    changes = sampler.controller.changes
    assert changes and len(set(sampler.controller.batches)) > 1
    lines = [r.getMessage() for r in caplog.records if r.name == "aikit.adaptive"]
    assert len(lines) == len(changes)
    for (update, old, new, _), line in zip(changes, lines, strict=True):
        assert f"update {update - 1}: global batch {old} -> {new} from update {update}" in line


def test_every_update_equals_the_big_batch_step_across_plan_changes(run):
    data, start, sampler, _, history, _ = run
    assert len(set(sampler.controller.batches)) > 2  # several plans
    assert_big_batch_updates(data, start, sampler, history, BASE, epochs=3)


def test_every_sample_of_an_epoch_is_trained_exactly_once(run):
    data, _, sampler, _, _, samples = run
    for epoch in range(3):
        seen = [i for e, _, ids in samples if e == epoch for i in ids]
        assert sorted(seen) == list(range(len(data)))  # 256 samples, micro-batches of 4: none left out
        plan = sampler.schedule.epoch(epoch)
        assert plan.complete and plan.samples == len(data)


def test_the_trace_replays_the_run_bit_for_bit(run, tmp_path):
    data, start, sampler, _, history, _ = run
    sampler.write_trace(tmp_path / "trace.csv")
    model = with_weights(make_model(), start)
    replay = CustomSampler(data, str(tmp_path / "trace.csv"), minibatch_size=MICRO, seed=5)
    optimizer = LinearRuleOptimizer(torch.optim.SGD(model.parameters(), lr=0.02), replay, ref_batchsize=BASE)
    assert_replays(history, model, data, replay, optimizer, epochs=3)


def test_the_lr_follows_the_rule():
    data = dataset()
    for rule, factor in (("sqrt", lambda b, noise: (b / BASE) ** 0.5),
                         ("adascale", lambda b, noise: gain(noise.trace, noise.grad_sq, b, BASE))):
        model, clock = make_model(), Clock()
        sampler, optimizer = adaptive(data, model, rule=rule, clock=clock)
        lrs = []
        controller = sampler.controller

        def seen(opt, *_, lrs=lrs, controller=controller):
            lrs.append((opt.param_groups[0]["lr"], controller.batches[-1], controller.noise.smoothed))

        optimizer.optimizer.register_step_pre_hook(seen)
        train(model, data, 1, sampler=sampler, optimizer=optimizer, clock=clock)
        assert any(batch != BASE for _, batch, _ in lrs)
        for lr, batch, noise in lrs:
            assert lr == pytest.approx(0.02 * factor(batch, noise), rel=1e-12)
        assert [h["lr"] for h in optimizer.history] == [lr for lr, _, _ in lrs]


def test_a_prefetching_loader_changes_nothing_and_too_little_lookahead_is_refused(run):
    data = run[0]
    model, clock = make_model(), Clock()
    sampler, optimizer = adaptive(data, model, clock=clock)
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler, num_workers=2)
    with pytest.raises(RuntimeError, match=r"before it was decided \(lookahead=0\).*sampler.loader"):
        train(model, data, 1, sampler=sampler, optimizer=optimizer, clock=clock, loader=loader)
    # the same run with workers fetching ahead: the changes fall on the same updates
    model, clock = make_model(), Clock()
    sampler, optimizer = adaptive(data, model, clock=clock, lookahead=4)
    loader = sampler.loader(data, num_workers=2, prefetch_factor=2)
    assert sampler.lookahead == 4
    ahead, _ = train(model, data, 1, sampler=sampler, optimizer=optimizer, clock=clock, loader=loader)
    model, clock = make_model(), Clock()
    sampler_0, optimizer_0 = adaptive(data, model, clock=clock, lookahead=4)
    inline, _ = train(model, data, 1, sampler=sampler_0, optimizer=optimizer_0, clock=clock)
    assert sampler.controller.batches == sampler_0.controller.batches and sampler.controller.changes
    for got, want in zip(ahead, inline, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_resuming_through_elastic_state_continues_to_the_same_bits(run, tmp_path):
    data, _, sampler_full, _, history, _ = run
    model, clock = make_model(), Clock()
    sampler, optimizer = adaptive(data, model, clock=clock)
    state = ElasticState(tmp_path, model=model, optimizer=optimizer, verbose=False)
    stop = len(history) // 2 + 1  # an update after a change: the new plan is part of the state

    def commit_at():
        if len(sampler.controller.batches) == stop and optimizer.micro_step == 0 and not state.commits:
            state.commit()

    train(model, data, 3, sampler=sampler, optimizer=optimizer, clock=clock, after_step=commit_at)
    # a new process: everything built afresh, then restored
    model, clock_2 = make_model(seed=9), Clock()
    clock_2.now = clock.now
    sampler, optimizer = adaptive(data, model, clock=clock_2)
    state = ElasticState(tmp_path, model=model, optimizer=optimizer, verbose=False)
    assert state.restore()
    assert sampler.controller.batches == sampler_full.controller.batches[:stop]
    rest, _ = train(model, data, 3, sampler=sampler, optimizer=optimizer, clock=clock_2)
    assert sampler.controller.batches == sampler_full.controller.batches
    for got, want in zip(rest, history[stop:], strict=True):
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_a_state_from_other_settings_is_refused_and_changes_nothing(run):
    data, _, _, optimizer_full, _, _ = run
    other = AdaptiveSampler(data, base_batch=BASE, max_batch=32, micro_batch=MICRO, seed=5)
    mismatch = AdaptiveOptimizer(torch.optim.SGD(make_model().parameters(), lr=0.02), other)
    before = other.schedule.state_dict()
    with pytest.raises(ValueError, match=r"other settings \(max_batch 64 then, 32 now\)"):
        mismatch.load_state_dict(optimizer_full.state_dict())
    assert other.schedule.state_dict() == before and mismatch.updates == 0


@pytest.mark.parametrize(("options", "message"), [
    ({"base_batch": 6}, r"base_batch=6 is not a multiple of micro_batch x replicas = 4 x 1 = 4: .*base_batch=4 or 8"),
    ({"max_batch": 512}, r"max_batch=512 is larger than the data set \(256 samples\).*max_batch <= 256"),
    ({"max_batch": 30}, r"max_batch=30 is not a multiple"),
])
def test_bad_settings_are_refused_naming_the_fix(options, message):
    settings = {"base_batch": BASE, "max_batch": MAX, "micro_batch": MICRO, **options}
    with pytest.raises(ValueError, match=message):
        AdaptiveSampler(dataset(), **settings)


def test_a_data_set_not_cut_into_whole_micro_batches_says_what_each_epoch_leaves_out():
    with pytest.warns(UserWarning, match="leaves 2 of them out"):
        sampler = AdaptiveSampler(dataset(258), base_batch=BASE, max_batch=MAX, micro_batch=MICRO)
    assert sampler.schedule.samples_left_out == 2


def test_root_rule_replay_uses_the_trace_optimizer_of_that_rule(tmp_path):
    data, model, clock = dataset(), make_model(), Clock()
    start = [p.detach().clone() for p in model.parameters()]
    sampler, optimizer = adaptive(data, model, rule="sqrt", clock=clock)
    history, _ = train(model, data, 1, sampler=sampler, optimizer=optimizer, clock=clock)
    model = with_weights(make_model(), start)
    replay = CustomSampler(data, sampler.trace, minibatch_size=MICRO, seed=5, when_exhausted="stop")
    replay_opt = RootRuleOptimizer(torch.optim.SGD(model.parameters(), lr=0.02), replay, ref_batchsize=BASE)
    assert_replays(history, model, data, replay, replay_opt, epochs=1)


def test_a_resume_on_another_number_of_replicas_is_refused_naming_why():
    sampler = AdaptiveSampler(dataset(), base_batch=BASE, max_batch=MAX, micro_batch=MICRO)
    with pytest.raises(ValueError, match="planned for 1 replicas and resumes on 2: its throughput model"):
        sampler.set_world(2, 0)


def test_an_adascale_run_replays_bit_for_bit_with_its_lr_schedule(tmp_path):
    data, model, clock = dataset(), make_model(), Clock()
    start = [p.detach().clone() for p in model.parameters()]
    sampler, optimizer = adaptive(data, model, rule="adascale", clock=clock)
    history, _ = train(model, data, 2, sampler=sampler, optimizer=optimizer, clock=clock)
    assert len({row["lr"] for row in optimizer.history}) > 2  # the gain moved the LR
    sampler.write_trace(tmp_path / "trace.csv")
    optimizer.write_lr_schedule(tmp_path / "lr.csv")
    model = with_weights(make_model(), start)
    replay = CustomSampler(data, str(tmp_path / "trace.csv"), minibatch_size=MICRO, seed=5)
    replay_opt = ConstantOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), replay)
    scheduler = UpdateScheduler(ReplaySchedule(replay_opt, tmp_path / "lr.csv"))
    assert_replays(history, model, data, replay, replay_opt, epochs=2, scheduler=scheduler)
