"""aikit in PyTorch Lightning: a small CNN on the embedded digits through Lightning's Trainer.

Three callbacks, one per mode (needs ``pip install 'aikit-elastic[lightning]'``):

    python examples/lightning_digits.py                    # ElasticPlan: global batch 256, <= 64 per device
    python examples/lightning_digits.py --mode trace       # TraceBatchSize: batch sizes from trace.csv
    python examples/lightning_digits.py --mode autolrs     # AutoLRS picks the LR as training goes
    python examples/lightning_digits.py --devices 2        # ElasticPlan on 2 CPU processes (DDP)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aikit.datasets import digits
from aikit.elastic.Torch import TraceSampler
from aikit.integrations.lightning import AutoLRS, ElasticPlan, TraceBatchSize


class Digits(pl.LightningModule):
    def __init__(self, train: TensorDataset, lr: float, optimizer: str, sampler: TraceSampler | None = None):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(16 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10),
        )
        self.train_set, self.lr, self.optimizer, self.sampler = train, lr, optimizer, sampler
        self.batch_size = 32  # ElasticPlan sets it from the plan

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        if self.optimizer == "adam":
            return torch.optim.Adam(self.parameters(), lr=self.lr)
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)

    def train_dataloader(self):
        if self.sampler is not None:
            return DataLoader(self.train_set, batch_sampler=self.sampler)
        # drop_last: every update holds exactly the global batch (ElasticPlan checks it)
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, drop_last=True)


def main() -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["plan", "trace", "autolrs"], default="plan")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--devices", type=int, default=1, help="CPU processes (plan mode)")
    parser.add_argument("--trace", default=str(Path(__file__).with_name("trace.csv")))
    args = parser.parse_args()

    torch.set_num_threads(1)  # 8x8 images are too small to split over threads
    pl.seed_everything(0, verbose=False)
    x, y, x_test, y_test = (torch.from_numpy(a) for a in digits())
    n = len(y) // 256 * 256  # whole updates of 256
    train = TensorDataset(x[:n], y[:n])
    callbacks, sampler = [], None
    if args.mode == "plan":
        model = Digits(train, lr=3e-3, optimizer="adam")
        callbacks.append(ElasticPlan(global_batch_size=256, max_device_batch=64))
    elif args.mode == "trace":
        sampler = TraceSampler(len(train), args.trace, micro_batch=16, when_exhausted="repeat_last")
        model = Digits(train, lr=0.05, optimizer="sgd", sampler=sampler)
        callbacks.append(TraceBatchSize(sampler, ref_batch_size=128, rule="linear"))
    else:
        model = Digits(train, lr=0.1, optimizer="sgd")

        def val_loss() -> float:
            with torch.no_grad():
                return float(nn.functional.cross_entropy(model.net(x_test), y_test))

        callbacks.append(AutoLRS(val_loss, min_lr=1e-3, max_lr=1.0, tau=40, tau_max=80, trials=4, trial_ratio=4))
    trainer = pl.Trainer(max_epochs=args.epochs, accelerator="cpu", devices=args.devices, callbacks=callbacks,
                         logger=False, enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(model)
    if trainer.global_rank != 0:
        return 0.0
    with torch.no_grad():
        accuracy = (model.net(x_test).argmax(1) == y_test).double().mean().item()
    print(f"{args.mode}: held-out accuracy {accuracy:.2%} after {args.epochs} epochs")
    return accuracy


if __name__ == "__main__":
    main()
