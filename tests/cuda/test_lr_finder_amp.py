"""The LR finder's AMP path on the device (``amp_backend="torch"``: fp16 autocast and a GradScaler,
the data moved from the CPU by the finder): a batch whose fp16 gradient overflows at a finite loss
is an update the scaler skips, and the range test makes it again at the same LR, so every LR of the
sequence is exactly one applied update; ``reset()`` puts back the weights and the scale. Through a
plain optimizer (torch-lr-finder's interface) and through the GA wrapper's own scaler."""

from __future__ import annotations

import math

import pytest
import torch
from gpu_case import lrs_of_updates
from torch.utils.data import DataLoader, TensorDataset

from aikit.ga.Torch.optim import Optimizer
from aikit.lr_finder.Torch import LRFinder

pytestmark = pytest.mark.cuda

SCALE, START, END, ITERATIONS, POISONED = 2.0**10, 1e-5, 1e-2, 8, 7


def data() -> TensorDataset:
    """Regression samples; sample 7 (update 1's last) has inputs of 1e3: finite in fp16 and a
    finite loss, but the scaled gradient entering the fp16 layer is ~5e5, past fp16's 65504."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(256, 4, generator=gen)
    y = x.sum(1, keepdim=True).sin()
    x[POISONED] = 1e3
    return TensorDataset(x, y)


@pytest.mark.parametrize("through", ["optimizer", "GA optimizer"])
def test_the_lr_finder_under_fp16_autocast_makes_a_skipped_update_again_at_its_lr(device, through):
    model = torch.nn.Linear(4, 1).to(device)
    with torch.no_grad():  # predictions near the targets: only the poisoned sample overflows
        model.weight.fill_(0.25)
        model.bias.zero_()
    inner = torch.optim.SGD(model.parameters(), lr=START, momentum=0.9)
    applied = lrs_of_updates(inner)
    scaler = torch.amp.GradScaler(device.type, init_scale=SCALE)
    amp = {"amp_backend": "torch", "amp_config": {"device_type": device.type, "dtype": torch.float16}}
    if through == "GA optimizer":  # the GA wrapper's scaler scales every micro-batch and steps once
        finder = LRFinder(model, Optimizer(inner, 2, scaler=scaler), torch.nn.MSELoss(), **amp)
        batch_size = 2
    else:
        finder = LRFinder(model, inner, torch.nn.MSELoss(), grad_scaler=scaler, **amp)
        batch_size = 4
    finder.range_test(DataLoader(data(), batch_size=batch_size), end_lr=END, num_iter=ITERATIONS,
                      diverge_th=math.inf, progress_bar=False)
    expected = [START * (END / START) ** (i / (ITERATIONS - 1)) for i in range(ITERATIONS)]
    assert finder.history["lr"] == pytest.approx(expected, rel=1e-12)
    assert applied == pytest.approx(expected, rel=1e-12)  # every LR applied once: the skipped one again
    assert scaler.get_scale() == SCALE / 2  # one update skipped
    assert all(math.isfinite(loss) and loss < 10 for loss in finder.history["loss"])  # the poisoned one not kept
    finder.reset()
    assert scaler.get_scale() == SCALE
    assert torch.equal(model.weight, torch.full_like(model.weight, 0.25)) and model.weight.device == device
