"""What the resize tests and their worker share: data, model, trace, and the big-batch reference.

The reference trains each step of the trace as one real big-batch step (the step's samples
from :class:`aikit.core.schedule.Schedule`, one mean loss, one SGD update at the linear-rule
LR): what any elastic run, killed and resized or not, must end at.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from aikit.core.scaling import scaled_lr
from aikit.core.schedule import Schedule
from aikit.core.trace import Trace

N = 256  # samples of the digits training split used
MINIBATCH = 8
SEED = 7
LR, MOMENTUM, REF_BATCH = 0.05, 0.9, 32
EPOCHS = 2
# epoch 0: 16+32+48+32+64+16+32 = 240 samples in 7 steps (16 left out); epoch 1 starts at 48
TRACE_SIZES = [16, 32, 48, 32, 64]


def trace() -> Trace:
    return Trace(TRACE_SIZES, when_exhausted="cycle", source="resize-test")


def digits_subset() -> tuple[np.ndarray, np.ndarray]:
    """The first N training digits, flattened, float64."""
    from aikit.datasets import digits

    x, y, _, _ = digits(dtype=np.float64)
    return x[:N].reshape(N, -1), y[:N]


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.Tanh(), torch.nn.Linear(16, 10)).double()


def make_sgd(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)


def loss_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def total_steps(epochs: int = EPOCHS) -> int:
    schedule = Schedule(trace(), N, 1, MINIBATCH, SEED)
    return sum(len(schedule.epoch(e)) for e in range(epochs))


def train_big_batches(model: torch.nn.Module, opt: torch.optim.Optimizer, x: np.ndarray, y: np.ndarray,
                      epochs: int = EPOCHS) -> None:
    """The uninterrupted run: one big-batch update per trace step, at the linear rule's LR from
    the optimizer's own."""
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    base = opt.param_groups[0]["lr"]
    schedule = Schedule(trace(), N, 1, MINIBATCH, SEED)
    for epoch in range(epochs):
        plan = schedule.epoch(epoch)
        for step in range(len(plan)):
            idx = torch.from_numpy(plan.step_indices(step))
            opt.zero_grad()
            loss_of(model, xt[idx], yt[idx]).backward()
            opt.param_groups[0]["lr"] = scaled_lr(base, int(plan.batch_sizes[step]), REF_BATCH, "linear")
            opt.step()


def reference(x: np.ndarray, y: np.ndarray, epochs: int = EPOCHS) -> dict[str, torch.Tensor]:
    """Final weights of the uninterrupted run with SGD at ``LR``."""
    model = make_model()
    train_big_batches(model, make_sgd(model), x, y, epochs)
    return model.state_dict()


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def train(x, y, model, opt, state, commit=True, stop_after_micro=None) -> None:
    """Train to the end with the trace optimizer ``opt`` (or stop after that many micro-batches:
    a kill); commit every update unless ``commit=False``."""
    loader = DataLoader(TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), batch_sampler=opt.sampler)
    micro = 0
    for _ in state.epochs(EPOCHS):
        for xb, yb in loader:
            loss_of(model, xb, yb).backward()
            micro += 1
            if opt.step() and commit:
                state.commit()
            if micro == stop_after_micro:
                return
