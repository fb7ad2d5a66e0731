"""The AutoLRS progress plot both adapters share: LR and loss over steps, search included."""

from __future__ import annotations

import os

from aikit.core.autolrs import Controller
from aikit.optional import require

COLOURS = {"warmup": "tab:gray", "trial": "tab:orange", "train": "tab:blue"}


def plot_progress(controller: Controller, path: str | os.PathLike | None = None, title: str = "AutoLRS"):
    """Two panels over all steps taken: the LR (log scale) and the training loss, coloured by
    phase (warmup, search trial, stage training), with each stage's start marked. Saved to
    ``path`` when given; returns the matplotlib figure."""
    plt = require("matplotlib.pyplot", "AutoLRS's plot")

    fig, (ax_lr, ax_loss) = plt.subplots(2, 1, sharex=True, figsize=(8, 6))
    for phase, colour in COLOURS.items():
        records = [r for r in controller.history if r.phase == phase]
        if records:
            steps = [r.step for r in records]
            ax_lr.scatter(steps, [r.lr for r in records], s=2, color=colour, label=phase)
            ax_loss.scatter(steps, [r.loss for r in records], s=2, color=colour, label=phase)
    for stage in controller.stages:
        for ax in (ax_lr, ax_loss):
            ax.axvline(stage.start_step, color="k", lw=0.5, alpha=0.3)
    ax_lr.set_yscale("log")
    if all(r.loss > 0 for r in controller.history):
        ax_loss.set_yscale("log")  # a diverging trial would flatten everything else
    ax_lr.set_ylabel("learning rate")
    ax_loss.set_ylabel("training loss")
    ax_loss.set_xlabel("step (search included)")
    ax_lr.legend(markerscale=4, loc="best")
    ax_lr.set_title(title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig
