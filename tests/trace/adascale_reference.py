"""AdaScale's gain computed the long way, for the tests: per-sample gradients at the parameters an
update saw, grouped into that update's micro-batches, then Johnson et al.'s unbiased estimates,
a bias-corrected exponential average and the gain, written out here without aikit's code."""

from __future__ import annotations

import torch
from torch import nn


def per_sample_grads(model: nn.Module, params: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One row per sample: the flattened gradient of its own loss at ``params``."""
    with torch.no_grad():
        for p, value in zip(model.parameters(), params, strict=True):
            p.copy_(value)
    rows = []
    for i in range(len(x)):
        model.zero_grad()
        nn.functional.mse_loss(model(x[i : i + 1]), y[i : i + 1, :1]).backward()
        rows.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    return torch.stack(rows)


class ReferenceGain:
    """Gains per param group (``groups``: each group's columns of the flattened gradient) and of the whole model."""

    def __init__(self, groups: list[list[int]], decay: float):
        self.groups, self.decay, self.updates = groups, decay, 0
        self.sq = [0.0] * len(groups)
        self.var = [0.0] * len(groups)

    def update(self, grads: torch.Tensor, parts: list[list[int]], micro: int) -> tuple[list[float], float]:
        """Fold in one update whose micro-batches hold the samples ``parts`` (rows of ``grads``)."""
        k = len(parts)
        batch = k * micro
        if k >= 2:
            self.updates += 1
            for g, cols in enumerate(self.groups):
                part_means = torch.stack([grads[part][:, cols].mean(0) for part in parts])
                mean = grads[[i for part in parts for i in part]][:, cols].mean(0)
                a = float((part_means**2).sum(1).mean())
                m = float((mean**2).sum())
                trace = (a - m) * batch / (k - 1)
                sq = m - trace / batch
                self.var[g] = self.decay * self.var[g] + (1 - self.decay) * trace
                self.sq[g] = self.decay * self.sq[g] + (1 - self.decay) * sq
        if not self.updates:
            return [1.0] * len(self.groups), 1.0
        unbias = 1 - self.decay**self.updates
        var = [v / unbias for v in self.var]
        sq = [s / unbias for s in self.sq]
        per_group = [ratio(v, s, batch, micro) for v, s in zip(var, sq, strict=True)]
        return per_group, ratio(sum(var), sum(sq), batch, micro)


def ratio(trace: float, sq: float, batch: int, micro: int) -> float:
    trace, sq = max(trace, 0.0), max(sq, 0.0)
    return 1.0 if trace == 0 and sq == 0 else (trace / micro + sq) / (trace / batch + sq)
