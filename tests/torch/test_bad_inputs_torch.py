"""Issue 13's bad inputs to the PyTorch adapters: CustomSampler's types and the LR finder's
empty data and empty model, each an aikit error naming the argument and the fix; issue 29's:
AutoLRS on a model without parameters, a range test's history written to a folder."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset

from aikit.autolrs.Torch import AutoLRS
from aikit.cli import main
from aikit.core.errors import AikitError, InvalidType, InvalidValue
from aikit.core.trace import Trace
from aikit.elastic.Torch import CustomSampler, TraceSampler
from aikit.lr_finder.Torch import LRFinder


@pytest.mark.parametrize(("args", "kwargs", "error", "message"), [
    ((), dict(dataset_size="100", trace=2, minibatch_size=1), InvalidType,
     "dataset_size must be a positive integer, got '100'"),
    (("100", 2), dict(minibatch_size=1), InvalidType, "CustomSampler needs a sized Dataset or an int, got str '100'"),
    ((100, 2), dict(minibatch_size=1, seed=1.7), InvalidType, "seed must be a non-negative integer, got 1.7"),
    ((100, 2), dict(minibatch_size=1, num_replicas=2, rank="0"), InvalidType,
     r"rank must be an integer in 0..1, got '0'"),
    ((100, 2), dict(minibatch_size=1, num_replicas=2, rank=2), InvalidValue, r"rank must be an integer in 0..1, got 2"),
    ((100, 2), dict(minibatch_size=1, num_replicas=2.0, rank=0), InvalidType,
     "num_replicas must be a positive integer, got 2.0"),
])
def test_custom_sampler_refuses_wrong_types_by_name(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        CustomSampler(*args, **kwargs)


def test_a_string_data_set_is_not_measured_with_len():
    """The bug: CustomSampler(dataset_size='100', ...) trained on a 3-sample data set."""
    with pytest.raises(InvalidType):
        CustomSampler(dataset_size="100", trace=2, minibatch_size=1)
    assert CustomSampler(dataset_size=100, trace=2, minibatch_size=1).dataset_size == 100


def finder(model=None):
    model = model if model is not None else torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters() if list(model.parameters()) else [torch.zeros(1)], lr=1e-3)
    return LRFinder(model, optimizer, torch.nn.MSELoss())


def loader(samples: int) -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(samples, 2), torch.randn(samples, 1)), batch_size=4)


def test_lr_finder_names_an_empty_train_loader():
    with pytest.raises(InvalidValue, match="train_loader yields no batches: give the range test data to train on"):
        finder().range_test(loader(0), num_iter=3, progress_bar=False)


def test_lr_finder_names_an_empty_val_loader():
    with pytest.raises(InvalidValue, match="val_loader yields no samples: give a validation loader with data, or "
                       "leave val_loader out"):
        finder().range_test(loader(8), val_loader=loader(0), num_iter=3, progress_bar=False)


def test_lr_finder_names_a_model_without_parameters():
    with pytest.raises(InvalidValue, match="the model has no parameters: the range test trains them"):
        finder(torch.nn.ReLU())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(1, 12).map(lambda k: 4 * k), min_size=1, max_size=6),
       dataset_size=st.integers(1, 60), minibatch=st.sampled_from([1, 2, 4, 8]), replicas=st.integers(1, 3),
       when_exhausted=st.sampled_from([None, "error", "stop", "repeat_last", "cycle"]))
def test_trace_check_refuses_exactly_what_the_sampler_refuses(tmp_path, capsys, sizes, dataset_size, minibatch,
                                                              replicas, when_exhausted):
    path = tmp_path / "trace.csv"
    Trace(sizes).to_csv(path)
    try:
        TraceSampler(dataset_size, str(path), num_replicas=replicas, rank=0, micro_batch=minibatch,
                     when_exhausted=when_exhausted)
        accepted = True
    except AikitError:
        accepted = False
    argv = ["trace", "check", str(path), "--micro-batch", str(minibatch), "--dataset-size", str(dataset_size),
            "--replicas", str(replicas)] + (["--when-exhausted", when_exhausted] if when_exhausted else [])
    assert (main(argv) == 0) == accepted
    capsys.readouterr()


# ---- issue 29: the last raw errors a new user met, each now named with its fix ------------------


def test_autolrs_names_a_model_without_parameters():
    """``next(model.parameters())`` raised a bare StopIteration."""
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    with pytest.raises(InvalidValue) as raised:
        AutoLRS(torch.nn.ReLU(), optimizer, lambda: 0.0, 1e-4, 1e-1)
    assert str(raised.value) == ("AutoLRS got a model without parameters (ReLU): give it the model whose parameters "
                                 "the optimizer trains")


def test_lr_finder_to_csv_into_a_folder_is_named(tmp_path):
    """open() raised IsADirectoryError; a missing folder raised FileNotFoundError."""
    test = finder()
    test.range_test(loader(16), num_iter=3, progress_bar=False)
    with pytest.raises(InvalidValue) as raised:
        test.to_csv(tmp_path)
    assert str(raised.value) == f"cannot write {tmp_path}: it is a folder; give a file name, e.g. lr_finder.csv"
    with pytest.raises(InvalidValue, match=r"the folder .*missing does not exist; create it \(mkdir -p .*missing\)"):
        test.to_csv(tmp_path / "missing" / "lr.csv")
    test.to_csv(tmp_path / "lr.csv")
    assert (tmp_path / "lr.csv").read_text().startswith("lr,loss\n")


# ---- issue 47: the new APIs' silent and raw cases, each now named with its fix ------------------------

def test_init_auto_with_a_trial_that_takes_no_batch_is_named_before_it_runs():
    """init(256, "auto", trial=lambda: None) raised "takes 0 positional arguments but 1 was given"
    from inside aikit's search."""
    import aikit.elastic.Torch as elastic

    with pytest.raises(InvalidType) as raised:
        elastic.init(256, "auto", trial=lambda: None)
    assert str(raised.value).startswith("init(..., 'auto', trial=) is called as trial(device_batch), but ")
    assert str(raised.value).endswith("(too many positional arguments): max_device_batch='auto' needs trial=, a "
                                      "function that runs one forward and backward of yours at the per-device batch "
                                      "it is given: def trial(batch): ...")


def auto_batch(global_batch: int = 8):
    from aikit.core.plan import make_plan
    from aikit.elastic.Torch import AutoBatch
    from aikit.ga.Torch.optim import Optimizer

    net = torch.nn.Linear(2, 1)
    optimizer = Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 2, global_batch_size=global_batch)
    return AutoBatch(optimizer, net, make_plan(global_batch, 4, 1)), net


@pytest.mark.parametrize(("loss", "error", "message"), [
    (lambda net, x, y: (net(x) - y).pow(2).flatten(), InvalidValue,
     r"AutoBatch's loss_fn must return the micro-batch's mean loss \(a 0-d tensor\), got a tensor of shape \(4,\): "
     r"return its mean"),
    (lambda net, x, y: float((net(x) - y).pow(2).mean()), InvalidType,
     r"AutoBatch's loss_fn must return the micro-batch's mean loss as a tensor computed from the model \(its backward "
     r"trains it\), got float .*: return the loss tensor itself, not loss\.item\(\) or a number"),
])
def test_auto_batch_names_a_loss_that_is_no_mean_loss_tensor(loss, error, message):
    """Per-sample losses raised torch's "grad can be implicitly created only for scalar outputs", a
    float an AttributeError; the update's micro-steps are dropped, so the next update starts clean."""
    auto, net = auto_batch()
    x, y = torch.randn(8, 2), torch.randn(8, 1)
    with pytest.raises(error, match=message):
        auto.update(lambda xb, yb: loss(net, xb, yb), x, y)
    assert auto.optimizer.micro_step == 0 and all(p.grad is None for p in net.parameters())
    auto.update(lambda xb, yb: (net(xb) - yb).pow(2).mean(), x, y)
    assert auto.updates == 1 and auto.optimizer.applied == 1


@pytest.mark.parametrize(("state", "error", "message"), [
    ({}, InvalidValue, r"AutoBatch\.load_state_dict takes what AutoBatch\.state_dict\(\) gave, \{'device_batch': n\}, "
                       r"got \{\}"),
    ({"device_batch": "x"}, InvalidType, r"AutoBatch state_dict\(\)\['device_batch'\] must be a positive integer, got "
                                         r"'x'"),
    ({"device_batch": 0}, InvalidValue, r"must be a positive integer, got 0"),
])
def test_auto_batch_names_a_state_it_did_not_give(state, error, message):
    """load_state_dict({}) raised a KeyError, ({'device_batch': 'x'}) int()'s ValueError."""
    auto, _ = auto_batch()
    with pytest.raises(error, match=message):
        auto.load_state_dict(state)
    auto.load_state_dict(auto.state_dict())


def test_the_ga_optimizer_names_a_scaler_that_is_no_gradscaler():
    """Optimizer(..., scaler="amp") raised "'str' object has no attribute 'is_enabled'" at the first update."""
    from aikit.ga.Torch.optim import Optimizer

    net = torch.nn.Linear(2, 1)
    with pytest.raises(InvalidType, match=r"scaler must be a torch\.amp\.GradScaler \(or None\), got str 'amp': "
                                          r"scaler=torch\.amp\.GradScaler\('cuda'\)"):
        Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 2, scaler="amp")
