"""aikit's LRFinder against torch-lr-finder 0.2.2 itself, run side by side on the same model and
data: the histories must be identical, validation losses included (torch-lr-finder divides the
summed validation loss by ``len(val_loader.dataset)``, even when a sampler reads only part of it)."""

from __future__ import annotations

import copy
import io
from contextlib import redirect_stdout

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, SubsetRandomSampler, TensorDataset

from aikit.lr_finder.Torch import LRFinder

torch_lr_finder = pytest.importorskip("torch_lr_finder", reason="torch-lr-finder==0.2.2 is a test dependency")


def regression_data(samples=200):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(samples, 4, generator=g)
    return x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(samples, 1, generator=g)


class PairLabels(Dataset):
    """Labels as a list of two tensors: ``len(labels)`` is 2 whatever the batch size."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], [self.y[i], 2 * self.y[i]]


def pair_loss(output, labels):
    return nn.functional.mse_loss(output, labels[0]) + nn.functional.mse_loss(2 * output, labels[1])


def run(finder_class, criterion, train, val, **options):
    """One range test from a fixed model and a fixed torch RNG (SubsetRandomSampler draws from it)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    finder = finder_class(model, optimizer, criterion)
    with redirect_stdout(io.StringIO()):
        kwargs = {"progress_bar": False, **options} if finder_class is LRFinder else options
        finder.range_test(copy.deepcopy(train), val_loader=copy.deepcopy(val), end_lr=1, num_iter=12, **kwargs)
    return finder.history


def loaders(kind):
    x, y = regression_data()
    if kind == "subset":  # a validation sampler over 50 of the 200 samples
        val = DataLoader(TensorDataset(x, y), batch_size=16, sampler=SubsetRandomSampler(range(150, 200)))
        return nn.MSELoss(), DataLoader(TensorDataset(x[:150], y[:150]), batch_size=16, shuffle=True), val
    if kind == "list_labels":
        data = PairLabels(x, y)
        return pair_loss, DataLoader(data, batch_size=16, shuffle=True), DataLoader(data, batch_size=16)
    return nn.MSELoss(), DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True), None


@pytest.mark.parametrize("kind", ["plain", "subset", "list_labels"])
def test_histories_are_identical_to_torch_lr_finder(kind):
    criterion, train, val = loaders(kind)
    ours = run(LRFinder, criterion, train, val)
    theirs = run(torch_lr_finder.LRFinder, criterion, train, val)
    assert ours["lr"] == theirs["lr"]
    assert ours["loss"] == theirs["loss"]


def test_val_average_seen_is_the_mean_over_the_samples_the_sampler_read():
    criterion, train, val = loaders("subset")
    by_dataset = run(LRFinder, criterion, train, val, smooth_f=0)
    by_seen = run(LRFinder, criterion, train, val, smooth_f=0, val_average="seen")
    # 50 of the 200 samples were read: the per-sample mean is 200/50 times the original's number
    assert by_seen["loss"] == pytest.approx([4 * loss for loss in by_dataset["loss"]], rel=1e-12)


def test_an_unknown_val_average_is_refused_with_the_choices():
    criterion, train, val = loaders("subset")
    with pytest.raises(ValueError, match=r"val_average must be 'dataset'.*or 'seen'.*got 'mean'"):
        run(LRFinder, criterion, train, val, val_average="mean")
