"""aikit.lr_finder.Torch.LRFinder: torch-lr-finder 0.2.2's behaviour and tests, and what aikit adds."""

from __future__ import annotations

import copy
import math

import matplotlib
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aikit.core.errors import InvalidValue
from aikit.core.lr_range import lr_sequence, read_history
from aikit.lr_finder.Torch import LRFinder, TrainDataLoaderIter, ValDataLoaderIter

matplotlib.use("Agg")
pytestmark = pytest.mark.filterwarnings("ignore:.*non-interactive.*:UserWarning")


@pytest.fixture(autouse=True)
def float64():
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


def xor_data(samples=64, batch_size=8, shuffle=False):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 2, (samples, 2), generator=g).to(torch.get_default_dtype())
    y = (x[:, :1] != x[:, 1:]).to(x.dtype)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=shuffle)


def xor_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 1))


def two_groups(model, lrs=(1e-3, 1e-5), optimizer=torch.optim.SGD):
    """Discriminative LRs: the first layer in one group, the rest in another."""
    return optimizer([{"params": model[0].parameters(), "lr": lrs[0]},
                      {"params": [p for m in model[1:] for p in m.parameters()], "lr": lrs[1]}])


def state(tree):
    """A deep copy of a state dict, for comparing before and after."""
    return copy.deepcopy(tree)


def assert_same_state(a, b):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same_state(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same_state(x, y)
    else:
        assert a == b


def lrs_at_each_step(optimizer) -> list[list[float]]:
    """Every group's LR at every optimizer step (a step pre-hook, not a mock)."""
    seen = []
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: seen.append([g["lr"] for g in opt.param_groups]))
    return seen


# --- the range test -------------------------------------------------------------------------


@pytest.mark.parametrize("with_val", [False, True])
def test_runs_with_and_without_a_val_loader_and_climbs_above_the_initial_lr(with_val):
    model = xor_model()
    finder = LRFinder(model, torch.optim.SGD(model.parameters(), lr=1e-5), nn.MSELoss())
    finder.range_test(xor_data(), val_loader=xor_data() if with_val else None, end_lr=1e-2, num_iter=10)
    assert len(finder.history["lr"]) == len(finder.history["loss"]) == 10
    assert max(finder.history["lr"]) >= 1e-5


@pytest.mark.parametrize("mode, end, expected", [
    ("linear", 5e-5, [1e-5, 2e-5, 3e-5, 4e-5, 5e-5]),
    ("exp", 1e-1, [1e-5, 1e-4, 1e-3, 1e-2, 1e-1]),
])
def test_history_holds_the_exact_lr_sequence_and_every_group_climbs_from_its_own_lr(mode, end, expected):
    model = xor_model()
    optimizer = two_groups(model, lrs=(1e-5, 1e-6))
    seen = lrs_at_each_step(optimizer)
    finder = LRFinder(model, optimizer, nn.MSELoss())
    finder.range_test(xor_data(), end_lr=end, num_iter=5, step_mode=mode, diverge_th=math.inf)
    assert finder.history["lr"] == pytest.approx(expected, rel=1e-12)
    assert [s[0] for s in seen] == finder.history["lr"]
    assert [s[1] for s in seen] == lr_sequence(1e-6, end, 5, mode)


def test_each_recorded_loss_is_the_training_loss_of_the_step_at_that_lr():
    """A hand-written loop with the same LRs gives the same losses (no off-by-one, #42)."""
    loader = xor_data()
    model = xor_model()
    reference = copy.deepcopy(model)
    finder = LRFinder(model, torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9), nn.MSELoss())
    finder.range_test(loader, end_lr=1.0, num_iter=12, smooth_f=0, diverge_th=math.inf)

    optimizer = torch.optim.SGD(reference.parameters(), lr=1e-3, momentum=0.9)
    losses, batches = [], iter(loader)
    for lr in lr_sequence(1e-3, 1.0, 12):
        x, y = next(batches, None) or next(batches := iter(loader))
        optimizer.param_groups[0]["lr"] = lr
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(reference(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert finder.history["loss"] == pytest.approx(losses, rel=1e-12)


def test_the_test_stops_after_the_diverging_point_and_keeps_it():
    model = xor_model()
    finder = LRFinder(model, torch.optim.SGD(model.parameters(), lr=1e-2), nn.MSELoss())
    finder.range_test(xor_data(), end_lr=1e4, num_iter=100, smooth_f=0)
    losses = finder.history["loss"]
    assert len(losses) < 100
    assert losses[-1] > 5 * min(losses) or not math.isfinite(losses[-1])
    assert all(loss <= 5 * min(losses[: i + 1]) for i, loss in enumerate(losses[:-1]))


def test_a_nan_loss_stops_the_test():
    calls = []

    def criterion(outputs, labels):
        calls.append(1)
        loss = nn.functional.mse_loss(outputs, labels)
        return loss * math.nan if len(calls) == 4 else loss

    model = xor_model()
    finder = LRFinder(model, torch.optim.SGD(model.parameters(), lr=1e-5), criterion)
    finder.range_test(xor_data(), end_lr=1e-4, num_iter=20, diverge_th=math.inf)
    assert len(finder.history["loss"]) == 4
    assert math.isnan(finder.history["loss"][-1])


def test_accumulation_calls_the_criterion_accumulation_steps_times_per_iteration():
    calls = []

    def criterion(outputs, labels):
        calls.append(len(labels))
        return nn.functional.mse_loss(outputs, labels)

    model = xor_model()
    finder = LRFinder(model, torch.optim.SGD(model.parameters(), lr=1e-5), criterion)
    finder.range_test(xor_data(batch_size=4), end_lr=1e-3, num_iter=10, accumulation_steps=4)
    assert calls == [4] * 40


def test_an_accumulated_update_equals_the_update_on_the_concatenated_batch():
    runs = {}
    for batch_size, steps in [(8, 1), (4, 2)]:
        model = xor_model()
        finder = LRFinder(model, torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9), nn.MSELoss())
        finder.range_test(xor_data(batch_size=batch_size), end_lr=1.0, num_iter=6, accumulation_steps=steps,
                          diverge_th=math.inf)
        runs[steps] = finder.history["loss"], [p.detach().clone() for p in model.parameters()]
    assert runs[2][0] == pytest.approx(runs[1][0], rel=1e-12)
    for a, b in zip(runs[2][1], runs[1][1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def test_validation_loss_is_the_mean_over_every_validation_sample():
    model = xor_model()
    finder = LRFinder(model, torch.optim.SGD(model.parameters(), lr=1e-5), nn.MSELoss())
    val = xor_data(samples=20, batch_size=8)  # batches of 8, 8, 4
    finder.range_test(xor_data(), val_loader=val, end_lr=1e-4, num_iter=2, smooth_f=0)
    x, y = val.dataset.tensors
    model.eval()
    with torch.no_grad():
        assert finder.history["loss"][-1] == pytest.approx(nn.functional.mse_loss(model(x), y).item(), rel=1e-12)


def test_start_lr_overrides_every_group_and_a_list_gives_one_per_group():
    model = xor_model()
    optimizer = two_groups(model)
    seen = lrs_at_each_step(optimizer)
    finder = LRFinder(model, optimizer, nn.MSELoss())
    finder.range_test(xor_data(), start_lr=[1e-4, 1e-6], end_lr=1e-2, num_iter=3)
    assert seen[0] == [1e-4, 1e-6]
    finder.range_test(xor_data(), start_lr=1e-4, end_lr=1e-2, num_iter=3)
    assert seen[3] == [1e-4, 1e-4]
    with pytest.raises(ValueError, match="got 3 start LRs for 2 groups"):
        finder.range_test(xor_data(), start_lr=[1e-4, 1e-5, 1e-6], num_iter=3)


def test_a_subclass_overriding_train_batch_as_for_torch_lr_finder_gets_its_losses_recorded():
    """torch-lr-finder's ``_train_batch(train_iter, accumulation_steps, non_blocking_transfer)``
    returns a float; a subclass that overrides it (a custom forward pass) still drives the test."""

    class Custom(LRFinder):
        def _train_batch(self, train_iter, accumulation_steps, non_blocking_transfer=True):
            return 2.0 * float(super()._train_batch(train_iter, accumulation_steps, non_blocking_transfer))

    histories = []
    for finder_class in (LRFinder, Custom):
        model = xor_model()
        finder = finder_class(model, torch.optim.SGD(model.parameters(), lr=1e-3), nn.MSELoss())
        finder.range_test(xor_data(), end_lr=1.0, num_iter=5, smooth_f=0, diverge_th=math.inf)
        histories.append(finder.history)
    assert histories[1]["lr"] == histories[0]["lr"]
    assert histories[1]["loss"] == [2.0 * loss for loss in histories[0]["loss"]]


def test_linear_from_start_lr_zero_starts_at_zero():
    model = xor_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    finder = LRFinder(model, optimizer, nn.MSELoss())
    finder.range_test(xor_data(), start_lr=0.0, end_lr=1e-2, num_iter=3, step_mode="linear")
    assert finder.history["lr"] == [0.0, 0.005, 0.01]


# --- reset and state ------------------------------------------------------------------------


def test_reset_restores_weights_optimizer_state_and_every_groups_lr():
    model = xor_model()
    optimizer = two_groups(model, optimizer=torch.optim.Adam)
    x, y = next(iter(xor_data()))
    nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()  # Adam now has moments to lose
    weights, opt_state = state(model.state_dict()), state(optimizer.state_dict())
    finder = LRFinder(model, optimizer, nn.MSELoss())
    for _ in range(2):  # a second reset must restore the same state again
        finder.range_test(xor_data(), end_lr=1.0, num_iter=8)
        assert not torch.equal(model[0].weight, weights["0.weight"])
        finder.reset()
        assert_same_state(model.state_dict(), weights)
        assert_same_state(optimizer.state_dict(), opt_state)
        assert [g["lr"] for g in optimizer.param_groups] == [1e-3, 1e-5]
        assert all("initial_lr" not in g for g in optimizer.param_groups)


def test_the_groups_lrs_are_put_back_after_a_test_so_a_second_test_runs_without_reset():
    model = xor_model()
    optimizer = two_groups(model)
    finder = LRFinder(model, optimizer, nn.MSELoss())
    finder.range_test(xor_data(), start_lr=1e-2, end_lr=1.0, num_iter=4)
    assert [g["lr"] for g in optimizer.param_groups] == [1e-3, 1e-5]
    finder.range_test(xor_data(), end_lr=1.0, num_iter=4)
    assert finder.history["lr"][0] == 1e-3


def test_disk_cache_restores_and_removes_its_files(tmp_path):
    model = xor_model()
    weights = state(model.state_dict())
    finder = LRFinder(model, torch.optim.SGD(model.parameters(), lr=1e-3), nn.MSELoss(),
                      memory_cache=False, cache_dir=str(tmp_path))
    assert sorted(p.name.split("_")[1] for p in tmp_path.iterdir()) == ["model", "optimizer"]
    finder.range_test(xor_data(), end_lr=1.0, num_iter=4)
    finder.reset()
    assert_same_state(model.state_dict(), weights)
    del finder
    assert list(tmp_path.iterdir()) == []


def test_a_missing_cache_dir_is_refused_by_name(tmp_path):
    model = xor_model()
    with pytest.raises(ValueError, match=r"Given `cache_dir` is not a valid directory: '.*nowhere'"):
        LRFinder(model, torch.optim.SGD(model.parameters(), lr=1e-3), nn.MSELoss(),
                 memory_cache=False, cache_dir=str(tmp_path / "nowhere"))


def test_an_optimizer_with_a_scheduler_attached_is_refused():
    model = xor_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    with pytest.raises(RuntimeError, match=r"^Optimizer already has a scheduler attached to it; create the LRFinder"):
        LRFinder(model, optimizer, nn.MSELoss())


# --- mixed precision through torch.amp ------------------------------------------------------


def test_torch_amp_on_cpu_runs_under_bfloat16_autocast_and_scales_every_micro_batch():
    torch.set_default_dtype(torch.float32)
    model = xor_model()
    scaler = torch.amp.GradScaler("cpu")
    scaled, dtypes = [], []
    scale = scaler.scale
    scaler.scale = lambda loss: scaled.append(1) or scale(loss)
    model[0].register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    finder = LRFinder(model, torch.optim.SGD(model.parameters(), lr=1e-5), nn.MSELoss(),
                      amp_backend="torch", grad_scaler=scaler)
    finder.range_test(xor_data(), end_lr=1e-3, num_iter=5, accumulation_steps=2)
    assert len(scaled) == 10
    assert set(dtypes) == {torch.bfloat16}
    assert all(math.isfinite(loss) for loss in finder.history["loss"])


@pytest.mark.parametrize("kwargs, message", [
    ({"amp_backend": "apex"}, "Unknown amp backend: 'apex'; aikit supports amp_backend='torch'"),
    ({"amp_backend": "torch"}, "`grad_scaler` is required when using `torch.amp`: pass grad_scaler="),
])
def test_bad_amp_settings_are_refused(kwargs, message):
    model = xor_model()
    with pytest.raises(ValueError) as error:
        LRFinder(model, torch.optim.SGD(model.parameters(), lr=1e-3), nn.MSELoss(), **kwargs)
    assert str(error.value).startswith(message)


# --- data iterators -------------------------------------------------------------------------


def test_the_train_iterator_starts_the_loader_again_when_it_runs_out():
    loader = xor_data(samples=16, batch_size=8)
    train_iter = TrainDataLoaderIter(loader)
    for _ in range(len(loader) + 1):
        next(train_iter)
    with pytest.raises(StopIteration):
        no_reset = TrainDataLoaderIter(loader, auto_reset=False)
        for _ in range(len(loader) + 1):
            next(no_reset)


def test_the_val_iterator_stops_after_one_pass_and_starts_again_through_iter():
    loader = xor_data(samples=16, batch_size=8)
    val_iter = ValDataLoaderIter(loader)
    for _ in range(len(loader)):
        next(val_iter)
    with pytest.raises(StopIteration):
        next(val_iter)
    assert len(list(iter(val_iter))) == len(loader)


def test_inputs_labels_from_batch_is_called_once_per_batch():
    class Counting(TrainDataLoaderIter):
        calls = 0

        def inputs_labels_from_batch(self, batch_data):
            type(self).calls += 1
            return super().inputs_labels_from_batch(batch_data)

    class CountingVal(ValDataLoaderIter):
        calls = 0

        def inputs_labels_from_batch(self, batch_data):
            type(self).calls += 1
            return super().inputs_labels_from_batch(batch_data)

    model = xor_model()
    finder = LRFinder(model, torch.optim.SGD(model.parameters(), lr=1e-5), nn.MSELoss())
    val = xor_data(samples=24, batch_size=8)
    finder.range_test(Counting(xor_data()), val_loader=CountingVal(val), end_lr=1e-4, num_iter=5)
    assert Counting.calls == 5
    assert CountingVal.calls == 5 * len(val)


def test_dict_batches_work_through_a_subclass():
    class DictDataset(torch.utils.data.Dataset):
        def __init__(self, tensors):
            self.x, self.y = tensors

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return {"features": self.x[i], "target": self.y[i]}

    class DictIter(TrainDataLoaderIter):
        def inputs_labels_from_batch(self, batch_data):
            return batch_data["features"], batch_data["target"]

    loader = DataLoader(DictDataset(xor_data().dataset.tensors), batch_size=8)
    model = xor_model()
    finder = LRFinder(model, torch.optim.SGD(model.parameters(), lr=1e-5), nn.MSELoss())
    with pytest.raises(ValueError, match="Your batch type is not supported: <class 'dict'>"):
        finder.range_test(loader, end_lr=1e-4, num_iter=3)
    finder.range_test(DictIter(loader), end_lr=1e-4, num_iter=3)
    assert len(finder.history["loss"]) == 3


@pytest.mark.parametrize("name", ["train_loader", "val_loader"])
def test_loaders_of_other_types_are_refused(name):
    model = xor_model()
    finder = LRFinder(model, torch.optim.SGD(model.parameters(), lr=1e-5), nn.MSELoss())
    wrong = iter(xor_data())  # a plain iterator, no DataLoader nor DataLoaderIter subclass
    loaders = {"train_loader": xor_data(), "val_loader": None, name: wrong}
    with pytest.raises(ValueError, match=f"^`{name}` has unsupported type: <class '"):
        finder.range_test(**loaders, num_iter=3)


@pytest.mark.parametrize("kwargs, message", [
    ({"num_iter": 1}, "num_iter must be an integer larger than 1"),
    ({"num_iter": 0}, "num_iter must be an integer larger than 1"),
    ({"step_mode": "cos"}, "step_mode must be one of ('exp', 'linear') (any case), got 'cos'"),
    ({"smooth_f": 1}, "smooth_f must lie in [0, 1), got 1.0"),
    ({"accumulation_steps": 0}, "accumulation_steps must be a positive integer, got 0"),
    # a downward sweep (torch-lr-finder ran it without a word)
    ({"end_lr": 1e-6}, "end_lr=1e-06 is not above the start LR 1e-05 (start_lr, or the optimizer's LR when "
                       "start_lr is None): the range test climbs from a small LR to a large one"),
    ({"start_lr": 1.0, "end_lr": 0.1}, "end_lr=0.1 is not above the start LR 1.0"),
    ({"start_lr": 0.1, "end_lr": 0.1, "step_mode": "linear"}, "end_lr=0.1 is not above the start LR 0.1"),
])
def test_bad_range_test_arguments_are_refused_before_anything_changes(kwargs, message):
    model = xor_model()
    weights = state(model.state_dict())
    finder = LRFinder(model, torch.optim.SGD(model.parameters(), lr=1e-5), nn.MSELoss())
    with pytest.raises(ValueError) as error:
        finder.range_test(xor_data(), **kwargs)
    assert str(error.value).startswith(message)
    assert_same_state(model.state_dict(), weights)


# --- plot, suggestions and CSV --------------------------------------------------------------


@pytest.mark.parametrize(("call", "what"), [
    (lambda finder: finder.plot(), "plot()"),
    (lambda finder: finder.plot(suggest_lr=False), "plot()"),
    (lambda finder: finder.suggest_lr("valley"), "suggest_lr()"),
    (lambda finder: finder.to_csv("never.csv"), "to_csv()"),
])
def test_plot_suggestions_and_csv_before_a_range_test_say_run_range_test_first(call, what, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = xor_model()
    finder = LRFinder(model, torch.optim.SGD(model.parameters(), lr=1e-5), nn.MSELoss())
    with pytest.raises(RuntimeError, match=rf"^{what[:-2]}\(\) reads the range test's history, which is empty: "
                                           r"run range_test\(\) first$"):
        call(finder)
    assert not (tmp_path / "never.csv").exists()


@pytest.fixture(scope="module")
def finder_11():
    torch.set_default_dtype(torch.float64)
    model = xor_model()
    finder = LRFinder(model, torch.optim.SGD(model.parameters(), lr=1e-5), nn.MSELoss())
    finder.range_test(xor_data(), end_lr=1e-1, num_iter=11, diverge_th=math.inf)
    return finder


@pytest.mark.parametrize("skip_start", [0, 5, 10])
@pytest.mark.parametrize("skip_end", [0, 5, 10])
def test_plot_draws_the_trimmed_curve_or_says_it_needs_more_points(finder_11, skip_start, skip_end):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    if skip_start + skip_end + 2 > 11:
        with pytest.raises(RuntimeError, match=f"Need at least {skip_start + skip_end + 2} iterations"):
            finder_11.plot(skip_start=skip_start, skip_end=skip_end, ax=ax)
        return
    got_ax, lr = finder_11.plot(skip_start=skip_start, skip_end=skip_end, ax=ax)
    end = len(finder_11.history["lr"]) - skip_end
    assert got_ax is ax
    assert list(ax.lines[0].get_xdata()) == finder_11.history["lr"][skip_start:end]
    assert list(ax.lines[0].get_ydata()) == finder_11.history["loss"][skip_start:end]
    assert len(ax.collections) == 1  # the suggestion's marker
    assert lr in finder_11.history["lr"][skip_start:end]
    plt.close(fig)


def test_plot_without_a_suggestion_returns_only_the_axes_and_marks_show_lr(finder_11):
    import matplotlib.pyplot as plt

    ax = finder_11.plot(skip_start=0, skip_end=0, suggest_lr=False, show_lr=1e-3)
    assert isinstance(ax, matplotlib.axes.Axes)
    assert ax.get_xscale() == "log"
    assert len(ax.lines) == 2 and list(ax.lines[1].get_xdata()) == [1e-3, 1e-3]
    plt.close("all")
    with pytest.raises(ValueError, match="show_lr must be float, got '1e-3'"):
        finder_11.plot(show_lr="1e-3")
    with pytest.raises(ValueError, match="skip_start cannot be negative, got -1"):
        finder_11.plot(skip_start=-1)


@pytest.mark.parametrize("method", ["steepest", "valley", "minimum"])
def test_plot_and_suggest_lr_agree_for_every_method(finder_11, method):
    import matplotlib.pyplot as plt

    _, lr = finder_11.plot(skip_start=1, skip_end=1, suggest_lr=method)
    assert lr == finder_11.suggest_lr(method, skip_start=1, skip_end=1)
    plt.close("all")


def test_history_is_saved_to_csv(finder_11, tmp_path):
    finder_11.to_csv(tmp_path / "history.csv")
    assert read_history(tmp_path / "history.csv") == finder_11.history


def test_list_inputs_and_labels_are_moved_and_passed_through_as_lists():
    """torch-lr-finder's LSTM task feeds a list of tensors; _move keeps lists, tuples and dicts."""

    class TwoInputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(2, 1), nn.Linear(2, 1)

        def forward(self, inputs):
            assert isinstance(inputs, list)
            return self.a(inputs[0]) + self.b(inputs[1])

    class ListIter(TrainDataLoaderIter):
        def inputs_labels_from_batch(self, batch_data):
            x, y = batch_data
            return [x, 1 - x], y

    torch.manual_seed(0)
    model = TwoInputs()
    finder = LRFinder(model, torch.optim.SGD(model.parameters(), lr=1e-5), nn.MSELoss(), device="cpu")
    finder.range_test(ListIter(xor_data()), end_lr=1e-3, num_iter=4, non_blocking_transfer=False)
    assert len(finder.history["loss"]) == 4


def test_the_names_users_import_from_torch_lr_finder_and_its_lr_finder_module_exist():
    import aikit.lr_finder.Torch as package
    import aikit.lr_finder.Torch.lr_finder as module

    for name in ("LRFinder", "TrainDataLoaderIter", "ValDataLoaderIter"):
        assert getattr(package, name) is getattr(module, name)
    assert issubclass(module.TrainDataLoaderIter, module.DataLoaderIter)
    assert module.StateCacher is package.StateCacher


def test_a_trace_optimizer_is_refused_with_what_to_pass_instead():
    from aikit.elastic.Torch import CustomSampler, LinearRuleOptimizer

    net = torch.nn.Linear(3, 1)
    sampler = CustomSampler(64, 16, num_replicas=1, rank=0, minibatch_size=8)
    traced = LinearRuleOptimizer(torch.optim.SGD(net.parameters(), lr=1e-3), sampler, 16)
    with pytest.raises(TypeError, match=r"aikit trace optimizer, whose updates follow its sampler's batch-size trace"
                                        r".*LRFinder\(model, optimizer.optimizer, criterion\)"):
        LRFinder(net, traced, torch.nn.MSELoss())


# --- through aikit's GA optimizer (issue 27): one LR per update --------------------------------


def regression(samples=256, poison=()):
    """A regression loader; the samples in ``poison`` get inputs of 3e17: for a linear model a
    finite float32 loss whose gradient, times a GradScaler's 65536, overflows (an update AMP skips)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(samples, 4, generator=g, dtype=torch.get_default_dtype())
    y = x.sum(1, keepdim=True).sin()
    for index in poison:
        x[index] = 3e17
    return x, y


def ga_run(batch_size, steps, num_iter=10, end_lr=1.0, data=None, scaler=None, inner_lr=1e-4, linear=False, **test):
    """A range test of a small net (a linear model with ``linear``) through GA(SGD, steps) on
    batches of ``batch_size`` (plain SGD when ``steps`` is None); returns the finder, the LR of
    every real update and the model."""
    from aikit.ga.Torch.optim import Optimizer as GAOptimizer

    torch.manual_seed(0)
    model = nn.Linear(4, 1) if linear else nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    inner = torch.optim.SGD(model.parameters(), lr=inner_lr, momentum=0.9)
    updates = lrs_at_each_step(inner)  # the wrapped optimizer's real steps (a skipped one never calls it)
    optimizer = inner if steps is None else GAOptimizer(inner, steps, scaler=scaler)
    x, y = regression() if data is None else data
    finder = LRFinder(model, optimizer, nn.MSELoss(), **({"amp_backend": "torch", "grad_scaler": scaler}
                                                          if scaler is not None and steps is None else {}))
    finder.range_test(DataLoader(TensorDataset(x, y), batch_size=batch_size), end_lr=end_lr, num_iter=num_iter,
                      diverge_th=math.inf, progress_bar=False, **test)
    return finder, [lrs[0] for lrs in updates], model


def test_a_range_test_through_a_ga_optimizer_equals_the_range_test_of_the_big_batch():
    big, big_updates, big_model = ga_run(16, None)
    ga, ga_updates, ga_model = ga_run(4, 4)
    expected = lr_sequence(1e-4, 1.0, 10)
    assert big.history["lr"] == ga.history["lr"] == expected  # one LR per update, not per micro-batch
    assert ga_updates == big_updates == expected  # 10 real updates, each at its LR
    assert ga.optimizer.micro_steps == 40 and ga.optimizer.applied == 10
    assert ga.history["loss"] == pytest.approx(big.history["loss"], rel=1e-13)
    for a, b in zip(ga_model.parameters(), big_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-15)
    accumulated, _, _ = ga_run(4, None, accumulation_steps=4)  # the finder's own accumulation agrees too
    assert accumulated.history["loss"] == pytest.approx(ga.history["loss"], rel=1e-13)


@pytest.mark.parametrize("steps", [2, None], ids=["GA optimizer", "accumulation_steps"])
def test_an_update_amp_skipped_is_made_again_at_its_lr_and_not_counted(steps):
    torch.set_default_dtype(torch.float32)
    scaler = torch.amp.GradScaler("cpu")
    data = regression(poison=[4 * 3 + 1])  # the 2nd micro-batch of update 1 (batches of 4, 2 per update)
    finder, updates, _ = ga_run(4, steps, num_iter=8, end_lr=1e-2, data=data, scaler=scaler, inner_lr=1e-5,
                                linear=True, **({} if steps else {"accumulation_steps": 2}))
    expected = lr_sequence(1e-5, 1e-2, 8)
    assert finder.history["lr"] == expected  # every LR once: the skipped update's LR was tried again
    assert updates == expected  # 8 real updates, none at a skipped LR twice nor one missing
    assert all(math.isfinite(loss) and loss < 10 for loss in finder.history["loss"])  # the poisoned loss: not kept
    assert scaler.get_scale() == 65536.0 / 2  # one skip lowered the scale
    finder.reset()
    assert scaler.get_scale() == 65536.0  # reset() restores the scaler too


def test_reset_after_a_ga_range_test_restores_the_model_and_the_ga_optimizer_exactly():
    from aikit.ga.Torch.optim import Optimizer as GAOptimizer

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    ga = GAOptimizer(torch.optim.Adam(model.parameters(), lr=1e-4), 3)
    x, y = regression()
    loader = DataLoader(TensorDataset(x, y), batch_size=4)
    for xb, yb in list(loader)[:6]:  # two updates of training first: Adam's moments and step exist
        nn.functional.mse_loss(model(xb), yb).backward()
        ga.step()
    weights, optimizer_state = state(model.state_dict()), state(ga.state_dict())
    counters = (ga.applied, ga.micro_steps, ga.micro_step)
    finder = LRFinder(model, ga, nn.MSELoss())
    finder.range_test(loader, end_lr=1.0, num_iter=7, progress_bar=False)
    first = list(finder.history["loss"])
    assert ga.applied == counters[0] + 7
    finder.reset()
    assert_same_state(model.state_dict(), weights)
    assert_same_state(ga.state_dict(), optimizer_state)  # Adam's moments and step, the GA position and count
    assert (ga.applied, ga.micro_steps, ga.micro_step) == counters
    finder.range_test(loader, end_lr=1.0, num_iter=7, progress_bar=False)
    assert finder.history["loss"] == first  # the same test again, to the bit


def test_a_ga_range_test_refuses_what_would_not_be_one_lr_per_update():
    from aikit.ga.Torch.optim import Optimizer as GAOptimizer

    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    ga = GAOptimizer(torch.optim.SGD(model.parameters(), lr=1e-4), 4)
    loader = DataLoader(TensorDataset(*regression()), batch_size=4)
    finder = LRFinder(model, ga, nn.MSELoss())
    with pytest.raises(ValueError, match=r"^accumulation_steps=2 through a GA optimizer, which accumulates "
                                         r"optimizer.steps=4 micro-batches per update itself: leave"):
        finder.range_test(loader, num_iter=3, accumulation_steps=2)
    nn.functional.mse_loss(model(torch.ones(2, 4)), torch.ones(2, 1)).backward()
    ga.step()
    with pytest.raises(ValueError, match=r"^the GA optimizer is 1 micro-steps into an update: run the range test "
                                         r"between updates"):
        finder.range_test(loader, num_iter=3)
    with pytest.raises(ValueError, match=r"uses the GA optimizer's own: build it with Optimizer\(optimizer, steps, "
                                         r"scaler=grad_scaler\) and leave grad_scaler out of LRFinder"):
        LRFinder(model, GAOptimizer(torch.optim.SGD(model.parameters(), lr=1e-4), 4), nn.MSELoss(),
                 amp_backend="torch", grad_scaler=torch.amp.GradScaler("cpu"))
    with pytest.raises(ValueError, match=r"amp_backend='torch' through a GA optimizer without a GradScaler"):
        LRFinder(model, GAOptimizer(torch.optim.SGD(model.parameters(), lr=1e-4), 4), nn.MSELoss(),
                 amp_backend="torch")


# --- what a user reads when the test cannot run, or a plot cannot suggest --------------------


class HalfLabels(TrainDataLoaderIter):
    """A loader whose batches hold half as many labels as inputs."""

    def inputs_labels_from_batch(self, batch):
        inputs, labels = batch
        return inputs, labels[: len(labels) // 2, 0].long()


@pytest.mark.parametrize(("criterion", "loader", "error", "shapes"), [
    (nn.MSELoss(), lambda x, y: DataLoader(TensorDataset(x, y.repeat(1, 3)), batch_size=8), RuntimeError,
     "outputs of shape (8, 2) and labels of shape (8, 3)"),
    (nn.CrossEntropyLoss(), lambda x, y: HalfLabels(DataLoader(TensorDataset(x, y), batch_size=8)), ValueError,
     "outputs of shape (8, 2) and labels of shape (4,)"),
])
def test_a_criterion_that_fails_on_the_first_batch_says_so_with_the_shapes(criterion, loader, error, shapes):
    """torch's "The size of tensor a (2) must match ..." alone did not say that the user's
    criterion failed, nor on what: an aikit InvalidValue now says both, torch's error chained
    (issue 47: the same type kept was a raw RuntimeError still)."""
    x, y = xor_data().dataset.tensors
    torch.manual_seed(0)
    model = nn.Linear(2, 2)
    weights = state(model.state_dict())
    finder = LRFinder(model, torch.optim.SGD(model.parameters(), lr=1e-5), criterion)
    with pytest.raises(InvalidValue) as raised:
        finder.range_test(loader(x, y), num_iter=3, progress_bar=False)
    message = str(raised.value)
    assert message.endswith(
        f"(aikit LRFinder: the criterion failed on the range test's first batch: criterion(model(inputs), labels) got "
        f"{shapes}; give a criterion that takes the model's outputs and the loader's labels as they are, e.g. "
        "nn.CrossEntropyLoss() for class indices of shape (N,) and outputs (N, classes), nn.MSELoss() for targets of "
        "the outputs' shape)")
    assert message.split("\n")[0] == str(raised.value.__cause__)  # torch's own words first
    assert type(raised.value.__cause__) is error  # torch's error chained as it was
    assert_same_state(model.state_dict(), weights)


@pytest.fixture(scope="module")
def finder_5():
    model = xor_model()
    finder = LRFinder(model, torch.optim.SGD(model.parameters(), lr=1e-5), nn.MSELoss())
    finder.range_test(xor_data(), end_lr=1e-1, num_iter=5, diverge_th=math.inf, progress_bar=False)
    return finder


def test_a_plot_after_a_short_test_keeps_torch_lr_finders_words_and_names_the_fixes(finder_5):
    import matplotlib.pyplot as plt

    with pytest.raises(RuntimeError) as raised:
        finder_5.plot()
    assert str(raised.value) == (
        "Need at least 17 iterations to suggest a learning rate. Got 5: plot(suggest_lr=False) draws them without a "
        "suggestion; to suggest one, skip fewer points (skip_start=10, skip_end=5) or run range_test() with more "
        "iterations (num_iter, a lower start_lr or a higher diverge_th if the loss diverged early)")
    with pytest.raises(RuntimeError, match=r"^Need at least 17 iterations to suggest a learning rate\. Got 5: to "
                                           r"suggest one, skip fewer points"):
        finder_5.suggest_lr()
    fig, ax = plt.subplots()
    assert finder_5.plot(suggest_lr=False, ax=ax) is ax  # the fix it names works
    assert list(ax.lines[0].get_ydata()) == finder_5.history["loss"][10:-5]
    plt.close(fig)


def test_a_plot_after_a_nan_first_loss_says_the_loss_was_nan_at_the_first_lr():
    model = xor_model()
    with torch.no_grad():
        model[0].weight[0, 0] = math.nan
    finder = LRFinder(model, torch.optim.SGD(model.parameters(), lr=1e-5), nn.MSELoss())
    finder.range_test(xor_data(), num_iter=20, progress_bar=False)
    assert len(finder.history["lr"]) == 1 and math.isnan(finder.history["loss"][0])
    with pytest.raises(RuntimeError) as raised:
        finder.plot()
    assert str(raised.value) == (
        "Need at least 17 iterations to suggest a learning rate. Got 1: the loss was nan at the first LR (1.00E-05), "
        "which ended the test. Check the model, the data and the loss for inf/NaN (inputs or labels, a log or a "
        "division by 0), then run range_test() again")
