"""aikit with the LR-free optimizers users pick instead of tuning (issue 27): Schedule-Free
(``schedulefree``) and Prodigy (``prodigyopt``) under aikit's GA optimizer equal their big-batch
runs, Schedule-Free's train()/eval() reach it through the wrapper, Prodigy's estimate advances
once per update; AutoLRS refuses both by name; the LR finder range-tests Schedule-Free in its
train mode (validating its average) and refuses Prodigy."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from prodigyopt import Prodigy
from schedulefree import AdamWScheduleFree, SGDScheduleFree
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aikit.autolrs.Torch import AutoLRS
from aikit.ga.Torch.optim import Optimizer as GAOptimizer
from aikit.lr_finder.Torch import LRFinder
from aikit.runtime.Torch.lr_free import SCHEDULE_FREE, STEP_SIZE_ESTIMATOR, lr_free_kind

STEPS, MICRO, UPDATES = 4, 8, 6  # micro-batches per update, their size, updates


@pytest.fixture(autouse=True)
def float64():
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(STEPS * MICRO * UPDATES, 5, generator=g)
    return x, (x[:, :1] * x[:, 1:2]).sin() + 0.1 * x[:, 2:3]


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 1))


OPTIMIZERS = {
    "AdamWScheduleFree": lambda params: AdamWScheduleFree(params, lr=0.02, warmup_steps=2, weight_decay=1e-3),
    "SGDScheduleFree": lambda params: SGDScheduleFree(params, lr=0.5, momentum=0.9),
    "Prodigy": lambda params: Prodigy(params, lr=1.0, weight_decay=1e-3),
    "Prodigy d_coef=0.3": lambda params: Prodigy(params, lr=1.0, d_coef=0.3, d0=1e-4, use_bias_correction=True),
}


def train(name, steps):
    """UPDATES updates over the same samples: ``steps`` micro-batches of MICRO per update through
    aikit's GA optimizer, or (``steps`` None) one batch of STEPS * MICRO per plain step. A
    Schedule-Free optimizer is switched to eval() and back between updates, as an evaluation would.
    Returns the model, the optimizer and what was seen after each update."""
    model = net()
    inner = OPTIMIZERS[name](model.parameters())
    optimizer = inner if steps is None else GAOptimizer(inner, steps)
    schedule_free = lr_free_kind(optimizer) == SCHEDULE_FREE
    if schedule_free:
        optimizer.train()
    x, y = data()
    seen = []
    size = MICRO if steps else STEPS * MICRO
    for start in range(0, len(x), size):
        nn.functional.mse_loss(model(x[start:start + size]), y[start:start + size]).backward()
        optimizer.step()
        if steps is None or optimizer.micro_step == 0:  # an update was made
            optimizer.zero_grad()
            group = inner.param_groups[0]
            seen.append({"k": group["k"], "d": group.get("d")})
            if schedule_free:
                optimizer.eval()
                seen[-1]["x"] = [p.detach().clone() for p in model.parameters()]
                optimizer.train()
        elif "d" in inner.param_groups[0]:  # between updates nothing of Prodigy's moves
            assert inner.param_groups[0]["k"] == len(seen)
    return model, optimizer, seen


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_under_the_ga_optimizer_each_lr_free_optimizer_equals_its_big_batch_run(name):
    big_model, _, big = train(name, None)
    ga_model, ga, accumulated = train(name, STEPS)
    assert ga.applied == UPDATES and ga.micro_steps == UPDATES * STEPS
    assert [s["k"] for s in accumulated] == [s["k"] for s in big] == list(range(1, UPDATES + 1))  # once an update
    for a, b in zip(ga_model.parameters(), big_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-13)
    if "Prodigy" in name:  # its estimate: the same at every update, and it did move from d0
        assert [s["d"] for s in accumulated] == pytest.approx([s["d"] for s in big], rel=1e-11)
        assert accumulated[-1]["d"] > 1e-6
    else:  # the averaged weights eval() gives, after every update
        for s, t in zip(accumulated, big, strict=True):
            for a, b in zip(s["x"], t["x"], strict=True):
                torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-13)


def test_schedule_free_train_and_eval_reach_the_optimizer_through_the_ga_wrapper():
    model = net()
    inner = AdamWScheduleFree(model.parameters(), lr=0.02)
    ga = GAOptimizer(inner, 2)
    assert not hasattr(GAOptimizer(torch.optim.SGD(net().parameters(), lr=0.1), 2), "train")  # as without it
    ga.train()
    assert inner.param_groups[0]["train_mode"] is True
    x, y = data()
    for start in (0, 8, 16, 24):  # two updates (after the first, x = y = z)
        nn.functional.mse_loss(model(x[start:start + 8]), y[start:start + 8]).backward()
        ga.step()
    y_weights = [p.detach().clone() for p in model.parameters()]
    ga.eval()
    assert inner.param_groups[0]["train_mode"] is False
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), y_weights, strict=True))  # now x
    with pytest.raises(Exception, match="not in train mode"):  # its own contract, through the wrapper
        nn.functional.mse_loss(model(x[:8]), y[:8]).backward()
        ga.step()
        nn.functional.mse_loss(model(x[:8]), y[:8]).backward()
        ga.step()


def test_the_kinds_are_read_from_what_the_optimizers_keep():
    params = list(net().parameters())
    assert lr_free_kind(AdamWScheduleFree(params)) == lr_free_kind(SGDScheduleFree(params, lr=1.0)) == SCHEDULE_FREE
    assert lr_free_kind(GAOptimizer(AdamWScheduleFree(params), 2)) == SCHEDULE_FREE
    assert lr_free_kind(Prodigy(params)) == lr_free_kind(GAOptimizer(Prodigy(params), 2)) == STEP_SIZE_ESTIMATOR
    assert lr_free_kind(torch.optim.AdamW(params)) is None and lr_free_kind(torch.optim.SGD(params, lr=1)) is None


@pytest.mark.parametrize(("make", "message"), [
    (lambda p: AdamWScheduleFree(p), r"^AdamWScheduleFree is Schedule-Free: its averaging of the iterates replaces "
                                     r"the LR schedule .* train it at its constant LR, or run AutoLRS over AdamW"),
    (lambda p: GAOptimizer(SGDScheduleFree(p, lr=1.0), 2), r"^Optimizer is Schedule-Free"),
    (lambda p: Prodigy(p), r"^Prodigy estimates its own step size \(its lr multiplies the estimate d, 1 by "
                           r"default\), so an LR searched by AutoLRS would fight the estimate: tune its d_coef"),
])
def test_autolrs_refuses_an_lr_free_optimizer_by_name_with_what_to_do(make, message):
    model = net()
    optimizer = make(model.parameters())
    before = copy.deepcopy(optimizer.state_dict())
    with pytest.raises(TypeError, match=message):
        AutoLRS(model, optimizer, lambda: 0.0, total_steps=100)
    assert optimizer.state_dict() == before


def test_the_lr_finder_refuses_prodigy_and_a_schedule_free_warmup():
    model = net()
    with pytest.raises(TypeError, match=r"^Prodigy estimates its own step size .*: tune its d_coef instead, or "
                                        r"range-test AdamW"):
        LRFinder(model, Prodigy(model.parameters()), nn.MSELoss())
    with pytest.raises(ValueError, match=r"^AdamWScheduleFree's warmup_steps=5 scales the LR of its first steps, so "
                                         r"the range test's LRs would not be the ones applied"):
        LRFinder(model, AdamWScheduleFree(model.parameters(), warmup_steps=5), nn.MSELoss())


def test_the_lr_finder_range_tests_schedule_free_in_train_mode_validates_its_average_and_resets():
    model = net()
    optimizer = AdamWScheduleFree(model.parameters(), lr=1e-4)  # never train()ed: eval mode, as built
    weights = copy.deepcopy(model.state_dict())
    validated_on = []
    x, y = data()

    def criterion(out, target):
        if not torch.is_grad_enabled():  # a validation batch: the weights it sees
            validated_on.append(([p.detach().clone() for p in model.parameters()],
                                 optimizer.param_groups[0]["train_mode"]))
        return nn.functional.mse_loss(out, target)

    finder = LRFinder(model, optimizer, criterion)
    loader = DataLoader(TensorDataset(x, y), batch_size=16)
    finder.range_test(loader, val_loader=DataLoader(TensorDataset(x[:16], y[:16]), batch_size=16), end_lr=1.0,
                      num_iter=5, progress_bar=False)
    assert len(finder.history["lr"]) == 5 and all(math.isfinite(v) for v in finder.history["loss"])
    assert all(mode is False for _, mode in validated_on)  # validated in eval mode: its x
    assert optimizer.param_groups[0]["train_mode"] is False  # left in the mode it was found in
    assert optimizer.param_groups[0]["k"] == 5
    finder.reset()
    assert optimizer.param_groups[0]["k"] == 0 and optimizer.state_dict()["state"] == {}
    for key, value in model.state_dict().items():
        assert torch.equal(value, weights[key])
