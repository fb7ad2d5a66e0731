"""aikit's Hugging Face Trainer integration trains exactly as the same training written by hand
(float64, CPU): the plan's TrainingArguments give big-batch steps, and the AutoLRS callback
takes the decisions of the AutoLRS hook driven by hand."""

from __future__ import annotations

import accelerate_case
import pytest
import torch
from integration_common import AUTOLRS as COMMON_AUTOLRS
from integration_common import assert_same_search, autolrs_by_hand, data
from torch import nn

transformers = pytest.importorskip("transformers")

from aikit.autolrs.Torch import AutoLRS  # noqa: E402
from aikit.core.errors import InvalidType, InvalidValue, TrainingFailed  # noqa: E402
from aikit.integrations.huggingface import AutoLRSCallback, keep_global_batch, plan_arguments  # noqa: E402

AUTOLRS = {**COMMON_AUTOLRS, "val_tau": 8}


class Net(nn.Module):
    """A model the Trainer can train: it computes its own loss, as Transformers models do."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.body = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).double()

    def forward(self, x, labels=None):
        logits = self.body(x)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


class Samples(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


def train(model, callbacks, tmp_path, epochs: int, **arguments):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), num_train_epochs=epochs, use_cpu=True, report_to="none", save_strategy="no",
        disable_tqdm=True, max_grad_norm=0.0, lr_scheduler_type="constant", train_sampling_strategy="sequential",
        dataloader_drop_last=True, logging_strategy="no", **arguments,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Samples(*data()), callbacks=callbacks,
                                   optimizers=(optimizer, None))
    trainer.train()
    return trainer


def assert_same_weights(a: nn.Module, b: nn.Module) -> None:
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=1e-12, atol=1e-12)


def test_plan_arguments_give_big_batch_steps(tmp_path):
    arguments = plan_arguments(64, 16)
    assert arguments == {"per_device_train_batch_size": 16, "gradient_accumulation_steps": 4}
    model = Net()
    train(model, [], tmp_path, epochs=2, **arguments)

    reference, (x, y) = Net(), data()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        for start in (0, 64):
            optimizer.zero_grad()
            reference(x[start:start + 64], y[start:start + 64])["loss"].backward()
            optimizer.step()
    assert_same_weights(model, reference)


def test_plan_arguments_refuse_an_uneven_split():
    with pytest.raises(ValueError, match=r"global_batch_size 7 does not split evenly over 1 device\(s\) with at "
                                         r"most 3 samples each.*use global_batch_size 6 or 9"):
        plan_arguments(7, 3)
    with pytest.raises(ValueError, match=r"gpus=3 but only 1 device\(s\) can be used here .*make_plan\(100, 30, 3\)"):
        plan_arguments(100, 30, gpus=3)  # a plan for this machine, as init's
    assert plan_arguments(64, max_gpu_batch_size=16) == plan_arguments(64, max_device_batch=16)


def test_autolrs_callback_equals_the_hook_called_by_hand(tmp_path):
    xv, yv = data(32)

    calls = []

    def validation(model):  # run with gradients, in training mode: the callback must not count it
        return lambda: calls.append(1) or float(model(xv, yv)["loss"])

    model = Net()
    callback = AutoLRSCallback(validation(model), 1e-3, 1.0, **AUTOLRS)
    # 32 updates of 2 micro-batches of 8: warmup, trials with restores, training
    train(model, [callback], tmp_path, epochs=4, per_device_train_batch_size=8, gradient_accumulation_steps=2)

    reference = Net()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    by_hand = AutoLRS(reference, optimizer, validation(reference), 1e-3, 1.0, **AUTOLRS)
    autolrs_by_hand(by_hand, optimizer, lambda x, y: reference(x, y)["loss"])
    assert_same_search(callback.autolrs, by_hand)
    assert callback.lr == by_hand.lr and len(calls) >= 4  # both runs scored trials on validation
    assert_same_weights(model, reference)


class OutOfMemoryNet(nn.Module):
    """accelerate_case's MLP on the digits as a Trainer model: out of memory above ``fits`` samples."""

    def __init__(self, fits: int):
        super().__init__()
        self.net = accelerate_case.Net(fits)

    def forward(self, x, labels=None):
        logits = self.net(x)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def trainer_on_digits(tmp_path, fits: int | None, model: nn.Module | None = None, given_optimizer: bool = True,
                      **arguments):
    """A Trainer on the digits, with accelerate_case's SGD (``given_optimizer``) or the AdamW it makes."""
    model = OutOfMemoryNet(fits) if model is None else model
    arguments = {"auto_find_batch_size": True, **arguments}
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), num_train_epochs=accelerate_case.EPOCHS, use_cpu=True, report_to="none",
        save_strategy="no", disable_tqdm=True, max_grad_norm=0.0, lr_scheduler_type="constant", learning_rate=0.2,
        train_sampling_strategy="sequential", dataloader_drop_last=True, logging_strategy="no", **arguments)
    return transformers.Trainer(model=model, args=args, train_dataset=Samples(*accelerate_case.data(ignore=False)),
                                optimizers=(accelerate_case.optimizer(model) if given_optimizer else None, None))


def test_auto_find_batch_size_keeps_the_global_batch(tmp_path):
    trainer = keep_global_batch(trainer_on_digits(tmp_path, fits=20, **plan_arguments(128, 64)))
    trainer.train()
    assert trainer.model.net.sizes[-1] == 16 and trainer.get_total_train_batch_size(trainer.args) == 128
    assert (trainer.args.per_device_train_batch_size, trainer.args.gradient_accumulation_steps) == (16, 8)
    for got, want in zip(trainer.model.net.parameters(), accelerate_case.by_hand(ignore=False).parameters(),
                         strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_auto_find_batch_size_alone_loses_the_global_batch(tmp_path):
    """What keep_global_batch changes: the Trainer alone goes 64 -> 57 -> 51 -> 45 at GA 2."""
    trainer = trainer_on_digits(tmp_path, fits=50, **plan_arguments(128, 64))
    trainer.train()
    assert trainer.get_total_train_batch_size(trainer.args) == 90


def test_keep_global_batch_refuses_what_cannot_work(tmp_path):
    with pytest.raises(InvalidValue, match=r"auto_find_batch_size=True\): set it"):
        keep_global_batch(transformers.Trainer(
            model=OutOfMemoryNet(20), args=transformers.TrainingArguments(str(tmp_path), use_cpu=True,
                                                                         report_to="none")))
    with pytest.raises(InvalidType, match=r"takes a transformers\.Trainer, got str"):
        keep_global_batch("trainer")
    trainer = keep_global_batch(trainer_on_digits(tmp_path, fits=0, per_device_train_batch_size=4,
                                                  gradient_accumulation_steps=1))
    with pytest.raises(TrainingFailed, match=r"out of memory even at 1 sample per device \(global batch 4 on 1"):
        trainer.train()


class LateOutOfMemoryNet(nn.Module):
    """accelerate_case's MLP as a Trainer model that runs out of memory above ``fits`` samples only
    after ``after`` forwards (a longer batch later in the epoch), raising ``error``."""

    def __init__(self, fits: int, after: int, error: type[BaseException]):
        super().__init__()
        self.net = accelerate_case.Net()
        self.fits, self.after, self.error, self.calls = fits, after, error, 0

    def forward(self, x, labels=None):
        self.calls += 1
        if self.calls > self.after and len(x) > self.fits:
            raise self.error(accelerate_case.OOM.format(len(x) * 4_000_000))
        logits = self.net(x)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


@pytest.mark.parametrize(("error", "given_optimizer"), [(RuntimeError, True), (MemoryError, True),
                                                       (RuntimeError, False)],
                         ids=["cpu-allocator", "python-memory-error", "trainer-made-adamw"])
def test_a_try_that_ran_out_of_memory_after_some_updates_starts_over_from_the_state_train_began_with(
        tmp_path, error, given_optimizer):
    """Issue 47: a try that ran out of memory after two updates left them (and the optimizer's
    state) in the weights of the next, while the docs said training starts over; and Python's
    MemoryError, which aikit's own search retries, ended the run (Accelerate's matcher takes a
    RuntimeError only). Now the try at 32 x 4 starts from the weights, optimizer and random streams
    train() began with, and ends as a run that began at 32 x 4: the big-batch run's weights."""
    model = LateOutOfMemoryNet(fits=32, after=4, error=error)  # 64 x 2: two updates, then out of memory
    trainer = keep_global_batch(trainer_on_digits(tmp_path, None, model, given_optimizer, **plan_arguments(128, 64)))
    trainer.train()
    assert model.calls > 4 and (trainer.args.per_device_train_batch_size, trainer.args.gradient_accumulation_steps) \
        == (32, 4)
    if given_optimizer:
        want = accelerate_case.by_hand(ignore=False)
    else:  # the same Trainer, begun at the plan that fits
        want = LateOutOfMemoryNet(fits=32, after=0, error=error)
        trainer_on_digits(tmp_path, None, want, False, auto_find_batch_size=False, per_device_train_batch_size=32,
                          gradient_accumulation_steps=4).train()
        want = want.net
    for got, wanted in zip(model.net.parameters(), want.parameters(), strict=True):
        torch.testing.assert_close(got, wanted, rtol=1e-10, atol=1e-12)
