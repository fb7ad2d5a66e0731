"""What the Lightning and Hugging Face tests share: a small float64 classification problem and
AutoLRS settings short enough for a test."""

from __future__ import annotations

import torch

AUTOLRS = {"tau": 8, "tau_max": 8, "trial_ratio": 2, "trials": 2, "warmup_steps": 2, "warmup_lr": 0.01, "seed": 3}


def data(n: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=generator, dtype=torch.float64)
    y = (x @ torch.randn(6, 3, generator=generator, dtype=torch.float64)).argmax(1)
    return x, y
