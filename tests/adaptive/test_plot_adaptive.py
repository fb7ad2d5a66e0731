"""plot_adaptive draws PyTorch's AdaptiveOptimizer.history and Keras' fit_adaptive rows alike."""

from __future__ import annotations

import math

import matplotlib
import pytest

from aikit.plot_adaptive import plot_adaptive

matplotlib.use("Agg")

HISTORY = [(0, 64, 0.1, math.nan), (1, 64, 0.1, 300.0), (2, 128, 0.17, 350.0), (3, 128, 0.18, 420.0)]


def drawn(figure) -> list[tuple[list, list]]:
    return [(list(line.get_xdata()), list(line.get_ydata())) for axis in figure.axes for line in axis.get_lines()]


def test_torch_history_and_keras_rows_draw_the_same(tmp_path):
    rows = [{"epoch": 0, "step": u, "batch_size": b, "lr": lr, "noise_scale": n, "loss": 1.0}
            for u, b, lr, n in HISTORY]
    torch_figure = plot_adaptive(HISTORY, tmp_path / "torch.png")
    keras_figure = plot_adaptive(rows, tmp_path / "keras.png")
    assert (tmp_path / "torch.png").stat().st_size > 0 and (tmp_path / "keras.png").stat().st_size > 0
    lines = drawn(torch_figure)
    assert lines == drawn(keras_figure)
    assert ([1, 2, 3], [300.0, 350.0, 420.0]) in lines  # the noise scale, without the update before an estimate
    assert ([0, 1, 2, 3], [0.1, 0.1, 0.17, 0.18]) in lines  # the LR


def test_where_the_run_held_its_batch_is_marked_on_every_panel():
    figure = plot_adaptive(HISTORY, held_from=2)
    marks = [line for axis in figure.axes for line in axis.get_lines() if list(line.get_xdata()) == [2, 2]]
    assert len(marks) == 3 and marks[0].get_label() == "batch held from here"
    assert not [line for axis in plot_adaptive(HISTORY).axes for line in axis.get_lines()
                if list(line.get_xdata()) == [2, 2]]


def test_an_empty_history_is_refused():
    with pytest.raises(ValueError, match="no update in the history yet: train first, then plot"):
        plot_adaptive([])
