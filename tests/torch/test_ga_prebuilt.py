"""Run:AI's prebuilt GA optimizers and the ``reduction="sum"`` switch of the torch GA wrapper.

References are plain torch optimizers taking one step on the whole batch, in float64."""

from __future__ import annotations

import inspect
import pickle

import pytest
import torch

import aikit.ga.Torch.optim as ga
from aikit.core.errors import InvalidValue

# Run:AI's AIkit listed these by hand; aikit makes one for every class torch.optim ships
ORIGINAL = ["Adadelta", "Adagrad", "Adam", "AdamW", "Adamax", "ASGD", "SGD", "Rprop", "RMSprop"]
TORCH_CLASSES = sorted(name for name, obj in vars(torch.optim).items()
                       if isinstance(obj, type) and issubclass(obj, torch.optim.Optimizer)
                       and obj is not torch.optim.Optimizer)
TRAINABLE = [name for name in TORCH_CLASSES if name not in ("LBFGS", "SparseAdam")]
KWARGS = {"SGD": {"lr": 0.1, "momentum": 0.9}}


def test_every_torch_optimizer_class_has_a_prebuilt_ga_optimizer_of_its_name():
    assert set(ORIGINAL) <= set(TORCH_CLASSES)
    for name in TORCH_CLASSES:
        prebuilt = getattr(ga, name)
        assert issubclass(prebuilt, ga.Optimizer) and prebuilt.__name__ == name
        assert prebuilt.__module__ == "aikit.ga.Torch.optim" and prebuilt.inner_class is getattr(torch.optim, name)
    # the wrapper keeps its name: torch's abstract base class has no GA form
    assert ga.Optimizer.__module__ == "aikit.ga.Torch.optim" and ga.Optimizer is not torch.optim.Optimizer


def test_no_torch_optimizer_takes_a_keyword_the_prebuilt_form_keeps_for_the_wrapper():
    wrapper = {n for n, p in inspect.signature(ga.Optimizer.__init__).parameters.items() if p.kind is p.KEYWORD_ONLY}
    assert wrapper == {"global_batch_size", "max_grad_norm", "scaler", "reduce", "reduction", "bucket_cap_mb",
                       "sync_every_micro_step", "skip_nonfinite", "max_skips_in_a_row"}
    for name in TORCH_CLASSES:
        assert not wrapper & set(inspect.signature(getattr(torch.optim, name).__init__).parameters), name


def run(make, sizes: list[int], reduction: str, updates: int = 2, seed: int = 0) -> torch.Tensor:
    """``make(params)`` trained on ``updates`` windows split into micro-batches of ``sizes``
    (one micro-batch: the plain big-batch reference), with a loss of that reduction."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3, bias=False).double()
    optimizer = make(model.parameters())
    gen = torch.Generator().manual_seed(seed + 1)
    for _ in range(updates):
        x = torch.randn(sum(sizes), 4, generator=gen, dtype=torch.float64)
        y = torch.randn(sum(sizes), 3, generator=gen, dtype=torch.float64)
        for xm, ym in zip(x.split(sizes), y.split(sizes), strict=True):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(xm), ym, reduction=reduction).backward()
            optimizer.step()
    return model.weight.detach()


@pytest.mark.parametrize("name", TRAINABLE)
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_prebuilt_ga_equals_the_big_batch_step_of_its_optimizer(name, reduction):
    """``Name(steps, params, **kw)`` with the loss's reduction equals ``torch.optim.Name(params, **kw)``
    on the whole batch: the original's sum under a summed loss, aikit's mean under a mean loss."""
    kwargs = KWARGS.get(name, {})
    big = run(lambda p: getattr(torch.optim, name)(p, **kwargs), [12], reduction)
    small = run(lambda p: getattr(ga, name)(3, p, reduction=reduction, **kwargs), [4, 4, 4], reduction)
    torch.testing.assert_close(small, big, rtol=1e-9, atol=1e-12)


def test_sparse_adam_accumulates_sparse_gradients_to_the_big_batch_sum():
    def train(make, sizes):
        torch.manual_seed(0)
        table = torch.nn.Embedding(10, 3, sparse=True).double()
        optimizer = make(table.parameters())
        ids = torch.tensor([1, 4, 4, 7, 2, 1])
        for part in ids.split(sizes):
            table(part).pow(2).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        return table.weight.detach()

    torch.testing.assert_close(train(lambda p: ga.SparseAdam(3, p, lr=0.1, reduction="sum"), [2, 2, 2]),
                               train(lambda p: torch.optim.SparseAdam(p, lr=0.1), [6]), rtol=1e-9, atol=1e-12)


def test_the_sum_switch_differs_from_the_mean_by_the_steps_for_sgd():
    """The documented difference: under a mean loss the original's sum is ``steps`` times the
    big batch's gradient (its examples' LR was effectively multiplied by the GA steps)."""
    start = run(lambda p: torch.optim.SGD(p, lr=0.0), [12], "mean", updates=1)
    mean = run(lambda p: ga.SGD(3, p, lr=0.01), [4, 4, 4], "mean", updates=1)
    summed = run(lambda p: ga.SGD(3, p, lr=0.01, reduction="sum"), [4, 4, 4], "mean", updates=1)
    torch.testing.assert_close(summed - start, 3 * (mean - start), rtol=1e-9, atol=1e-12)


def test_lbfgs_is_refused_with_the_reason():
    with pytest.raises(TypeError, match=r"LBFGS.step\(closure\) needs a closure, which it evaluates many times"):
        ga.LBFGS(2, [torch.nn.Parameter(torch.zeros(2))])


def test_a_bad_reduction_is_named():
    with pytest.raises(InvalidValue, match="reduction must be 'mean' or 'sum', got 'avg'"):
        ga.Adam(2, [torch.nn.Parameter(torch.zeros(2))], reduction="avg")


def test_declared_samples_are_refused_under_the_sum():
    model = torch.nn.Linear(2, 1)
    optimizer = ga.SGD(2, model.parameters(), lr=0.1, global_batch_size=4, reduction="sum")
    message = r"accumulate\(samples=2\) weighs a mean loss's micro-batch .*reduction='sum'.*leave out samples="
    with pytest.raises(InvalidValue, match=message), optimizer.accumulate(model, samples=2):
        pass


def test_state_dict_keeps_the_reduction_and_the_micro_steps_and_refuses_another_reduction():
    model = torch.nn.Linear(2, 1)
    optimizer = ga.Adam(3, model.parameters(), reduction="sum")
    for _ in range(4):
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
    state = optimizer.state_dict()
    assert (state["ga"]["reduction"], state["ga"]["micro_steps"], state["ga"]["position"]) == ("sum", 4, 1)
    resumed = ga.Adam(3, model.parameters(), reduction="sum")
    resumed.load_state_dict(state)
    assert (resumed.micro_steps, resumed.micro_step) == (4, 1)
    other = ga.Adam(3, model.parameters())
    with pytest.raises(ValueError, match="saved by an optimizer with reduction='sum', this one has "
                                         "reduction='mean': build it with reduction='sum'"):
        other.load_state_dict(state)
    assert (other.micro_steps, other.micro_step, other.state) == (0, 0, {})  # a failed load changes nothing


def test_a_prebuilt_optimizer_pickles_as_itself():
    model = torch.nn.Linear(2, 1)
    optimizer = ga.RMSprop(2, model.parameters(), lr=0.01, reduction="sum")
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    copy = pickle.loads(pickle.dumps(optimizer))
    assert type(copy) is ga.RMSprop and isinstance(copy, ga.Optimizer)
    assert (copy.steps, copy.reduction, copy.micro_steps, copy.micro_step) == (2, "sum", 1, 1)
    assert copy.defaults["lr"] == 0.01 and "reduction='sum'" in repr(copy)


def test_an_optimizer_with_a_zero_grad_of_no_arguments_is_served():
    """Run:AI-era custom optimizers define ``zero_grad(self)``: the wrapper calls it that way."""
    class Old(torch.optim.SGD):
        def zero_grad(self):
            super().zero_grad()

    model = torch.nn.Linear(2, 1)
    optimizer = ga.Optimizer(Old(model.parameters(), lr=0.1), 2)
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
    assert optimizer.updated and all(p.grad is None for p in model.parameters())


def test_an_optimizer_with_a_scheduler_attached_is_not_taken_for_one_needing_a_closure():
    """An LR scheduler wraps ``optimizer.step``; its signature then reads ``step(self, closure=None)``."""
    model = torch.nn.Linear(2, 1)
    inner = torch.optim.AdamW(model.parameters(), lr=0.1)
    torch.optim.lr_scheduler.StepLR(inner, step_size=2)
    assert ga.Optimizer(inner, 2).steps == 2
