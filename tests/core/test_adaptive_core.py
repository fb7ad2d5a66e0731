"""aikit.core.adaptive: the one adaptive-batch algorithm both adapters run. The packing and
end-of-epoch rule against a brute force written from the rule's words, a controller's recorded
updates resumed, the timing model from either adapter's marks, the controller's gating and
candidates, and the history row."""

from __future__ import annotations

import logging
import math
import warnings

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from aikit.core.adaptive import HISTORY_KEYS, AdaptiveRun, AdaptiveSchedule, UpdateClock, update_timing
from aikit.core.errors import InvalidValue
from aikit.core.goodput import GoodputController
from aikit.core.gradient_noise import NoiseEstimate
from aikit.core.plan import make_plan


def runs_on(batch: int, update: int, per_device: int, devices: int, grows: bool, noise_every: int | None,
            held_from: int | None = None) -> bool:
    """Whether update ``update`` can run ``batch``, from the rule's words: whole micro-batches of
    ``per_device`` (fixed), or an even split over the devices in the fewest micro-batches of at
    most ``per_device`` per device, two or more in all on every ``noise_every``-th update before
    the run holds its batch (``held_from``)."""
    if not grows:
        return batch % per_device == 0
    measures = noise_every and update % noise_every == 0 and (held_from is None or update < held_from)
    least = 2 if measures else 1
    steps = max(math.ceil(least / devices), math.ceil(batch / (devices * per_device)))
    return batch % (devices * steps) == 0


@pytest.mark.filterwarnings("ignore:the adaptive run holds its batch")  # a controller that never measured holds
@settings(max_examples=150, deadline=None)
@example(dataset=20, per_device=1, devices=1, grows=True, noise_every=2, choices=[0, 0, 144], hold_after=None)  # 1
# left: the next update measures the noise in two micro-batches, so the epoch ends (whatever the closing update runs)
@example(dataset=20, per_device=1, devices=1, grows=True, noise_every=2, choices=[0, 0, 144], hold_after=19)  # the
# same, held from there: the next update runs whole, so it takes the sample left
@given(dataset=st.integers(20, 400), per_device=st.integers(1, 9), devices=st.integers(1, 3), grows=st.booleans(),
       noise_every=st.sampled_from([None, 2, 4]), choices=st.lists(st.integers(0, 10_000), min_size=1, max_size=60),
       hold_after=st.one_of(st.none(), st.integers(1, 3000)))
def test_every_update_takes_the_chosen_batch_or_the_largest_rest_and_epochs_end_when_nothing_runs(
        dataset, per_device, devices, grows, noise_every, choices, hold_after):
    """And with ``hold_after``: from the first update that starts at or after that many samples
    on, the batch is the one chosen last and no update is split to measure the noise."""
    noise_every = noise_every if grows else None
    unit = devices if grows else per_device * devices
    if unit > dataset:
        return
    high = max(unit, min(dataset, 40 * unit) // unit * unit)
    options = {"policy": "error", "fixed_micro_batch": not grows, "noise_every": noise_every}
    runnable = GoodputController(per_device, devices, ref_batch_size=unit, max_batch=high, **options).candidates()
    if not runnable.size:
        return
    base = int(runnable[0])
    controller = GoodputController(per_device, devices, ref_batch_size=base, max_batch=high, **options)
    candidates = controller.candidates()
    schedule = AdaptiveSchedule(dataset, controller, seed=1, hold_after=hold_after)
    chosen = [controller.batch]
    for done, pick in enumerate(choices, start=1):
        if not schedule.held:  # what AdaptiveRun does: no decision once the run holds its batch
            controller.batch = int(candidates[pick % len(candidates)])
        chosen.append(controller.batch)
        schedule.extend(done)
    sizes = schedule.sizes
    held_from = None if hold_after is None else next(
        (update for update in range(len(sizes) + 1) if sum(sizes[:update]) >= hold_after), None)
    assert schedule.held_from == held_from
    assert AdaptiveSchedule(dataset, controller, seed=1, hold_after=hold_after).held_split(sizes) == (
        held_from, schedule.split)  # where it held follows from the batches alone (what a restore uses)
    if held_from is not None and held_from < len(sizes):
        assert set(chosen[held_from:len(sizes)]) == {chosen[held_from]}
    left = dataset
    for update, (size, want) in enumerate(zip(sizes, chosen, strict=False)):
        fits = [b for b in range(left, 0, -1)
                if runs_on(b, update, per_device, devices, grows, noise_every, held_from)]
        assert fits, "an update was decided in an epoch that had ended"
        assert size == (want if want <= left else fits[0]), (update, size, want, left)
        left -= size
        ended = not any(runs_on(b, update + 1, per_device, devices, grows, noise_every, held_from)
                        for b in range(1, left + 1))
        assert ended == ((update + 1) in schedule.starts), (update, left)
        if ended:
            left = dataset
    for epoch, first in enumerate(schedule.starts):  # the views hold exactly those updates, in order
        end = schedule.starts[epoch + 1] if epoch + 1 < len(schedule.starts) else len(schedule.sizes)
        assert schedule.epoch(epoch).batch_sizes.tolist() == schedule.sizes[first:end]


def test_a_controllers_recorded_updates_resume_with_the_next_epoch_and_are_checked():
    def controller():
        return GoodputController(4, 2, ref_batch_size=16, max_batch=24, min_batch=8, policy="error")

    one_update_epochs = controller()  # the first update fills the data set: epoch 0 is that update alone
    schedule = AdaptiveSchedule(16, one_update_epochs)
    assert schedule.resume_recorded() == 0 and schedule.epoch(0).batch_sizes.tolist() == [16]

    trained = controller()
    original = AdaptiveSchedule(50, trained, seed=2)
    for done in range(1, 12):
        trained.batches.append(original.sizes[done - 1])  # what an adapter records
        trained.batch = [16, 24, 8][done % 3]
        original.extend(done)
    assert len(original.starts) > 3
    ended = original.starts[2]  # the updates of epochs 0 and 1
    resumed_controller = controller()
    resumed_controller.batches = list(original.sizes[:ended])
    resumed = AdaptiveSchedule(50, resumed_controller, seed=2)
    assert resumed.resume_recorded() == 2 and resumed.starts[:3] == original.starts[:3]
    assert resumed.epoch(1).batch_sizes.tolist() == original.epoch(1).batch_sizes.tolist()

    mid_epoch = controller()
    mid_epoch.batches = list(original.sizes[:ended - 1])
    schedule = AdaptiveSchedule(50, mid_epoch, seed=2)
    before = (list(schedule.sizes), list(schedule.starts))
    with pytest.raises(InvalidValue, match=r"end inside epoch 1 \(\d+ of 50 samples\): resume from a controller state "
                                           r"saved at the end of an epoch"):
        schedule.resume_recorded()
    assert (schedule.sizes, schedule.starts) == before  # refused, changing nothing
    foreign = controller()
    foreign.batches = [24, 24, 24]  # 72 samples: not one epoch of 50
    with pytest.raises(InvalidValue, match="update 2 took 24 samples, which an adaptive run over 50 samples cannot"):
        AdaptiveSchedule(50, foreign).resume_recorded()


def test_a_batch_the_run_cannot_deal_is_refused_naming_it():
    controller = GoodputController(4, 2, ref_batch_size=16, max_batch=24, policy="error")
    schedule = AdaptiveSchedule(100, controller)
    controller.batch = 10  # 2 devices x 2 steps x 2.5
    with pytest.raises(InvalidValue, match="the controller chose batch 10, which this run cannot deal: batch=10"):
        schedule.extend(1)
    with pytest.raises(InvalidValue, match="policy='error', got policy='ragged'"):
        AdaptiveSchedule(100, GoodputController(4, 2, ref_batch_size=16, max_batch=24))


class ScriptedClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("marks", ["after each micro-step (PyTorch)", "before each micro-step (Keras)"])
def test_both_ways_of_marking_micro_steps_time_an_update_alike(marks):
    """An update of k micro-steps of m seconds and an update's own work of c seconds: its cycle is
    k m + c and its single micro-step's update m + c, however the adapter marks."""
    clock, k, m, c = ScriptedClock(), 3, 0.25, 2.0
    timer = UpdateClock(clock)
    measured = []
    for update in range(3):
        if update == 2:
            timer.restart()  # training stopped in between (a new epoch's DataLoader): not timed
        for _ in range(k):
            if marks.startswith("before"):
                timer.end_micro_step()
                clock.now += m
            else:
                clock.now += m
                timer.end_micro_step()
        if marks.startswith("before"):
            clock.now += c  # Keras: the update runs inside the last micro-step
            measured.append(update_timing(timer.measure()))
        else:
            measured.append(update_timing(timer.measure(ends_at_last_mark=True)))
            clock.now += c  # PyTorch: the update runs after the last mark
    assert measured[0] is None and measured[2] is None  # nothing to time from
    assert measured[1] == pytest.approx((k * m + c, m + c))
    assert update_timing([2 * 7.0, 2 * 3.0, 2.0], num_replicas=2) == (7.0, 3.0)  # the replicas' mean
    assert update_timing([7.0, 3.0, 1.0], num_replicas=2) is None  # one replica did not time it
    assert timer.measure(timed=False) == [0.0, 0.0, 0.0]


def measured_controller(**options) -> GoodputController:
    """A controller whose measurements make a larger batch pay (per-update cost, large noise)."""
    controller = GoodputController(64, 1, ref_batch_size=16, max_batch=1024, policy="error", **options)
    for _ in range(25):
        controller.record(controller.batch, NoiseEstimate(grad_sq=1.0, trace=2000.0), [(16, 1, 0.2 + 1e-3 * 16)])
    controller.batches.clear()
    return controller


def test_the_controller_decides_every_interval_updates_once_min_estimates_are_in():
    assert GoodputController(64, ref_batch_size=16, max_batch=64).min_estimates == 20  # the smoothing's horizon
    assert GoodputController(64, ref_batch_size=16, max_batch=64, decay=0.9).min_estimates == 10
    decided = []
    controller = measured_controller(interval=4, min_estimates=25)
    for _ in range(9):
        controller.batches.append(controller.batch)
        decided.append(controller.propose() is not None)
    assert decided == [False, False, False, True, False, False, False, True, False]
    early = measured_controller(min_estimates=26, interval=1)
    early.batches.append(16)
    assert early.propose() is None  # 25 estimates of the 26 asked


@settings(max_examples=40, deadline=None)
@given(devices=st.integers(1, 4), max_device=st.integers(1, 50), base=st.integers(1, 300), span=st.integers(0, 600))
def test_policy_errors_candidates_are_the_batches_its_plan_runs(devices, max_device, base, span):
    """With policy "error" the candidates are every batch in the bounds that make_plan runs
    without refusing (what trying each one gave), the bounds and the current batch among them."""
    try:
        controller = GoodputController(max_device, devices, ref_batch_size=base, max_batch=base + span, policy="error")
    except InvalidValue:
        return  # a base batch that does not split: refused
    found = controller.candidates().tolist()

    def planned(batch):
        try:
            make_plan(batch, max_device, devices, policy="error")
        except InvalidValue:
            return False
        return batch >= devices  # fewer samples than devices would leave a device idle: never a candidate

    multiples = range(-(-base // devices) * devices, base + span + 1, devices)
    assert found == sorted({b for b in [*multiples, base, base + span] if planned(b)})


def test_about_a_thousand_candidates_spread_over_a_wide_range_all_of_which_run():
    controller = GoodputController(64, 1, ref_batch_size=96, max_batch=200_000, policy="error", noise_every=4)
    found = controller.candidates()
    assert 500 <= len(found) <= 1004 and found[0] == 96 and controller.split.runs(found).all()
    above = np.arange(found[-1] + 1, controller.max_batch + 1)
    assert not controller.split.runs(above).any()  # the largest batch that runs is a candidate
    assert np.all(np.diff(np.log(found[len(found) // 2:])) < 0.02)  # and the range is covered geometrically


def test_one_history_row_per_update_and_each_change_logged(caplog):
    controller = measured_controller(interval=1, min_estimates=1)
    run = AdaptiveRun(AdaptiveSchedule(10_000, controller), "sqrt")
    with pytest.raises(InvalidValue, match=r"no update recorded since the last finish\(\): record\(\) it first"):
        run.finish(0, 0.1)
    with caplog.at_level(logging.INFO, logger="aikit.adaptive"):
        run.record(16, 16, 1, (0.3, 0.3), NoiseEstimate(grad_sq=1.0, trace=2000.0))
        row = run.finish(0, run.lr(0.1, 16))
    assert tuple(row) == HISTORY_KEYS and run.history == [row]
    assert row["step"] == 0 and row["seconds"] == 0.3 and row["noise_scale"] == pytest.approx(2000.0)
    (update, old, new, gain), = controller.changes
    assert (update, old) == (1, 16)
    assert caplog.messages == [
        f"adaptive batch: update 0: global batch 16 -> {new} from update 1 (1 GA steps x {new} per device on 1 "
        f"replica(s)), predicted goodput gain {(gain - 1) * 100:.1f}%, noise scale 2000, lr 0.1"]
    assert run.schedule.sizes[1] == new and run.lr(0.1, 4 * 16) == pytest.approx(0.2)  # sqrt rule
    untimed = AdaptiveRun(AdaptiveSchedule(100, GoodputController(8, ref_batch_size=16, max_batch=32, policy="error")))
    untimed.record(16, 8, 2, None, None)
    row = untimed.finish(0, 0.1)
    assert row["seconds"] is None and all(math.isnan(row[key]) for key in ("grad_sq", "trace", "noise_scale"))


def test_a_held_run_decides_and_measures_no_more_and_a_restored_schedule_holds_where_it_did():
    controller = measured_controller(interval=1, min_estimates=1)  # it doubles the batch at every decision
    estimates_before = controller.noise.updates
    run = AdaptiveRun(AdaptiveSchedule(10_000, controller, hold_after=100), "adascale")
    lrs = []
    for update in range(12):
        batch = run.schedule.sizes[update]
        lrs.append(run.lr(0.1, batch))
        run.record(batch, batch, 1, (0.3, 0.3), NoiseEstimate(grad_sq=1.0, trace=2000.0 * (update + 1)))
        run.finish(0, lrs[-1])
    schedule = run.schedule
    assert schedule.sizes[:3] == [16, 32, 64] and schedule.held_from == 3  # 112 samples before update 3
    assert set(schedule.sizes[3:]) == {64} and [change[0] for change in controller.changes] == [1, 2]
    assert controller.noise.updates == estimates_before + 3  # the held updates' noise is not recorded
    assert len(set(lrs[3:])) == 1  # so AdaScale's LR at the held batch stays
    assert schedule.split.noise_until == 3

    state = schedule.state_dict()
    restored = AdaptiveSchedule(10_000, measured_controller(interval=1, min_estimates=1), hold_after=100)
    restored.load(*restored.checked(state))
    assert (restored.held_from, restored.split) == (3, schedule.split)
    restored.extend(len(restored.sizes))
    assert restored.sizes[12] == 64
    with pytest.raises(InvalidValue, match=r"other settings \(hold_after 100 then, None now\): build the "):
        AdaptiveSchedule(10_000, measured_controller()).checked(state)
    unheld = AdaptiveSchedule(10_000, measured_controller()).state_dict()
    with pytest.raises(InvalidValue, match=r"other settings \(hold_after None then, 100 now\)"):
        AdaptiveSchedule(10_000, measured_controller(), hold_after=100).checked(unheld)
    with pytest.raises(InvalidValue, match="hold_after"):
        AdaptiveSchedule(10_000, measured_controller(), hold_after=0)


def test_a_hold_before_the_first_decision_is_warned_of_naming_the_fix():
    fresh = GoodputController(64, 1, ref_batch_size=16, max_batch=1024, policy="error")  # no noise estimate yet
    with pytest.warns(UserWarning, match=r"holds its batch 16 from update 1 \(hold_after=10 samples\), before the "
                                         r"controller's first decision: .* min_estimates=20 noise estimates are in "
                                         r"and has 0, .* give a larger hold_after, or a smaller min_estimates"):
        AdaptiveSchedule(10_000, fresh, hold_after=10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AdaptiveSchedule(10_000, measured_controller(min_estimates=25), hold_after=10)  # it could have decided
