"""The AutoLRS core: forecast, search and stage state machine, with no framework."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aikit.core.autolrs import Action, Controller, LogLRSearch, fit_exponential, forecast, stage_lengths


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
    cold = Controller(1e-3, 1.0, tau=30, tau_max=30, trials=3, val_tau=1000, seed=0, warm_start=False)
    drive(cold, 3 * 3 + 30 + 1, lambda s, lr: 1.0)
    assert cold.stages[1].trials[0].lr not in [t.lr for t in cold.stages[0].trials]


def test_nan_or_inf_trial_forecasts_worst():
    t = np.arange(1.0, 11.0)
    assert forecast(t, np.r_[np.ones(9), np.nan], 100) == math.inf
    assert forecast(t[:1], [math.inf], 100) == math.inf


def test_forecast_refuses_too_few_points_and_a_past_horizon():
    with pytest.raises(ValueError, match="an exponential fit needs at least 3 losses, got 2"):
        fit_exponential([1, 2], [1.0, 0.5])
    with pytest.raises(ValueError, match="forecast step 5 must lie after the last step 10"):
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
    lengths = stage_lengths(1000, 8000)
    assert [next(lengths) for _ in range(6)] == [1000, 2000, 4000, 8000, 8000, 8000]
    lengths = stage_lengths(30, 100)
    assert [next(lengths) for _ in range(4)] == [30, 60, 100, 100]


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
    c = Controller(1e-3, 1.0, tau=30, tau_max=60, trials=4, val_tau=1000, seed=1)
    per_stage = [4 * 3 + 30, 4 * 6 + 60, 4 * 6 + 60]  # search, then the stage itself
    _, actions = drive(c, sum(per_stage), lambda s, lr: 1.0 / (s + 1))
    assert [(s.tau, s.trial_steps, s.start_step) for s in c.stages] == [
        (30, 3, 0), (60, 6, 42), (60, 6, 126), (60, 6, 210)]  # the 4th has just begun
    assert [i for i, a in enumerate(actions) if a.checkpoint] == [0, 42, 126, 210]
    restores = [i for i, a in enumerate(actions) if a.restore]
    assert restores == [3, 6, 9, 12, 48, 54, 60, 66, 132, 138, 144, 150]
    assert sum(len(t.losses) for s in c.stages for t in s.trials) == 3 * 4 + 2 * 6 * 4


def test_each_stage_trains_the_best_forecast_lr_from_the_checkpoint():
    c = Controller(1e-3, 1.0, tau=30, tau_max=30, trials=5, val_tau=1000, seed=3)
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
    scores = {t.lr: t.score for t in c.stages[0].trials}
    assert any(s == math.inf for s in scores.values())
    assert all(len(t.losses) == 1 for t in c.stages[0].trials if t.score == math.inf)
    assert c.stages[0].lr <= 0.05


def test_validation_mode_asks_for_val_points_evaluations_per_trial():
    c = Controller(1e-3, 1.0, tau=160, tau_max=160, trials=2, val_points=4, seed=0)
    calls = []
    drive(c, 2 * 16, lambda s, lr: 1.0, val_fn=lambda: calls.append(1) or 1.0 / len(calls))
    stage = c.stages[0]
    assert stage.val_every == 4 and stage.trial_steps == 16
    assert [t.steps for t in stage.trials] == [[4, 8, 12, 16]] * 2
    with pytest.raises(RuntimeError, match="none is pending"):
        c.validation(1.0)


def test_warmup_ramps_then_starts_the_first_stage():
    c = Controller(1e-3, 1.0, tau=30, warmup_steps=4, warmup_lr=0.2)
    log, actions = drive(c, 5, lambda s, lr: 1.0)
    assert [lr for _, lr in log[:4]] == pytest.approx([0.05, 0.1, 0.15, 0.2])
    assert actions[4] == Action(actions[4].lr, checkpoint=True)
    assert c.stages[0].start_step == 4


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
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
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
