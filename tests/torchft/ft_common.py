"""What the TorchFT replica-group tests share: the data, the model, the two trainings (a trace and a
GA plan) and the one-process big-batch run every committed update is compared with.

A small float64 MLP on synthetic data, SGD with momentum (so a group that heals needs the
optimizer's state, not only the weights). The trace's steps deal 5, 3, 4, 2, 5 and 6 micro-batches
of 4 samples (uneven over 2 and 3 groups); the GA run's global batch is 25 (13 + 12 over 2 groups).
"""

from __future__ import annotations

import numpy as np
import torch

from aikit.core.schedule import Schedule

SAMPLES, FEATURES, CLASSES = 120, 6, 3
TRACE, MICRO, SEED, REF_BATCH = [20, 12, 16, 8, 20, 24], 4, 7, 16  # a cycling trace: 6 steps an epoch
GLOBAL_BATCH, MAX_DEVICE_BATCH = 25, 5  # the GA run: 4 updates an epoch
LR, MOMENTUM = 0.1, 0.9


def data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=generator, dtype=torch.float64)
    y = torch.randint(0, CLASSES, (SAMPLES,), generator=generator)
    return x, y


def model() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 5), torch.nn.Tanh(), torch.nn.Linear(5, CLASSES)).double()


def flat(net: torch.nn.Module) -> list[float]:
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()]).tolist()


def trace_schedule() -> Schedule:
    from aikit.core.trace import Trace

    return Schedule(Trace(TRACE, "cycle"), SAMPLES, 1, micro_batch=MICRO, seed=SEED)


def plan_schedule() -> Schedule:
    return Schedule(GLOBAL_BATCH, SAMPLES, 1, micro_batch=GLOBAL_BATCH, seed=SEED)


def reference(path: str, epochs: int) -> list[dict]:
    """The one-process run: every update one step of plain torch on its whole global batch (the
    mean loss over its samples), at the LR the trace's linear rule gives it. One row per update:
    its samples and the parameters after it."""
    x, y = data()
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    schedule = trace_schedule() if path == "trace" else plan_schedule()
    rows = []
    for epoch in range(epochs):
        plan = schedule.epoch(epoch)
        for step in range(len(plan)):
            indices = plan.step_indices(step)
            for group in optimizer.param_groups:
                group["lr"] = LR * len(indices) / REF_BATCH if path == "trace" else LR
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(net(x[indices]), y[indices]).backward()
            optimizer.step()
            rows.append({"epoch": epoch, "indices": sorted(indices.tolist()), "params": flat(net)})
    return rows


def worst_difference(a: list[float], b: list[float]) -> float:
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
