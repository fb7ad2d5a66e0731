"""The AutoLRS progress plot both adapters share: LR and loss over steps, search included."""

from __future__ import annotations

import math
import os

import numpy as np

from aikit.core.autolrs import Controller
from aikit.optional import require

COLOURS = {"warmup": "tab:gray", "range": "tab:purple", "trial": "tab:orange", "train": "tab:blue",
           "anneal": "tab:green", "done": "tab:green"}
BLOWN_UP = 10.0  # a loss this many times the run's typical loss is marked, not plotted


def plot_progress(controller: Controller, path: str | os.PathLike | None = None, title: str = "AutoLRS"):
    """Two panels over all steps taken: the LR (log scale) and the training loss (log scale),
    coloured by phase (warmup, range test, search trial, stage training, anneal), with each
    stage's start marked. A diverged step (NaN/inf, or a loss over ten times the run's median)
    is marked with a red x at the top of the loss panel instead of plotted, so one blow-up does
    not flatten every other point. Saved to ``path`` when given; returns the matplotlib figure."""
    plt = require("matplotlib.pyplot", "AutoLRS's plot")

    fig, (ax_lr, ax_loss) = plt.subplots(2, 1, sharex=True, figsize=(8, 6))
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
    ax_lr.set_title(title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
