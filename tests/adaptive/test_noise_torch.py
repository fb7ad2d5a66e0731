"""The torch adapter's gradient noise against quantities computed independently of it.

Least squares ``loss = ½(x·w - y)²`` with Gaussian inputs of known covariance ``C`` and target
noise ``σ²`` has, at parameters ``w = w* + d``, the per-sample gradient ``g = x xᵀd - x ε`` with

    |G|² = |C d|²          tr(Σ) = |C d|² + (dᵀ C d + σ²) tr(C)

(Isserlis' theorem for the fourth moment of a Gaussian). The run's estimates, averaged over
updates, must match both this ground truth and a brute-force estimate from many large batches
of the same data set. The learning rate is 0, so the parameters (and the truth) stay put.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from aikit.elastic.Torch import AdaptiveOptimizer, AdaptiveSampler

C = np.array([4.0, 1.0, 0.25, 2.0])  # the input covariance (diagonal)
SIGMA = 0.5
W_STAR = np.array([1.0, -1.0, 0.5, 2.0])
D = np.array([0.5, 0.5, -0.5, 0.2])  # where the gradient is measured: w = w* + d
SIZE, BATCH, MICRO = 8192, 64, 8


def data() -> TensorDataset:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SIZE, len(C))) * np.sqrt(C)
    y = x @ W_STAR + SIGMA * rng.normal(size=SIZE)
    return TensorDataset(torch.as_tensor(x), torch.as_tensor(y)[:, None])


def truth() -> tuple[float, float]:
    cd = C * D
    grad_sq = float(cd @ cd)
    return grad_sq, grad_sq + float(D @ cd + SIGMA**2) * float(C.sum())


def brute_force(dataset: TensorDataset, batches: int = 2000, size: int = 256) -> tuple[float, float]:
    """|G|² as the squared norm of the whole data set's gradient, tr(Σ) from the spread of many
    batch gradients around it: ``E|g_B - G|² = tr(Σ)/B · (n-B)/(n-1)`` (drawn without replacement)."""
    x, y = (t.numpy() for t in dataset.tensors)
    w = W_STAR + D
    full = x.T @ (x @ w - y[:, 0]) / SIZE
    rng = np.random.default_rng(1)
    spread = []
    for _ in range(batches):
        index = rng.choice(SIZE, size, replace=False)
        g = x[index].T @ (x[index] @ w - y[index, 0]) / size
        spread.append((g - full) @ (g - full))
    return float(full @ full), float(np.mean(spread) * size * (SIZE - 1) / (SIZE - size))


def measured(dataset: TensorDataset, epochs: int = 4, scaler: torch.amp.GradScaler | None = None) -> np.ndarray:
    """Every update's (|G|², tr(Σ)) from an adaptive run held at one batch."""
    model = nn.Linear(len(C), 1, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(torch.as_tensor(W_STAR + D)[None])
    # decay=0: the tracker's smoothed value is each update's own estimate
    sampler = AdaptiveSampler(dataset, base_batch=BATCH, max_batch=BATCH, micro_batch=MICRO, decay=0.0)
    optimizer = AdaptiveOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), sampler, "linear", scaler=scaler)
    estimates = []
    optimizer.optimizer.register_step_post_hook(
        lambda *_: estimates.append(sampler.controller.noise.smoothed))
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        optimizer.set_epoch(epoch)
        for x, y in sampler.loader(dataset):
            loss = 0.5 * (model(x) - y).square().mean()
            (loss if scaler is None else scaler.scale(loss)).backward()
            optimizer.step()
    return np.array([(e.grad_sq, e.trace) for e in estimates])


@pytest.fixture(scope="module")
def estimates():
    dataset = data()
    return dataset, measured(dataset)


def test_the_estimates_average_to_the_ground_truth(estimates):
    _, found = estimates
    assert len(found) == 4 * SIZE // BATCH
    grad_sq, trace = found.mean(axis=0)
    want_grad_sq, want_trace = truth()
    assert grad_sq == pytest.approx(want_grad_sq, rel=0.1)
    assert trace == pytest.approx(want_trace, rel=0.1)
    assert trace / grad_sq == pytest.approx(want_trace / want_grad_sq, rel=0.15)  # the noise scale


def test_the_estimates_agree_with_a_brute_force_estimate_from_many_large_batches(estimates):
    dataset, found = estimates
    grad_sq, trace = found.mean(axis=0)
    brute_grad_sq, brute_trace = brute_force(dataset)
    assert brute_trace == pytest.approx(truth()[1], rel=0.1)  # the reference itself is sound
    assert grad_sq == pytest.approx(brute_grad_sq, rel=0.1)
    assert trace == pytest.approx(brute_trace, rel=0.1)


def test_amps_loss_scale_is_divided_out_of_the_estimates():
    dataset = data()
    plain = measured(dataset, epochs=1)
    scaled = measured(dataset, epochs=1, scaler=torch.amp.GradScaler("cpu", init_scale=2.0**10))
    assert len(scaled) == len(plain) == SIZE // BATCH
    np.testing.assert_allclose(scaled, plain, rtol=1e-9)
