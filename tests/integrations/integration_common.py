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


def autolrs_by_hand(autolrs, optimizer, loss_of, epochs: int = 4) -> None:
    """What both trainers run, written by hand: batches of 16 as two micro-batches of 8 whose
    losses are halved, one update, then AutoLRS told the batch's mean loss."""
    x, y = data()
    for _ in range(epochs):
        for start in range(0, 128, 16):
            optimizer.zero_grad()
            losses = [loss_of(x[i:i + 8], y[i:i + 8]) for i in (start, start + 8)]
            for loss in losses:
                (loss / 2).backward()
            optimizer.step()
            autolrs.on_train_batch_end(sum(float(loss) for loss in losses) / 2)


def assert_same_search(callback_autolrs, by_hand) -> None:
    """The callback's AutoLRS took the same steps, phases, LRs and losses as the one by hand."""
    history = [(r.step, r.phase, r.lr, r.loss) for r in callback_autolrs.controller.history]
    assert history == [(r.step, r.phase, r.lr, r.loss) for r in by_hand.controller.history]
    assert {r.phase for r in by_hand.controller.history} >= {"warmup", "trial", "train"}
