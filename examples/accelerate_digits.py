"""aikit under Hugging Face Accelerate: a small CNN on the embedded digits, 256 samples per update
whatever per-device batch fits.

Needs ``pip install 'aikit-elastic[huggingface]'``:

    python examples/accelerate_digits.py                   # 64 per device fits: 4 GA steps
    python examples/accelerate_digits.py --fits 20         # out of memory above 20: 64, 32 fail, 16 x 16 steps
    torchrun --nproc-per-node 2 examples/accelerate_digits.py   # the same 256 on 2 processes (4 x 32 each)

``--fits N`` makes the model fail as the CPU allocator does above N samples, so the back-off
runs on any machine: the per-device batch steps down the even plans of 256 (64, 32, 16, ...)
and the GA steps follow, where Accelerate's own back-off would try 57, 51, ... at the same GA.
Every update is the mean over its samples' losses, counted over all processes (GlobalBatch.updates).
"""

from __future__ import annotations

import argparse

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aikit.datasets import digits
from aikit.integrations.accelerate import GlobalBatch


class DigitsNet(nn.Module):
    def __init__(self, fits: int | None):
        super().__init__()
        self.fits = fits
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(16 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10),
        )

    def forward(self, pixels):
        if self.fits is not None and len(pixels) > self.fits:  # what an allocator at its limit raises
            raise RuntimeError(f"DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                               f"{len(pixels) * 10**8} bytes (--fits {self.fits})")
        return self.net(pixels)


def main() -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--fits", type=int, default=None, help="fail as out of memory above this many samples")
    args = parser.parse_args()

    torch.set_num_threads(1)  # 8x8 images are too small to split over threads
    accelerator = Accelerator(cpu=True)
    x, y, x_test, y_test = digits()
    train_set = TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    global_batch = GlobalBatch(accelerator, global_batch_size=256, max_device_batch=64)

    @global_batch.find_executable_batch_size
    def train(device_batch: int) -> nn.Module:
        accelerator.free_memory()  # what the failed try held
        torch.manual_seed(0)
        model = DigitsNet(args.fits)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        loader = DataLoader(train_set, batch_size=device_batch, shuffle=True, drop_last=True)
        prepared, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        for _ in range(args.epochs):
            for update in global_batch.updates(loader, count=lambda batch: len(batch[1])):
                for pixels, labels in update.accumulate(prepared):
                    loss_sum = nn.functional.cross_entropy(prepared(pixels), labels, reduction="sum")
                    accelerator.backward(update.loss(loss_sum))
                optimizer.step()
                optimizer.zero_grad()
        return model

    model = train()
    accelerator.print(f"{global_batch.steps} GA steps of {global_batch.device_batch} per device on "
                      f"{accelerator.num_processes} process(es): 256 per update; out of memory at {global_batch.tried}")
    with torch.no_grad():
        accuracy = (model.net(torch.from_numpy(x_test)).argmax(1) == torch.from_numpy(y_test)).double().mean().item()
    accelerator.print(f"held-out accuracy {accuracy:.2%} after {args.epochs} epochs")
    accelerator.end_training()
    return accuracy


if __name__ == "__main__":
    main()
