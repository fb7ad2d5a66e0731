"""The AutoLRS core: forecast, search and stage state machine, with no framework."""

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aikit.core.autolrs import (
    DIVERGE_WINDOW,
    ROLLBACK_FACTOR,
    Action,
    Controller,
    LogLRSearch,
    Settings,
    failed_forecast,
    fit_exponential,
    forecast,
    read_schedule,
    stage_length,
    write_schedule,
)
from aikit.core.errors import InvalidValue


def curve(t, a, b, c):
    return a * np.exp(b * t) + c


@settings(max_examples=60, deadline=None)
@given(
    a=st.floats(0.05, 20.0) | st.floats(-20.0, -0.05),
    rate_per_span=st.floats(0.5, 30.0),
    c=st.floats(-10.0, 10.0),
    n=st.integers(20, 300),
    t0=st.integers(0, 50),
)
def test_fit_recovers_clean_parameters(a, rate_per_span, c, n, t0):
    # a is the amplitude at the trial's first step t0, as a trial's losses are seen.
    t = np.arange(t0, t0 + n, dtype=float)
    b = -rate_per_span / (n - 1)
    y = curve(t - t0, a, b, c)
    fa, fb, fc = fit_exponential(t, y)
    size = abs(a) + abs(c)
    assert fb == pytest.approx(b, rel=1e-6)
    assert fa * math.exp(fb * t0) == pytest.approx(a, abs=1e-6 * size)
    assert fc == pytest.approx(c, abs=1e-6 * size)
    at = t0 + 10 * n
    if rate_per_span >= 1.0:  # the forecast fits slower decays at one e-fold per span
        assert forecast(t, y, at) == pytest.approx(curve(at - t0, a, b, c), abs=1e-6 * size)


def test_clean_example_from_the_seed_study_is_unbiased():
    # The original's spline denoiser forecast c ~ 0.35 here instead of 0.5.
    t = np.arange(100.0)
    assert forecast(t, 2 * np.exp(-0.03 * t) + 0.5, at=1000) == pytest.approx(0.5, abs=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_fit_recovers_parameters_from_noisy_data_with_spikes(seed):
    rng = np.random.default_rng(seed)
    t = np.arange(1.0, 201.0)
    y = curve(t, 2.0, -0.03, 0.5) + rng.normal(0.0, 0.05, t.size)
    y[rng.choice(t.size, 6, replace=False)] += 2.0  # loss spikes from unlucky batches
    a, b, c = fit_exponential(t, y)
    assert a == pytest.approx(2.0, rel=0.1)
    assert b == pytest.approx(-0.03, rel=0.1)
    assert c == pytest.approx(0.5, abs=0.03)


@settings(max_examples=40, deadline=None)
@given(scale=st.floats(1e-3, 1e3), shift=st.floats(-100.0, 100.0), seed=st.integers(0, 2**32 - 1))
def test_forecast_does_not_depend_on_the_loss_scale(scale, shift, seed):
    rng = np.random.default_rng(seed)
    t = np.arange(1.0, 51.0)
    y = curve(t, 1.0, -0.05, 2.0) + rng.normal(0.0, 0.05, t.size)
    expected = scale * forecast(t, y, 500) + shift
    assert forecast(t, scale * y + shift, 500) == pytest.approx(expected, rel=1e-7, abs=1e-7 * (scale + abs(shift)))


def test_a_straight_decline_is_extrapolated_about_as_far_as_it_was_seen_to_fall():
    t = np.arange(1.0, 21.0)
    drop = 0.1 * (t[-1] - t[0])  # the line falls 1.9 over the trial
    predicted_fall = 3.0 - 0.1 * t[-1] - forecast(t, 3.0 - 0.1 * t, at=200)
    assert 0.3 * drop < predicted_fall < 1.0 * drop  # a straight line would predict 18 more


def test_warm_start_tries_the_previous_stage_lr_first():
    c = Controller(1e-3, 1.0, tau=30, tau_max=30, trials=3, val_tau=1000, seed=0)
    drive(c, 2 * (3 * 3 + 30) + 1, lambda s, lr: 1.0 + 1.0 / (s + 1) + abs(math.log(lr / 0.05)))
    assert c.stages[1].trials[0].lr == c.stages[0].lr
    assert c.stages[2].trials[0].lr == c.stages[1].lr
    cold = Controller(1e-3, 1.0, tau=30, tau_max=30, trials=3, val_tau=1000, seed=0, warm_start=False, design=0)
    drive(cold, 3 * 3 + 30 + 1, lambda s, lr: 1.0)
    assert cold.stages[1].trials[0].lr not in [t.lr for t in cold.stages[0].trials]


def test_nan_or_inf_trial_forecasts_worst():
    t = np.arange(1.0, 11.0)
    assert forecast(t, np.r_[np.ones(9), np.nan], 100) == math.inf
    assert forecast(t[:1], [math.inf], 100) == math.inf


def test_forecast_refuses_too_few_points_and_a_past_horizon():
    with pytest.raises(InvalidValue, match="an exponential fit needs at least 3 losses, got 2"):
        fit_exponential([1, 2], [1.0, 0.5])
    with pytest.raises(InvalidValue, match="forecast step 5 must lie after the last step 10"):
        forecast(np.arange(1.0, 11.0), np.ones(10), 5)


@settings(max_examples=30, deadline=None)
@given(
    scores=st.lists(st.floats(-1e6, 1e6) | st.just(math.inf), min_size=15, max_size=15),
    low=st.floats(1e-6, 1e-1),
    decades=st.floats(0.5, 6.0),
    seed=st.integers(0, 1000),
)
def test_search_proposals_stay_in_range_and_never_repeat(scores, low, decades, seed):
    high = low * 10**decades
    search = LogLRSearch(low, high, rng=np.random.default_rng(seed))
    tried = []
    for score in scores:
        lr = search.ask()
        assert low <= lr <= high
        tried.append(math.log(lr))
        search.tell(lr, score)
    gaps = np.diff(np.sort(tried)) / math.log(high / low)
    assert gaps.min() >= search.min_gap - 1e-9


def test_search_finds_the_minimum_of_a_smooth_score():
    search = LogLRSearch(1e-4, 1.0, rng=np.random.default_rng(0))
    for _ in range(10):
        lr = search.ask()
        search.tell(lr, (math.log10(lr) + 2.0) ** 2)  # best at 1e-2
    best = search.x[int(np.argmin(search.scores))]
    assert 10 ** (-4 + 4 * best) == pytest.approx(1e-2, rel=0.25)


def test_a_blown_up_trial_does_not_blind_the_search():
    search = LogLRSearch(1e-4, 1.0, rng=np.random.default_rng(0), first=0.9)
    search.tell(search.ask(), 1e30)  # a diverging but finite forecast
    for _ in range(9):
        lr = search.ask()
        search.tell(lr, (math.log10(lr) + 2.0) ** 2)
    best = search.x[int(np.argmin(search.scores))]
    assert 10 ** (-4 + 4 * best) == pytest.approx(1e-2, rel=0.25)


def test_stage_lengths_follow_the_paper():
    assert [stage_length(i, 1000, 8000) for i in range(6)] == [1000, 2000, 4000, 8000, 8000, 8000]
    assert [stage_length(i, 30, 100) for i in range(4)] == [30, 60, 100, 100]


def drive(controller, steps, loss_fn, val_fn=lambda: 1.0):
    """Run the protocol like an adapter; returns the log of (step, lr used, action)."""
    action, log = controller.begin(), []
    actions = [action]
    for step in range(steps):
        log.append((step, action.lr))
        action = controller.step(loss_fn(step, action.lr))
        if action.evaluate:
            action = controller.validation(val_fn())
        actions.append(action)
    return log, actions


def test_stage_accounting_checkpoints_and_restores():
    c = Controller(1e-3, 1.0, tau=30, tau_max=60, trials=4, val_tau=1000, seed=1, keep_winner=False)
    per_stage = [4 * 3 + 30, 4 * 6 + 60, 4 * 6 + 60]  # search, then the stage itself
    _, actions = drive(c, sum(per_stage), lambda s, lr: 1.0 / (s + 1))
    assert [(s.tau, s.trial_steps, s.start_step) for s in c.stages] == [
        (30, 3, 0), (60, 6, 42), (60, 6, 126), (60, 6, 210)]  # the 4th has just begun
    assert [i for i, a in enumerate(actions) if a.checkpoint] == [0, 42, 126, 210]
    restores = [i for i, a in enumerate(actions) if a.restore]
    assert restores == [3, 6, 9, 12, 48, 54, 60, 66, 132, 138, 144, 150]
    assert sum(len(t.losses) for s in c.stages for t in s.trials) == 3 * 4 + 2 * 6 * 4


def test_each_stage_trains_the_best_forecast_lr_from_the_checkpoint():
    c = Controller(1e-3, 1.0, tau=30, tau_max=30, trials=5, val_tau=1000, seed=3, keep_winner=False)
    def loss(step, lr):  # steady decay whose floor is lowest at lr = 0.03
        return 1.0 + abs(math.log10(lr / 0.03)) + math.exp(-0.2 * c._in_phase)
    log, actions = drive(c, 5 * 3 + 30, loss)
    stage = c.stages[0]
    best = min(stage.trials, key=lambda t: t.score)
    assert stage.lr == best.lr
    assert all(lr == best.lr for _, lr in log[15:])  # the chosen LR from the first step after restore
    assert actions[15].restore and actions[15].lr == best.lr
    assert actions[45].checkpoint  # the next stage starts from the trained state


def test_diverged_trial_ends_at_once_and_is_never_chosen():
    c = Controller(1e-3, 1.0, tau=30, tau_max=30, trials=4, val_tau=1000, seed=0)
    action = c.begin()
    seen = []
    while len(c.stages[0].trials) < 4 or c.phase == "trial":
        lr = action.lr
        seen.append(lr)
        action = c.step(math.nan if lr > 0.05 else 1.0 / (1 + len(seen)))
    failed = [t for t in c.stages[0].trials if t.failed]
    assert failed and all(t.failed == "diverged" and len(t.losses) == 1 for t in failed)
    assert all(t.lr > 0.05 for t in failed) and c.stages[0].lr <= 0.05


def test_validation_mode_asks_for_val_points_evaluations_per_trial():
    c = Controller(1e-3, 1.0, tau=160, tau_max=160, trials=2, val_points=4, seed=0)
    calls = []
    drive(c, 2 * 16, lambda s, lr: 1.0, val_fn=lambda: calls.append(1) or 1.0 / len(calls))
    stage = c.stages[0]
    assert stage.val_every == 4 and stage.trial_steps == 16
    assert [t.steps for t in stage.trials] == [[4, 8, 12, 16]] * 2
    with pytest.raises(RuntimeError, match="none is pending"):
        c.validation(1.0)


def test_warmup_follows_the_original_autolrs_then_starts_the_first_stage():
    # The original: step 0 at the optimizer's own LR, step k (1..n) at warmup_lr * k / n.
    c = Controller(1e-3, 1.0, tau=30, warmup_steps=4, warmup_lr=0.2)
    action, lrs = c.begin(current_lr=0.7), []
    for _ in range(6):
        lrs.append(action.lr)
        action = c.step(1.0)
        if len(lrs) == 5:
            assert action == Action(action.lr, checkpoint=True)
    assert lrs[:5] == pytest.approx([0.7, 0.05, 0.1, 0.15, 0.2])
    assert c.stages[0].start_step == 5 and [r.phase for r in c.history[:6]] == ["warmup"] * 5 + ["trial"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_lr": 0.1, "max_lr": 0.1}, "min_lr must be below max_lr, got min_lr=0.1 and max_lr=0.1"),
        ({"min_lr": 0.0}, "min_lr must be a finite number > 0, got 0.0"),
        ({"max_lr": math.nan}, "max_lr must be a finite number > 0, got nan"),
        ({"tau": 20}, "tau=20 with trial_ratio=10 gives 2 steps per trial; the forecast needs at least 3"),
        ({"tau": 2000, "tau_max": 1000}, "tau_max must be >= tau, got tau=2000 and tau_max=1000"),
        ({"trials": 0}, "trials must be a positive integer, got 0"),
        ({"warmup_steps": 5}, "warmup_lr must be a finite number > 0 when warmup_steps > 0, got 0.0"),
        ({"val_points": 2}, "val_points must be >= 3 for the forecast, got 2"),
    ],
)
def test_bad_settings_get_clear_errors(kwargs, message):
    settings = {"min_lr": 1e-3, "max_lr": 1.0, **kwargs}
    with pytest.raises(InvalidValue, match=message.replace("(", r"\(")):
        Controller(settings.pop("min_lr"), settings.pop("max_lr"), **settings)


def test_protocol_misuse_is_refused():
    c = Controller(1e-3, 1.0)
    with pytest.raises(RuntimeError, match=r"call Controller\.begin"):
        c.step(1.0)
    c.begin()
    with pytest.raises(RuntimeError, match="already called"):
        c.begin()
    with pytest.raises(RuntimeError, match="none is pending"):
        c.validation(1.0)
    c = Controller(1e-3, 1.0, tau=40, tau_max=40, val_points=4)
    c.begin()
    assert c.step(1.0).evaluate
    with pytest.raises(RuntimeError, match="an evaluate action is pending"):
        c.step(1.0)


# -- issue 18: failed forecasts, rollback, budget, kept winner, range test, state ------------


def test_a_forecast_below_zero_or_far_below_every_loss_seen_is_a_failed_trial():
    # The forecasts of the spiking LR-1.0 trials on MNIST-1D: -3.5e9 and -919 for losses near 2.3.
    losses = [2.31, 2.29, 2.30, 2.28, 2.27]
    assert failed_forecast(losses, -3.5e9).startswith("forecast -3.5e+09 below zero")
    assert failed_forecast(losses, -919.0).startswith("forecast -919 below zero")
    assert failed_forecast(losses, 2.0).startswith("forecast 2 far below every loss seen")
    assert failed_forecast(losses, 2.25) == ""  # a fall about as large as the one seen is believable
    assert failed_forecast([-3.0, -3.5, -4.0], -4.5) == ""  # a loss that may be negative


def test_a_spiking_trial_never_wins():
    # LR >= 0.5 spikes to 1e13-5e20 and falls back to ~2.3; the others decline slowly from 2.3.
    c = Controller(1e-3, 1.0, tau=100, tau_max=100, trials=6, val_tau=10**6, seed=0)
    spikes = iter([1e13, 5e20, 3e15] + [2.3] * 1000)

    def loss(step, lr):
        if lr >= 0.5:
            return next(spikes) if c._in_phase < 3 else 2.3 - 1e-3 * c._in_phase
        return 2.3 - 0.01 * c._in_phase * lr / 0.1

    action = c.begin()
    while c.phase == "trial":
        action = c.step(loss(0, action.lr))
    hot = [t for t in c.stages[0].trials if t.lr >= 0.5]
    assert hot and all(t.failed for t in hot)
    assert c.stages[0].lr < 0.5


def rollback_run(**options):
    """A model whose loss turns NaN in stage training at LRs above 0.05 (trials are short
    enough to miss it, and favour LRs near 0.5); returns the controller and every action."""
    c = Controller(1e-3, 1.0, tau=30, tau_max=30, trials=3, val_tau=10**6, seed=0, **options)
    action, actions, lrs = c.begin(), [], []
    for _ in range(200):
        lrs.append(action.lr)
        blown = c.phase in ("train", "anneal") and action.lr > 0.05 and c._in_phase > 5
        preference = 0.1 * abs(math.log10(action.lr / 0.5)) if c.phase == "trial" else 0.0
        action = c.step(math.nan if blown else 1.0 / (1 + len(lrs)) + preference)
        actions.append(action)
    return c, actions, lrs


def test_a_stage_that_diverges_is_rolled_back_and_retried_lower():
    c, actions, _ = rollback_run(total_steps=200, keep_winner=False, design=0, warm_start=False)
    rollbacks = [i for i, a in enumerate(actions) if a.restore and c.history[i].phase in ("train", "anneal")]
    assert rollbacks and c.rollbacks == len(rollbacks)
    for i in rollbacks:
        assert not math.isfinite(c.history[i].loss)  # only a diverged step rolls back
        assert actions[i].lr == pytest.approx(c.history[i].lr / 3)  # and retries at a third of the LR
    assert math.isfinite(c.history[-1].loss) and c.phase == "done"
    assert all(lr <= 0.05 for _, lr in c.schedule()[-20:])


@settings(max_examples=15, deadline=None)
@given(total=st.integers(300, 1500), trials=st.integers(2, 6), ratio=st.integers(3, 10),
       anneal=st.sampled_from([0.0, 0.2, 0.5]), keep=st.booleans(), warmup=st.integers(0, 20))
def test_a_budget_is_spent_exactly(total, trials, ratio, anneal, keep, warmup):
    c = Controller(1e-3, 1.0, total_steps=total, trials=trials, trial_ratio=ratio, anneal=anneal,
                   keep_winner=keep, warmup_steps=warmup, warmup_lr=0.1, val_tau=10**6)
    action = c.begin()
    phases = []
    for step in range(total):
        phases.append(c.phase)
        action = c.step(1.0 + 1.0 / (step + 1))
    assert c.phase == "done" and action.lr == (0.0 if anneal else c.stages[-1].lr)  # the anneal ends at 0
    assert "done" not in phases  # every step of the budget was planned: none left over
    assert phases.count("anneal") == round(anneal * total)
    assert phases.count("warmup") == (warmup + 1 if warmup else 0)
    for stage in c.stages:
        trial_steps = len(stage.trials) * stage.trial_steps
        train = sum(1 for r in c.history if r.phase == "train" and stage.start_step < r.step
                    and (stage.index + 1 == len(c.stages) or r.step <= c.stages[stage.index + 1].start_step))
        assert trial_steps + train == stage.tau + trial_steps - (stage.trial_steps if stage.kept is not None else 0)
    assert len(c.schedule()) == total - sum(len(s.trials) * s.trial_steps for s in c.stages) + sum(
        s.trial_steps for s in c.stages if s.kept is not None)


def test_the_stage_continues_from_the_winning_trial_and_its_steps_count():
    c = Controller(1e-3, 1.0, tau=30, tau_max=30, trials=4, val_tau=10**6, seed=2)

    def loss(step, lr):  # the floor is lowest at lr = 0.03
        return 1.0 + abs(math.log10(lr / 0.03)) + math.exp(-0.2 * c._in_phase)

    log, actions = drive(c, 4 * 3 + 27, loss)
    stage = c.stages[0]
    assert stage.kept is not None and stage.trials[stage.kept].lr == stage.lr
    end = actions[12]
    assert end.resume_trial and end.checkpoint and not end.restore and end.lr == stage.lr
    keeps = [i for i, a in enumerate(actions[:13]) if a.keep_trial]
    assert keeps[-1] == 3 * (stage.kept + 1)  # the winner's state was kept when it ended
    assert all(lr == stage.lr for _, lr in log[12:]) and actions[39].checkpoint  # 27 more steps: 30 in all
    assert [lr for _, lr in c.schedule()] == [stage.lr] * 30


def test_without_a_range_a_short_range_test_sets_it_and_is_undone(caplog):
    c = Controller(total_steps=2000, range_steps=50)
    with caplog.at_level("INFO", logger="aikit.autolrs"):
        action = c.begin()
        assert action.checkpoint
        lrs = []
        for _ in range(50):  # the loss is lowest at lr ~ 0.3, then it blows up
            lrs.append(action.lr)
            action = c.step(1.0 + (math.log10(action.lr) + 0.5) ** 2 / 10)
    assert lrs == pytest.approx(np.geomspace(1e-6, 10.0, 50).tolist())
    assert action.restore and action.checkpoint  # undone, and the first stage starts from there
    losses = np.array(c.range_test["loss"])  # smoothed over about a tenth of the test: 5 / 50 per step
    assert losses[1] == pytest.approx(0.9 * losses[0] + 0.1 * (1.0 + (math.log10(lrs[1]) + 0.5) ** 2 / 10))
    near = losses.min() + 0.1 * (losses[0] - losses.min())  # the loss bottoms out within 10 % of its drop
    hot = c.range_test["lr"][int(np.argmax(losses <= near))]
    assert hot < c.range_test["lr"][int(np.argmin(losses))]  # below the lowest point of a wide floor
    assert c.max_lr == pytest.approx(hot / 3) and c.min_lr == pytest.approx(hot / 3000)
    assert "no min_lr/max_lr given; running an LR range test of 50 steps" in caplog.text
    assert f"searching min_lr={c.min_lr:.4g} to max_lr={c.max_lr:.4g}" in caplog.text
    assert not c.schedule()  # the range test's steps are not in the kept schedule


def range_tested(steps: int = 20, **options) -> tuple[Controller, Action]:
    """A controller right after a range test whose loss is lowest at lr ~ 0.3."""
    c = Controller(range_steps=steps, **options)
    action = c.begin()
    for _ in range(steps):
        action = c.step(1.0 + (math.log10(action.lr) + 0.5) ** 2 / 10)
    return c, action


def test_after_a_range_test_the_first_stage_trains_at_max_lr_without_trials():
    c, action = range_tested(total_steps=1000, stages=2, anneal=0.5, ramp_steps=0)
    stage = c.stages[0]
    assert action.restore and action.checkpoint and action.lr == c.max_lr and c.kept
    assert stage.trials == [] and stage.lr == c.max_lr
    # the plan costs stage 0 its tau alone: tau + (3 trials of 2 tau / 5 + 2 tau - 2 tau / 5) = 480 - 20 - 500
    tau0, tau1 = stage.tau, c.plan[1][0]
    assert tau0 + 3 * (2 * tau0 // 5) + 2 * tau0 - 2 * tau0 // 5 <= 480
    for _ in range(tau0):
        assert c.phase == "train" and c.lr == c.max_lr
        action = c.step(0.9)
    assert c.phase == "trial" and action.checkpoint and action.lr == c.max_lr  # stage 1 starts from it
    assert c.stages[1].trials[0].lr == c.max_lr and tau1 >= 2 * tau0
    assert [lr for _, lr in c.schedule()] == [c.max_lr] * tau0


def test_without_exploit_or_with_a_given_range_the_first_stage_searches():
    c, _ = range_tested(total_steps=1000, exploit=False)
    assert len(c.stages[0].trials) == 1 and c.phase == "trial"
    c = Controller(1e-3, 1.0, total_steps=1000)
    c.begin()
    assert len(c.stages[0].trials) == 1 and c.phase == "trial"


def test_a_first_stage_that_blows_up_is_rolled_back_lower_and_noise_at_the_first_loss_is_not_a_divergence():
    c, _ = range_tested(total_steps=1000, ramp_steps=0)
    start, first = c.max_lr, c.history[0].loss  # ~4.0: the range test starts at lr 1e-6
    for _ in range(5):  # more than `diverge` (5) times the loss at the checkpoint
        action = c.step(6 * first)
    assert action.restore and action.lr == pytest.approx(start / 3) and c.rollbacks == 1
    for _ in range(30):  # no progress yet: a loss a little above the first one is noise, not a divergence
        action = c.step(1.05 * first)
    assert c.rollbacks == 1 and not action.restore


def run_to(controller, steps, state_at=None):
    """Drive ``controller`` for ``steps`` steps; every action, and its state at ``state_at``
    (through JSON, as a file would keep it)."""
    action, seen, state = controller.begin(), [], None
    for step in range(steps):
        if step == state_at:
            state = json.loads(json.dumps(controller.state_dict()))
        loss = 1.0 + 0.5 * math.sin(step) ** 2 + abs(math.log10(action.lr / 0.02)) / (1 + step / 50)
        action = controller.step(loss)
        if action.evaluate:
            action = controller.validation(loss / 2)
        seen.append(action)
    return seen, state


@pytest.mark.parametrize("at", [7, 60, 333, 650])
def test_a_resumed_search_decides_exactly_as_an_uninterrupted_one(at):
    options = {"total_steps": 700, "trials": 4, "trial_ratio": 5, "range_steps": 20, "val_tau": 150, "seed": 4}
    uninterrupted = Controller(**options)
    whole, state = run_to(uninterrupted, 700, state_at=at)
    resumed = Controller(**options)
    resumed.load_state_dict(state)
    assert run_on(resumed, whole, at, 700) == whole[at:]
    assert resumed.history == uninterrupted.history and resumed.schedule() == uninterrupted.schedule()
    assert resumed.state_dict() == uninterrupted.state_dict()


def run_on(resumed: Controller, whole: list[Action], at: int, steps: int) -> list[Action]:
    """Drive ``resumed`` (loaded from step ``at`` of ``run_to``'s run ``whole``) on the same losses
    up to ``steps``; its actions."""
    action, rest = whole[at - 1], []
    for step in range(at, steps):
        loss = 1.0 + 0.5 * math.sin(step) ** 2 + abs(math.log10(action.lr / 0.02)) / (1 + step / 50)
        action = resumed.step(loss)
        if action.evaluate:
            action = resumed.validation(loss / 2)
        rest.append(action)
    return rest


def test_a_state_saved_with_other_options_is_refused_and_changes_nothing():
    _, state = run_to(Controller(1e-3, 1.0, tau=30, trials=3), 50, state_at=40)
    other = Controller(1e-3, 1.0, tau=60, trials=3)
    before = other.state_dict()
    with pytest.raises(InvalidValue, match=r"saved with other options: tau 30 saved, 60 here; .*with \(tau=30\)"):
        other.load_state_dict(state)
    assert other.state_dict() == before


def test_schedule_csv_round_trips_and_bad_files_are_refused(tmp_path):
    path = tmp_path / "schedule.csv"
    schedule = [(0, 0.1), (1, 1 / 3), (2, 0.0)]
    write_schedule(path, schedule)
    assert path.read_text().splitlines()[0] == "step,lr"
    assert read_schedule(path) == [0.1, 1 / 3, 0.0]  # bit for bit
    path.write_text("step,lr\n0,0.1\n2,0.2\n")
    with pytest.raises(InvalidValue, match="line 3: step 2, expected 1"):
        read_schedule(path)
    path.write_text("step,lr\n0,nan\n")
    with pytest.raises(InvalidValue, match="line 2: lr must be finite and >= 0, got nan"):
        read_schedule(path)
    path.write_text("lr\n0.1\n")
    with pytest.raises(InvalidValue, match="expected a 'step,lr' header"):
        read_schedule(path)


def test_with_a_budget_the_defaults_are_a_range_test_of_a_tenth_a_ramp_a_held_lr_and_an_anneal():
    assert [Settings(total_steps=n).range_steps for n in (100, 300, 900, 5000)] == [20, 30, 90, 100]
    assert Settings().range_steps == 100 and Settings().ramp_steps == 0  # no budget: the paper's AutoLRS
    budgeted = Settings(total_steps=1000)
    assert (budgeted.ramp_steps, budgeted.anneal, budgeted.stages) == (50, 0.4, 1)
    assert Settings(total_steps=1000, exploit=False).ramp_steps == 0  # stage 0 searches: nothing to ramp to
    with pytest.raises(InvalidValue, match="ramp_steps"):
        Settings(total_steps=1000, ramp_steps=-1)


def test_stage_0_ramps_linearly_to_max_lr_and_again_after_a_rollback():
    c, action = range_tested(total_steps=1000, ramp_steps=4)
    lrs = [action.lr]
    for _ in range(8):
        lrs.append(c.step(0.5).lr)  # progress: no rollback
    assert lrs == pytest.approx([c.max_lr * k / 5 for k in (1, 2, 3, 4)] + [c.max_lr] * 5)
    top = c.max_lr
    action = c.step(1e4)  # blown up
    assert action.restore and c.stages[0].lr == pytest.approx(top / ROLLBACK_FACTOR)
    assert action.lr == pytest.approx(top / ROLLBACK_FACTOR / 5)  # the ramp starts over, lower
    assert c.step(0.5).lr == pytest.approx(2 * top / ROLLBACK_FACTOR / 5)


def test_a_stage_0_that_never_leaves_the_first_loss_is_rolled_back_once():
    c, _ = range_tested(total_steps=1000, ramp_steps=3)
    first, top = c.history[0].loss, c.max_lr
    actions = [c.step(first) for _ in range(3 + 2 * DIVERGE_WINDOW)]  # a dead net: the first loss, for good
    assert not any(a.restore for a in actions[:-1]) and actions[-1].restore  # judged once, after ramp + 10 steps
    assert c.rollbacks == 1 and c.stages[0].lr == pytest.approx(top / ROLLBACK_FACTOR)
    for _ in range(50):  # still at the first loss: slow, not rolled back again and again
        assert not c.step(first).restore
    c, _ = range_tested(total_steps=1000, ramp_steps=3)
    losses = np.linspace(first, 0.5 * first, 3 + 2 * DIVERGE_WINDOW)  # it leaves the first loss: no rollback
    assert not any(c.step(loss).restore for loss in losses) and c.rollbacks == 0



OLD_DEFAULTS = {"range_steps": 100, "stages": 2, "anneal": 0.5, "ramp_steps": 0}  # before issue 27


def test_a_state_saved_with_the_old_defaults_resumes_only_with_them_spelled_out():
    """A state saved before ``ramp_steps`` existed recorded its options as given (anneal None,
    range_steps 100, stages 2): it ran with that release's defaults, which a resume must match."""
    old = Controller(total_steps=600, **OLD_DEFAULTS)
    whole, state = run_to(old, 300, state_at=150)
    state["options"] = {**state["options"], "anneal": None}
    del state["options"]["ramp_steps"]
    fresh = Controller(total_steps=600)
    before = fresh.state_dict()
    with pytest.raises(InvalidValue, match=r"stages 2 saved, 1 here; anneal 0.5 saved, 0.4 here; range_steps 100 "
                                           r"saved, 60 here; ramp_steps 0 saved, 30 here; build the AutoLRS with the "
                                           r"options it was saved with \(stages=2, anneal=0.5, range_steps=100, "
                                           r"ramp_steps=0\)"):
        fresh.load_state_dict(state)
    assert fresh.state_dict() == before  # refused: nothing changed
    resumed = Controller(total_steps=600, **OLD_DEFAULTS)  # the old defaults, spelled out
    resumed.load_state_dict(state)
    assert run_on(resumed, whole, 150, 300) == whole[150:] and resumed.history == old.history


def test_under_heavy_ball_momentum_the_range_tests_lr_is_read_two_steps_earlier():
    """max_lr = a third of the LR two steps of the test before where the loss bottoms out,
    under momentum 0.9: SGD held a third of the bottom (0.63) on the digits MLP where 0.1-0.3
    won (issue 46); Adam (no momentum for the controller) and plain SGD keep the bottom."""
    def run(momentum: float) -> Controller:
        c = Controller(total_steps=2000, range_steps=50)
        c.momentum = momentum
        action = c.begin()
        for _ in range(50):
            action = c.step(1.0 + (math.log10(action.lr) + 0.5) ** 2 / 10)
        return c

    plain, heavy = run(0.0), run(0.9)
    assert plain.range_test == heavy.range_test  # the same test, the same bottom
    lrs = plain.range_test["lr"]
    bottom = lrs.index(plain.max_lr * 3)
    assert heavy.max_lr == lrs[bottom - 2] / 3 and heavy.min_lr == heavy.max_lr / 1000
    assert run(0.5).max_lr == lrs[bottom - 1] / 3 and run(0.2).max_lr == plain.max_lr
    assert heavy.stages[0].lr == heavy.max_lr  # stage 0 holds it
