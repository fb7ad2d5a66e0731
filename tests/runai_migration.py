"""Run Run:AI's AIkit's own example scripts (tests/runai_originals, verbatim) against aikit.

A user migrating changes the imports: :data:`IMPORTS` is that change, nothing more. The Keras
scripts were written for Keras 2 and MNIST's fixed sizes; :data:`DIGITS_SIZES` and :data:`KERAS_3_LR` name the three
lines a smaller data set and Keras 3 need changed (none is about aikit). The data come from
``aikit.datasets.digits()``: 8x8 digits scaled up to MNIST's 28x28 uint8 images, served through
stand-ins for ``torchvision``'s ``datasets.MNIST``/``transforms`` and ``keras.datasets.mnist``, so
the models run unchanged.
"""

from __future__ import annotations

import functools
import sys
import types
from pathlib import Path

import numpy as np

import aikit.datasets

ORIGINALS = Path(__file__).parent / "runai_originals"

IMPORTS = [  # (Run:AI's AIkit, aikit), applied in this order
    ("runai.ga.torch", "aikit.ga.Torch"),
    ("runai.ga.keras", "aikit.ga.TF"),
    ("runai.elastic.torch", "aikit.elastic.Torch"),
    ("runai.elastic.keras", "aikit.elastic.TF"),
    ("runai.elastic", "aikit.elastic"),
]
DIGITS_SIZES = [  # MNIST's 60,000 and 10,000 samples are hard-coded; the digits have fewer
    ("x_train.reshape(60000, 784)", "x_train.reshape(-1, 784)"),
    ("x_test.reshape(10000, 784)", "x_test.reshape(-1, 784)"),
]
KERAS_3_LR = [("keras.optimizers.Adadelta(lr=1.0)", "keras.optimizers.Adadelta(learning_rate=1.0)")]  # renamed


def migrated(name: str, keras_3: list[tuple[str, str]] = ()) -> str:
    """The source of ``runai_originals/name`` with its imports changed, and the ``keras_3`` lines
    (each of which must be there)."""
    source = (ORIGINALS / name).read_text()
    for old, new in keras_3:
        if old not in source:
            raise AssertionError(f"{name} has no {old!r}: the table no longer fits the original")
        source = source.replace(old, new)
    for old, new in IMPORTS:
        source = source.replace(old, new)
    assert "runai" not in source.replace("Run:AI", ""), "a use of runai was left"
    return source


def run(name: str, keras_3: list[tuple[str, str]] = ()) -> dict:
    """Execute the migrated script as ``__main__``; returns its globals."""
    path = ORIGINALS / name
    namespace = {"__name__": "__main__", "__file__": str(path)}
    exec(compile(migrated(name, keras_3), str(path), "exec"), namespace)  # our own vendored file
    return namespace


@functools.cache
def mnist_like() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """``keras.datasets.mnist.load_data()``'s shapes and types from the digits: uint8 28x28."""
    x_train, y_train, x_test, y_test = aikit.datasets.digits()
    rows = np.arange(28) * 8 // 28  # nearest-neighbour scaling 8 -> 28
    images = [(x[:, 0][:, rows][:, :, rows] * 255).round().astype(np.uint8) for x in (x_train, x_test)]
    return (images[0], y_train.astype(np.uint8)), (images[1], y_test.astype(np.uint8))


def torchvision_stand_in() -> types.ModuleType:
    """``torchvision.datasets.MNIST`` and the three transforms the examples use, on the digits."""
    import torch

    class MNIST(torch.utils.data.Dataset):
        def __init__(self, root, train=True, download=False, transform=None):
            (x_train, y_train), (x_test, y_test) = mnist_like()
            self.data, self.targets = (x_train, y_train) if train else (x_test, y_test)
            self.targets = torch.as_tensor(self.targets, dtype=torch.int64)
            self.transform = transform

        def __len__(self):
            return len(self.data)

        def __getitem__(self, index):
            image = self.data[index]
            return (image if self.transform is None else self.transform(image)), int(self.targets[index])

    class Compose:
        def __init__(self, transforms):
            self.transforms = transforms

        def __call__(self, image):
            for transform in self.transforms:
                image = transform(image)
            return image

    class ToTensor:
        def __call__(self, image):
            return torch.as_tensor(image, dtype=torch.float32)[None] / 255

    class Normalize:
        def __init__(self, mean, std):
            self.mean, self.std = mean[0], std[0]

        def __call__(self, tensor):
            return (tensor - self.mean) / self.std

    module = types.ModuleType("torchvision")
    module.datasets = types.SimpleNamespace(MNIST=MNIST)
    module.transforms = types.SimpleNamespace(Compose=Compose, ToTensor=ToTensor, Normalize=Normalize)
    return module


def install_stand_ins(monkeypatch, train_samples: int | None = None) -> None:
    """Serve the digits where the examples load MNIST (Keras: the first ``train_samples``)."""
    if "keras" in sys.modules:
        import keras

        def load_data():
            (x_train, y_train), test = mnist_like()
            return (x_train[:train_samples], y_train[:train_samples]), test

        monkeypatch.setattr(keras.datasets.mnist, "load_data", load_data)
    monkeypatch.setitem(sys.modules, "torchvision", torchvision_stand_in())
