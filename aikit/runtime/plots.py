"""The plots both frameworks' adapters draw, from the numbers they keep: the LR range test's loss
over the LR (torch-lr-finder's plot), AutoLRS's progress, and the adaptive batch. Framework-free:
matplotlib is imported when a plot is drawn (the ``plot`` extra)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from aikit.core.errors import InvalidValue
from aikit.optional import require

if TYPE_CHECKING:  # the LR finders and the adaptive plot need not load AutoLRS
    from aikit.core.autolrs import Controller

COLOURS = {"warmup": "tab:gray", "range": "tab:purple", "trial": "tab:orange", "train": "tab:blue",
           "anneal": "tab:green", "done": "tab:green"}
BLOWN_UP = 10.0  # a loss this many times the run's typical loss is marked, not plotted


def _panels(count: int, height: float, user: str):
    """A figure of ``count`` panels over one x axis, and the panels."""
    plt = require("matplotlib.pyplot", user)
    return plt.subplots(count, 1, sharex=True, figsize=(8, height))


def _finished(fig, title: str, path: str | os.PathLike | None):
    """``fig`` titled over its first panel, laid out, and saved to ``path`` when given."""
    fig.axes[0].set_title(title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def plot_range_test(lrs, losses, log_lr: bool, show_lr: float | None, ax, marked: tuple[float, float, str] | None):
    """Loss against LR as torch-lr-finder draws it, on ``ax`` or a new figure (then shown):
    ``marked``, the suggestion's (lr, loss, label), as a red dot; ``show_lr`` as a red line."""
    plt = require("matplotlib.pyplot", "LRFinder.plot()")
    fig = None
    if ax is None:
        fig, ax = plt.subplots()
    ax.plot(lrs, losses)
    if marked is not None:
        ax.scatter(marked[0], marked[1], s=75, marker="o", color="red", zorder=3, label=marked[2])
        ax.legend()
    if log_lr:
        ax.set_xscale("log")
    ax.set_xlabel("Learning rate")
    ax.set_ylabel("Loss")
    if show_lr is not None:
        ax.axvline(x=show_lr, color="red")
    if fig is not None:
        plt.show()
    return ax


def plot_progress(controller: Controller, path: str | os.PathLike | None = None, title: str = "AutoLRS"):
    """Two panels over all steps taken: the LR (log scale) and the training loss (log scale),
    coloured by phase (warmup, range test, search trial, stage training, anneal), with each
    stage's start marked. A diverged step (NaN/inf, or a loss over ten times the run's median)
    is marked with a red x at the top of the loss panel instead of plotted, so one blow-up does
    not flatten every other point. Saved to ``path`` when given; returns the matplotlib figure."""
    fig, (ax_lr, ax_loss) = _panels(2, 6, "AutoLRS's plot")
    finite = [r.loss for r in controller.history if math.isfinite(r.loss)]
    cap = BLOWN_UP * max(float(np.median(finite)), finite[0]) if finite else math.inf
    shown = [r for r in controller.history if math.isfinite(r.loss) and r.loss <= cap]
    diverged = [r for r in controller.history if not (math.isfinite(r.loss) and r.loss <= cap)]
    for phase, colour in COLOURS.items():
        records = [r for r in controller.history if r.phase == phase]
        if records:
            ax_lr.scatter([r.step for r in records], [r.lr for r in records], s=2, color=colour, label=phase)
        records = [r for r in shown if r.phase == phase]
        if records:
            ax_loss.scatter([r.step for r in records], [r.loss for r in records], s=2, color=colour)
    if shown and all(r.loss > 0 for r in shown):
        ax_loss.set_yscale("log")
    if diverged:
        top = max((r.loss for r in shown), default=1.0)
        ax_loss.scatter([r.step for r in diverged], [top] * len(diverged), marker="x", color="red", s=20,
                        label=f"diverged ({len(diverged)} steps, values not plotted)")
        ax_loss.legend(loc="best")
    for stage in controller.stages:
        for ax in (ax_lr, ax_loss):
            ax.axvline(stage.start_step, color="k", lw=0.5, alpha=0.3)
    if any(r.lr > 0 for r in controller.history):
        ax_lr.set_yscale("log")
    ax_lr.set_ylabel("learning rate")
    ax_loss.set_ylabel("training loss")
    ax_loss.set_xlabel("step (search included)")
    ax_lr.legend(markerscale=4, loc="best")
    return _finished(fig, title, path)


def plot_adaptive(history: Sequence[tuple[int, int, float, float]] | Sequence[Mapping],
                  path: str | os.PathLike | None = None, title: str = "aikit adaptive batch",
                  held_from: int | None = None):
    """Three panels over the updates of ``history``: the global batch, the noise scale (log scale,
    with the batch drawn over it: the batch follows the noise scale) and the LR. ``history`` is
    the rows of an adaptive run (:func:`aikit.core.adaptive.history_row`: PyTorch's
    ``AdaptiveOptimizer.history``, the list Keras' ``fit_adaptive`` returns; keys ``step``,
    ``batch_size``, ``lr`` and ``noise_scale`` are drawn), or tuples ``(update, batch, lr,
    noise_scale)``: PyTorch's history before both adapters kept one row format. ``held_from``: the
    update from which the run held its batch (``sampler.schedule.held_from``), marked on every
    panel. Saved to ``path`` when given; returns the figure."""
    if not history:
        raise InvalidValue("no update in the history yet: train first, then plot")
    fig, (ax_batch, ax_noise, ax_lr) = _panels(3, 7, "the adaptive batch plot")
    if isinstance(history[0], Mapping):
        history = [(row["step"], row["batch_size"], row["lr"], row["noise_scale"]) for row in history]
    updates, batches, lrs, noise = (list(column) for column in zip(*history, strict=True))
    ax_batch.step(updates, batches, where="post", color="tab:blue")
    ax_batch.set_ylabel("global batch")
    shown = [(u, n) for u, n in zip(updates, noise, strict=True) if math.isfinite(n) and n > 0]
    if shown:
        ax_noise.plot(*zip(*shown, strict=True), color="tab:orange", label="noise scale tr(Σ)/|G|²")
        ax_noise.set_yscale("log")
    ax_noise.step(updates, batches, where="post", color="tab:blue", alpha=0.5, label="global batch")
    ax_noise.set_ylabel("samples")
    ax_noise.legend(loc="upper left", fontsize="small")
    ax_lr.plot(updates, lrs, color="tab:green")
    ax_lr.set_ylabel("LR")
    ax_lr.set_xlabel("update")
    if held_from is not None:
        for axis in (ax_batch, ax_noise, ax_lr):
            axis.axvline(held_from, color="grey", linestyle=":", label="batch held from here")
        ax_batch.legend(loc="upper left", fontsize="small")
    return _finished(fig, title, path)
