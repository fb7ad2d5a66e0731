"""One case of tests/torch/test_auto_batch.py, run in its own process under an address-space limit
(``RLIMIT_AS``), so torch's CPU allocator truly fails: ``python auto_batch_case.py CASE`` prints
the case's findings as one JSON line. The limit is lifted (the soft limit raised back to the hard
one) before the reference training, which must not run out of memory."""

from __future__ import annotations

import json
import logging
import resource
import sys

import torch

import aikit.elastic.Torch as elastic
from aikit.core.errors import OutOfMemory
from aikit.ga.Torch.optim import Optimizer

D = 2**15  # features per sample: a float64 row of 256 KiB, so memory grows with the micro-batch
BUDGET = 12 * 2**20  # address space allowed beyond what the process holds when the limit is set
G = 48


def address_space() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))


def limit(on: bool, budget: int = BUDGET) -> None:
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    resource.setrlimit(resource.RLIMIT_AS, (address_space() + budget if on else hard, hard))


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(D, 1, dtype=torch.float64)


def data(length: int = 1, samples: int = G, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(samples, length * D, generator=gen, dtype=torch.float64), \
        torch.randn(samples, 1, generator=gen, dtype=torch.float64)


def loss_of(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A mean loss whose memory grows with the samples and their length (rows of D features)."""
    h = torch.tanh(x.view(len(x), -1, D) * 0.5)  # activations kept for the backward
    return ((net(h).mean(1) - y) ** 2).mean()


def reference(windows) -> list[float]:
    """Each window as one big-batch step of plain SGD, no limit."""
    net = model()
    sgd = torch.optim.SGD(net.parameters(), lr=0.1)
    for x, y in windows:
        sgd.zero_grad()
        loss_of(net, x, y).backward()
        sgd.step()
    return net.weight.detach().flatten()[:64].tolist() + net.bias.detach().tolist()


def train(net, windows, plan) -> tuple[list[float], elastic.AutoBatch]:
    optimizer = Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), plan.steps, global_batch_size=G)
    auto = elastic.AutoBatch(optimizer, plan=plan)
    for window in windows:
        auto.update(lambda x, y: loss_of(net, x, y), *window)
    return net.weight.detach().flatten()[:64].tolist() + net.bias.detach().tolist(), auto


def search() -> dict:
    """init's auto search finds the largest device batch that fits, and training at its plan is
    the big-batch training; then a longer window mid-training re-plans smaller, nothing lost."""
    net = model()
    x, y = data()
    windows = [data(seed=s) for s in (2, 3)] + [data(length=3, seed=4), data(seed=5)]

    def trial(batch: int) -> None:
        net.zero_grad(set_to_none=True)
        loss_of(net, x[:batch], y[:batch]).backward()
        net.zero_grad(set_to_none=True)

    train(model(), windows[:1], elastic.init(G, "auto", trial=trial))  # warm: every module loaded before the limit
    limit(True)
    plan = elastic.init(G, "auto", trial=trial)
    tries = elastic.search.tries
    weights, auto = train(net, windows, plan)
    limit(False)
    return {"plan": [plan.global_batch_size, plan.steps, plan.device_batch, plan.is_even],
            "tries": [[size, fitted] for size, fitted, _ in tries], "seconds": elastic.search.seconds,
            "replans": [[u, old, new] for u, old, new, _ in auto.replans], "final": auto.plan.device_batch,
            "said": auto.replans[0][3] if auto.replans else "", "updates": auto.updates,
            "same": weights == reference(windows) or max(abs(a - b) for a, b in zip(weights, reference(windows),
                                                                                    strict=True))}


def nothing_fits() -> dict:
    elastic.init(G, "auto", trial=lambda batch: None)  # warm: every module loaded before the limit
    limit(True)
    try:
        elastic.init(G, "auto", trial=lambda batch: torch.ones(batch, 2**31, dtype=torch.float64).sum())
    except OutOfMemory as error:
        return {"error": type(error).__name__, "message": str(error)}
    return {"error": None}


if __name__ == "__main__":
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    print(json.dumps({"search": search, "nothing_fits": nothing_fits}[sys.argv[1]]()))
