"""The adaptive-batch plot of both adapters: the global batch the controller chose, the smoothed
gradient noise scale it chose it from, and the LR the rule gave, over the updates. It takes the
history rows both adapters keep (:func:`aikit.core.adaptive.history_row`: PyTorch's
``AdaptiveOptimizer.history``, the list Keras' ``fit_adaptive`` returns)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

from aikit.core.errors import InvalidValue
from aikit.optional import require


def plot_adaptive(history: Sequence[tuple[int, int, float, float]] | Sequence[Mapping],
                  path: str | os.PathLike | None = None, title: str = "aikit adaptive batch",
                  held_from: int | None = None):
    """Three panels over the updates of ``history``: the global batch, the noise scale (log scale,
    with the batch drawn over it: the batch follows the noise scale) and the LR. ``history`` is
    the rows of an adaptive run (keys ``step``, ``batch_size``, ``lr`` and ``noise_scale`` are
    drawn), or tuples ``(update, batch, lr, noise_scale)``: PyTorch's history before both
    adapters kept one row format. ``held_from``: the update from which the run held its batch
    (``sampler.schedule.held_from``), marked on every panel. Saved to ``path`` when given;
    returns the figure."""
    plt = require("matplotlib.pyplot", "the adaptive batch plot")
    if not history:
        raise InvalidValue("no update in the history yet: train first, then plot")
    if isinstance(history[0], Mapping):
        history = [(row["step"], row["batch_size"], row["lr"], row["noise_scale"]) for row in history]
    updates, batches, lrs, noise = (list(column) for column in zip(*history, strict=True))
    fig, (ax_batch, ax_noise, ax_lr) = plt.subplots(3, 1, sharex=True, figsize=(8, 7))
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
    ax_batch.set_title(title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig
