"""aikit.core.lr_range: LR sequences, smoothing, stop rules and suggestions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aikit.core import lr_range
from aikit.core.lr_range import BOTTOM_NEAR, LossTracker, lr_sequence, suggest

lrs = st.floats(1e-8, 1e3)
iterations = st.integers(2, 300)


def test_exp_from_1e_5_to_1e_1_over_5_iterations_gives_the_five_decades():
    assert lr_sequence(1e-5, 1e-1, 5, "exp") == pytest.approx([1e-5, 1e-4, 1e-3, 1e-2, 1e-1], rel=1e-12)


def test_linear_from_1e_5_to_5e_5_over_5_iterations_gives_one_to_five_e_5():
    assert lr_sequence(1e-5, 5e-5, 5, "LINEAR") == pytest.approx([1e-5, 2e-5, 3e-5, 4e-5, 5e-5], rel=1e-12)


@given(lrs, lrs, iterations, st.sampled_from(["exp", "linear"]))
def test_a_sequence_starts_at_start_ends_at_end_and_moves_one_way(start, end, num_iter, mode):
    seq = lr_sequence(start, end, num_iter, mode)
    assert len(seq) == num_iter
    assert seq[0] == start
    assert seq[-1] == pytest.approx(end, rel=1e-12)
    steps = np.diff(seq)
    assert (steps >= -1e-12 * end).all() if end >= start else (steps <= 1e-12 * start).all()


@given(lrs, lrs, iterations)
def test_exp_steps_by_a_constant_ratio_and_linear_by_a_constant_difference(start, end, num_iter):
    ratios = np.diff(np.log(lr_sequence(start, end, num_iter, "exp")))
    np.testing.assert_allclose(ratios, math.log(end / start) / (num_iter - 1), rtol=1e-6, atol=1e-9)
    steps = np.diff(lr_sequence(start, end, num_iter, "linear"))
    np.testing.assert_allclose(steps, (end - start) / (num_iter - 1), rtol=1e-6, atol=1e-12 * max(start, end))


@pytest.mark.parametrize(
    "args, message",
    [
        ((1e-3, 1.0, 1), "num_iter must be an integer larger than 1 (the test needs a start and an end LR), got 1"),
        ((1e-3, 1.0, 0), "num_iter must be an integer larger than 1 (the test needs a start and an end LR), got 0"),
        ((1e-3, 1.0, 5.0), "num_iter must be an integer larger than 1 (the test needs a start and an end LR), got 5.0"),
        ((1e-3, 1.0, 5, "cosine"), "step_mode must be one of ('exp', 'linear') (any case), got 'cosine'"),
        ((0.0, 1.0, 5, "exp"), "step_mode='exp' needs start_lr > 0 and end_lr > 0, got start_lr=0.0, end_lr=1.0; "
                               "pass a positive start_lr or use step_mode='linear'"),
        ((1e-3, float("nan"), 5), "end_lr must be finite, got nan"),
        ((1e-3, "1", 5), "end_lr must be a number, got '1'"),
        ((-1.0, 1.0, 5, "linear"), "learning rates must be >= 0, got start_lr=-1.0, end_lr=1.0"),
    ],
)
def test_bad_sequence_arguments_are_refused_by_name(args, message):
    with pytest.raises(ValueError) as error:
        lr_sequence(*args)
    assert str(error.value) == message


def test_linear_may_start_at_zero():
    assert lr_sequence(0, 1, 3, "linear") == [0.0, 0.5, 1.0]


@given(st.lists(st.floats(0.01, 100), min_size=1, max_size=50), st.floats(1e-6, 0.99))
def test_smoothing_is_the_exponential_moving_average_started_at_the_first_loss(losses, f):
    tracker = LossTracker(smooth_f=f, diverge_th=float("inf"))
    recorded = [tracker.update(loss) for loss in losses]
    expected = [losses[0]]
    for loss in losses[1:]:
        expected.append(f * loss + (1 - f) * expected[-1])
    assert recorded == pytest.approx(expected, rel=1e-12)
    assert tracker.best == min(recorded)
    assert tracker.stop_reason is None


def test_smooth_f_zero_records_the_raw_losses():
    tracker = LossTracker(smooth_f=0, diverge_th=100)
    assert [tracker.update(x) for x in [3.0, 1.0, 2.0]] == [3.0, 1.0, 2.0]


def test_the_test_stops_at_the_first_loss_above_diverge_th_times_the_best():
    tracker = LossTracker(smooth_f=0, diverge_th=5)
    for loss in [2.0, 1.0, 4.9, 5.0]:
        tracker.update(loss)
        assert tracker.stop_reason is None
    tracker.update(5.01)
    assert tracker.stop_reason == "the loss has diverged"


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_loss_stops_the_test(bad):
    tracker = LossTracker(smooth_f=0.05, diverge_th=5)
    tracker.update(1.0)
    tracker.update(bad)
    assert tracker.stop_reason == f"the loss is {bad}"


def test_negative_losses_do_not_stop_the_test_at_once_but_a_rise_does():
    tracker = LossTracker(smooth_f=0, diverge_th=5)
    for loss in [-1.0, -2.0, -1.5, 5.9]:  # 5.9 - (-2) = 7.9 <= 4 * 2
        tracker.update(loss)
        assert tracker.stop_reason is None
    tracker.update(6.1)  # 8.1 > 8
    assert tracker.stop_reason == "the loss has diverged"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"smooth_f": 1.0}, "smooth_f must lie in [0, 1), got 1.0; 0 turns smoothing off"),
        ({"smooth_f": -0.1}, "smooth_f must lie in [0, 1), got -0.1; 0 turns smoothing off"),
        ({"diverge_th": 0.5}, "diverge_th must be a number >= 1 (the test stops once loss > diverge_th * best), "
                              "got 0.5; pass float('inf') never to stop on divergence"),
    ],
)
def test_bad_tracker_arguments_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError) as error:
        LossTracker(**kwargs)
    assert str(error.value) == message


# --- suggestions on known curves ------------------------------------------------------------


@pytest.mark.parametrize(
    "losses, index",
    [([10, 8, 4, 1, 4, 16], 2), ([1, 0, 1, 2, 3, 4], 0), ([0, 1, 2, 3, 4, 3], 5)],
)
def test_steepest_is_the_point_of_the_most_negative_gradient(losses, index):
    lrs = [10.0**i for i in range(len(losses))]
    assert suggest(lrs, losses) == (lrs[index], index, "steepest")


def test_minimum_is_a_tenth_of_the_lr_at_the_lowest_loss():
    lrs = [1e-4, 1e-3, 1e-2, 1e-1, 1.0]
    assert suggest(lrs, [3, 2, 1, 0.5, 9], "minimum") == (1e-2, 3, "minimum")


def test_valley_is_halfway_down_the_longest_decreasing_run():
    # 10 > 9 > ... > 1 from index 1 to 10 (a bump at 11 and a short dip after it do not count)
    losses = [1.5, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 5, 4.5, 20]
    lrs = [float(i) for i in range(len(losses))]
    assert suggest(lrs, losses, "valley") == (5.0, 5, "valley")


@given(st.lists(st.floats(0.0, 100.0), min_size=2, max_size=60))
def test_bottom_is_the_first_lr_near_the_lowest_loss_never_past_it(losses):
    lrs = np.geomspace(1e-6, 10.0, len(losses)).tolist()
    got = suggest(lrs, losses, "bottom")
    lowest, near = min(losses), min(losses) + BOTTOM_NEAR * (losses[0] - min(losses))
    assert got.lr == lrs[got.index] and losses[got.index] <= near  # near the lowest loss
    assert all(loss > near for loss in losses[:got.index])  # the first such
    assert got.index <= losses.index(lowest)  # never past the lowest loss


def test_bottom_reads_a_long_floor_at_its_start_not_at_its_lowest_point():
    # a drop from 5 to a floor near 3 (index 3 on), its lowest point late on it, then a blow-up
    losses = [5.0, 4.5, 3.5, 3.1, 3.05, 3.08, 3.02, 3.0, 3.04, 6.0]
    lrs = [float(i) for i in range(len(losses))]
    assert suggest(lrs, losses, "bottom") == (3.0, 3, "bottom")


def test_slide_walks_left_until_the_gradients_across_the_window_agree():
    # a flat start, a straight descent from index 10 on, then a blow-up over the last points
    losses = [5.0] * 10 + [5.0 - 0.1 * i for i in range(1, 21)] + [3.5, 5.0, 9.0]
    lrs = [float(i) for i in range(len(losses))]
    got = suggest(lrs, losses, "slide", lr_diff=5, thresh=0.01)
    grad = np.gradient(losses)
    left = got.index - 1  # the first window, walking left, whose ends agree
    assert abs(grad[left + 5] - grad[left]) <= 0.01
    assert all(abs(grad[i + 5] - grad[i]) > 0.01 for i in range(got.index, len(losses) - 5))
    assert got.lr == lrs[got.index]


def test_suggestions_skip_points_and_return_indices_into_the_whole_history():
    losses = [0.0, 100.0, 10, 8, 4, 1, 4, 16, -50.0]
    lrs = [float(i) for i in range(len(losses))]
    assert suggest(lrs, losses, skip_start=2, skip_end=1) == (4.0, 4, "steepest")


def test_a_final_non_finite_loss_is_left_out_of_the_suggestion():
    assert suggest([1.0, 2.0, 3.0, 4.0], [3.0, 2.0, 0.5, float("nan")], "minimum").index == 2


def test_a_non_finite_loss_inside_the_curve_is_refused():
    with pytest.raises(ValueError, match=r"losses must be finite .* got nan at index 1"):
        suggest([1.0, 2.0, 3.0], [3.0, float("nan"), 1.0])


def test_too_few_points_to_suggest_is_an_error_naming_the_count():
    with pytest.raises(RuntimeError) as error:
        suggest(list(range(12)), list(range(12)), skip_start=5, skip_end=6)
    assert str(error.value) == "Need at least 13 iterations to suggest a learning rate. Got 12"


def test_unknown_method_and_negative_skips_are_refused():
    with pytest.raises(ValueError,
                       match=r"must be one of \('steepest', 'valley', 'minimum', 'slide', 'bottom'\), got 'best'"):
        suggest([1, 2, 3], [3, 2, 1], "best")
    with pytest.raises(ValueError, match="skip_start cannot be negative, got -1"):
        suggest([1, 2, 3], [3, 2, 1], skip_start=-1)
    with pytest.raises(ValueError, match="skip_end cannot be negative, got -2"):
        lr_range.trim([1, 2, 3], 0, -2)


@given(st.lists(st.tuples(st.floats(1e-9, 1e3), st.floats(-1e6, 1e6)), max_size=30))
def test_a_history_survives_a_csv_round_trip_to_the_bit(tmp_path_factory, rows):
    history = {"lr": [r[0] for r in rows], "loss": [r[1] for r in rows]}
    path = tmp_path_factory.mktemp("csv") / "history.csv"
    lr_range.write_history(path, history)
    assert lr_range.read_history(path) == history
    assert path.read_text().splitlines()[0] == "lr,loss"


def test_the_core_and_the_shared_results_and_cache_import_no_framework():
    import subprocess
    import sys

    code = ("import sys, aikit.core.lr_range, aikit.runtime.range_results, aikit.runtime.state_cache; "
            "print(sorted(m for m in ('torch', 'tensorflow', 'keras', 'matplotlib') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
