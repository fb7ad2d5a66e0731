"""What the sharded (FSDP2) resize tests and their worker share: data, model, trace, and the
uninterrupted big-batch run every resized run must equal.

Each trace step is one update on the step's global batch (the samples
:class:`aikit.core.schedule.Schedule` gives it), planned for the world that trains it by
``aikit.elastic.Torch.init(G, M)``: 12 and 16 samples split evenly over 1 or 2 workers, 16 and 8
raggedly over 3 (micro-batches of 3, 3, 3, 3, 2, 2 and 3, 3, 2). The loss is summed over a
micro-batch's samples and divided by the step's global batch, and the GA wrapper sums
(``reduction="sum"``): every micro-batch then weighs its share of the step whatever its size,
and FSDP2's average over the ranks is undone by the wrapper's world-size factor.
"""

from __future__ import annotations

import torch

from aikit.core.schedule import Schedule
from aikit.core.trace import Trace

N, FEATURES, MAX_MICRO, SEED, LR = 48, 6, 4, 3, 0.05
TRACE_SIZES = [12, 16, 8, 16]  # epoch 0: 12 + 16 + 8 = 36 of 48 (the next 16 would not fit); epoch 1 goes on
EPOCHS = 2


def trace() -> Trace:
    return Trace(TRACE_SIZES, when_exhausted="cycle", source="fsdp-test")


def schedule() -> Schedule:
    """Which samples form each step (one replica: only the global batches are taken from it)."""
    return Schedule(trace(), N, 1, MAX_MICRO, SEED)


def steps() -> list[tuple[int, int]]:
    """(epoch, step) of every update of the run, in order."""
    plan = schedule()
    return [(epoch, step) for epoch in range(EPOCHS) for step in range(len(plan.epoch(epoch)))]


def data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(N, FEATURES, generator=gen, dtype=torch.float64)
    return x, torch.tanh(x @ torch.randn(FEATURES, 1, generator=gen, dtype=torch.float64))


def model(seed: int = 0) -> torch.nn.Module:
    """10 hidden units (shards of 4, 4, 2 over 3 ranks) and one output (shards of 1, 0, 0)."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 10), torch.nn.Tanh(), torch.nn.Linear(10, 1)).double()


def adamw(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=LR, weight_decay=0.01)


def reference(updates: int | None = None) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The uninterrupted run in one process without FSDP or GA, one AdamW step per trace step on
    its whole global batch (the first ``updates`` steps): its weights, and its AdamW state by
    parameter name (``name.exp_avg``, ``name.exp_avg_sq``, ``name.step``)."""
    x, y = data()
    net = model()
    opt = adamw(net.parameters())
    plan = schedule()
    for epoch, step in steps()[:updates]:
        index = torch.as_tensor(plan.epoch(epoch).step_indices(step))
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x[index]), y[index], reduction="mean").backward()
        opt.step()
    names = {p: name for name, p in net.named_parameters()}
    state = {f"{names[p]}.{key}": value.detach().clone() for p, values in opt.state.items()
             for key, value in values.items()}
    return {k: v.detach().clone() for k, v in net.state_dict().items()}, state
