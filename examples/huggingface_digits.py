"""aikit in the Hugging Face Trainer: a small CNN on the embedded digits through ``Trainer``.

Needs ``pip install 'aikit-elastic[huggingface]'``:

    python examples/huggingface_digits.py                  # TrainingArguments from the plan: 256 per update
    python examples/huggingface_digits.py --mode autolrs   # AutoLRS as a TrainerCallback
    torchrun --nproc-per-node 2 examples/huggingface_digits.py   # the same 256 per update on 2 processes
"""

from __future__ import annotations

import argparse
import tempfile

import torch
import transformers
from torch import nn

from aikit.datasets import digits
from aikit.integrations.huggingface import AutoLRSCallback, plan_arguments


class DigitsNet(nn.Module):
    """Computes its own loss from ``labels``, as Transformers models do."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(16 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10),
        )

    def forward(self, pixels, labels=None):
        logits = self.net(pixels)
        loss = None if labels is None else nn.functional.cross_entropy(logits, labels)
        return {"loss": loss, "logits": logits}


class Digits(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"pixels": self.x[i], "labels": self.y[i]}


def main() -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["plan", "autolrs"], default="plan")
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()

    torch.set_num_threads(1)  # 8x8 images are too small to split over threads
    transformers.set_seed(0)
    x, y, x_test, y_test = digits()
    model = DigitsNet()
    callbacks = []
    if args.mode == "plan":
        batching, lr, optimizer = plan_arguments(global_batch_size=256, max_device_batch=64), 3e-3, "adamw_torch"
    else:
        batching, lr, optimizer = {"per_device_train_batch_size": 32}, 0.1, "sgd"
        xv, yv = torch.from_numpy(x_test), torch.from_numpy(y_test)

        def val_loss() -> float:
            with torch.no_grad():
                return float(model(xv, yv)["loss"])

        callbacks.append(AutoLRSCallback(val_loss, min_lr=1e-3, max_lr=1.0, tau=40, tau_max=80, trials=4,
                                         trial_ratio=4))
    with tempfile.TemporaryDirectory() as out:
        arguments = transformers.TrainingArguments(
            output_dir=out, num_train_epochs=args.epochs, learning_rate=lr, optim=optimizer, weight_decay=0.0,
            lr_scheduler_type="constant", dataloader_drop_last=True, use_cpu=True, report_to="none",
            save_strategy="no", logging_steps=10, **batching,
        )
        n = len(y) // 256 * 256  # whole updates: the Trainer weighs an epoch's short last update as a full one
        trainer = transformers.Trainer(model=model, args=arguments, train_dataset=Digits(x[:n], y[:n]),
                                       callbacks=callbacks)
        trainer.train()
    if not trainer.is_world_process_zero():
        return 0.0
    with torch.no_grad():
        accuracy = (model(torch.from_numpy(x_test))["logits"].argmax(1) == torch.from_numpy(y_test)).double().mean()
    print(f"{args.mode}: held-out accuracy {accuracy.item():.2%} after {args.epochs} epochs")
    return accuracy.item()


if __name__ == "__main__":
    main()
