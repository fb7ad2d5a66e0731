"""What the Accelerate tests and their torchrun worker share: the digits in float64 with a third of
the labels ignored (a language model's padding, in miniature), a small MLP, the loops written
through aikit's GlobalBatch, and the same training written by hand as big-batch steps."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aikit.datasets import digits

GLOBAL_BATCH = 128
UPDATES = 5  # per epoch: 640 samples
EPOCHS = 2
IGNORE = -100
OOM = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
       "allocate {} bytes. Error code 12 (Cannot allocate memory)")  # the CPU allocator's words (torch 2.13)


def data(ignore: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    x, y, _, _ = digits()
    n = GLOBAL_BATCH * UPDATES
    x, y = torch.from_numpy(x[:n]).double().flatten(1), torch.from_numpy(y[:n]).clone()
    if not ignore:
        return x, y
    ignored = torch.rand(n, generator=torch.Generator().manual_seed(0)) < 0.35
    y[ignored] = IGNORE
    return x, y


class Net(nn.Module):
    """An MLP whose forward fails as the CPU allocator does above ``fits`` samples."""

    def __init__(self, fits: int | None = None):
        super().__init__()
        torch.manual_seed(1)
        self.body = nn.Sequential(nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 10)).double()
        self.fits, self.sizes = fits, []

    def forward(self, x):
        self.sizes.append(len(x))
        if self.fits is not None and len(x) > self.fits:
            raise RuntimeError(OOM.format(len(x) * 4_000_000))
        return self.body(x)


def optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)


def by_hand(ignore: bool = True) -> Net:
    """Big-batch steps: every update the mean loss over its 128 samples' labels not ignored."""
    model, (x, y) = Net(), data(ignore)
    opt = optimizer(model)
    for _ in range(EPOCHS):
        for start in range(0, len(y), GLOBAL_BATCH):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[start:start + GLOBAL_BATCH]), y[start:start + GLOBAL_BATCH],
                                        ignore_index=IGNORE).backward()
            opt.step()
    return model


def token_weighted(accelerator, global_batch, device_batch: int, fits: int | None = None, totals=None) -> Net:
    """One try of the loop ``find_executable_batch_size`` runs: each update's summed losses over
    the labels not ignored, divided by their count over every process (GlobalBatch.updates)."""
    accelerator.free_memory()
    model = Net(fits)
    opt = optimizer(model)
    loader = DataLoader(TensorDataset(*data()), batch_size=device_batch, drop_last=True)
    prepared, opt, loader = accelerator.prepare(model, opt, loader)
    for _ in range(EPOCHS):
        for update in global_batch.updates(loader, count=lambda batch: (batch[1] != IGNORE).sum()):
            if totals is not None:
                totals.append(update.total)
            for x, y in update.accumulate(prepared):
                loss_sum = nn.functional.cross_entropy(prepared(x), y, ignore_index=IGNORE, reduction="sum")
                accelerator.backward(update.loss(loss_sum))
            opt.step()
            opt.zero_grad()
    return model
