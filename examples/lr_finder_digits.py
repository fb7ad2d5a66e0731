"""LR range test on the embedded digits, with PyTorch and with Keras.

Each front end climbs the LR of a small CNN from 1e-5 to 10 over 100 updates, saves the
loss-vs-LR plot as a PNG, writes the history as CSV and prints the LR each suggestion rule
reads off the curve. Takes seconds on a CPU:

    python examples/lr_finder_digits.py                 # both, into ./lr_finder_out
    python examples/lr_finder_digits.py --framework torch --out /tmp/lr
"""

from __future__ import annotations

import argparse
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from aikit.core.lr_range import SUGGESTIONS
from aikit.datasets import digits


def report(name: str, finder, out: str) -> dict[str, float]:
    """Save the plot and the history; print and return every rule's suggestion."""
    fig, ax = plt.subplots()
    finder.plot(ax=ax, suggest_lr="valley")
    ax.set_title(f"{name}: LR range test on digits")
    fig.savefig(os.path.join(out, f"lr_finder_{name}.png"), dpi=100)
    plt.close(fig)
    finder.to_csv(os.path.join(out, f"lr_finder_{name}.csv"))
    suggestions = {method: finder.suggest_lr(method) for method in SUGGESTIONS}
    print(f"{name}: " + ", ".join(f"{method} {value:.2e}" for method, value in suggestions.items()))
    return suggestions


def torch_range_test(args) -> dict[str, float]:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from aikit.lr_finder.Torch import LRFinder

    x, y, _, _ = digits()
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-5, momentum=0.9)
    loader = DataLoader(TensorDataset(torch.from_numpy(x), torch.from_numpy(y)), batch_size=64, shuffle=True)
    finder = LRFinder(model, optimizer, nn.CrossEntropyLoss())
    finder.range_test(loader, end_lr=10, num_iter=args.num_iter)
    suggestions = report("torch", finder, args.out)
    finder.reset()  # the model and optimizer are as they were before the test
    return suggestions


def keras_range_test(args) -> dict[str, float]:
    import keras

    from aikit.keras.lr_finder import LRFinder
    x, y, _, _ = digits()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"), keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10),
    ])
    model.compile(optimizer=keras.optimizers.SGD(1e-5, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    finder = LRFinder(model)
    finder.range_test((x.transpose(0, 2, 3, 1), y), end_lr=10, num_iter=args.num_iter, batch_size=64)
    suggestions = report("keras", finder, args.out)
    finder.reset()
    return suggestions


def main() -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--framework", choices=["torch", "keras", "both"], default="both")
    parser.add_argument("--num-iter", type=int, default=100)
    parser.add_argument("--out", default="lr_finder_out")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results = {}
    if args.framework in ("torch", "both"):
        results["torch"] = torch_range_test(args)
    if args.framework in ("keras", "both"):
        results["keras"] = keras_range_test(args)
    print(f"plots and histories in {os.path.abspath(args.out)}")
    return results


if __name__ == "__main__":
    main()
