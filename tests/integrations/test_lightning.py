"""aikit's Lightning callbacks train exactly as the same training written by hand (float64, CPU).

Each reference is a plain torch loop that does not use the code under test: big-batch SGD
steps over the same samples for the plan and the trace, and the AutoLRS hook driven by hand.
"""

from __future__ import annotations

import pytest
import torch
from integration_common import AUTOLRS as COMMON_AUTOLRS
from integration_common import assert_same_search, autolrs_by_hand, data
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

lightning = pytest.importorskip("lightning")
import lightning.pytorch as pl  # noqa: E402

from aikit.autolrs.Torch import AutoLRS as TorchAutoLRS  # noqa: E402
from aikit.core.scaling import RULES, Rule, cosine_decay  # noqa: E402
from aikit.elastic.Torch import CustomSampler  # noqa: E402
from aikit.integrations.lightning import AutoLRS, AutoLRSCallback, ElasticPlan, TraceBatchSize  # noqa: E402

AUTOLRS = {**COMMON_AUTOLRS, "val_tau": 10**6}


def net() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).double()


class Module(pl.LightningModule):
    def __init__(self, loader=None, lr: float = 0.1, batch_size: int = 1):
        super().__init__()
        self.net, self.loader, self.lr, self.batch_size = net(), loader, lr, batch_size

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)

    def train_dataloader(self):
        if self.loader is not None:
            return self.loader
        x, y = data()
        return DataLoader(TensorDataset(x, y), batch_size=self.batch_size, drop_last=True)


def trainer(callbacks, **options) -> pl.Trainer:
    return pl.Trainer(accelerator="cpu", devices=1, callbacks=callbacks, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, **options)


def big_batch_sgd(batches, lrs, lr: float = 0.1) -> nn.Module:
    """The reference: one SGD update per list of indices, on their mean loss."""
    model, (x, y) = net(), data()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for indices, step_lr in zip(batches, lrs, strict=True):
        for group in optimizer.param_groups:
            group["lr"] = step_lr
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x[indices]), y[indices]).backward()
        optimizer.step()
    return model


def assert_same_weights(a: nn.Module, b: nn.Module) -> None:
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=1e-12, atol=1e-12)


def test_elastic_plan_sets_accumulation_and_batch_and_equals_big_batch_steps():
    module, plan = Module(), ElasticPlan(64, 16)
    trainer(plan, max_epochs=2).fit(module)
    assert (plan.plan.steps, module.batch_size) == (4, 16)
    windows = [list(range(start, start + 64)) for start in (0, 64)] * 2  # 2 updates per epoch, 2 epochs
    assert_same_weights(module.net, big_batch_sgd(windows, [0.1] * 4))


def test_elastic_plan_refuses_what_lightning_cannot_feed():
    with pytest.raises(ValueError, match=r"101 does not split evenly over 1 device.*use global_batch_size 100 or 104"):
        trainer(ElasticPlan(101, 30), max_epochs=1).fit(Module())
    x, y = data(100)  # 6 micro-batches of 16 (drop_last) are not whole updates of 4
    short = Module(DataLoader(TensorDataset(x, y), batch_size=16, drop_last=True))
    with pytest.raises(ValueError, match="an epoch has 6 micro-batches per device, not a multiple of the plan's 4"):
        trainer(ElasticPlan(64, 16), max_epochs=1).fit(short)
    with pytest.raises(ValueError, match="leave accumulate_grad_batches at 1"):
        trainer(ElasticPlan(64, 16), max_epochs=1, accumulate_grad_batches=2).fit(Module())

    class NoBatchSize(Module):
        def __init__(self):
            super().__init__()
            del self.batch_size

    with pytest.raises(ValueError, match="through `batch_size`, which neither NoBatchSize"):
        trainer(ElasticPlan(64, 16), max_epochs=1).fit(NoBatchSize())


def test_trace_batch_size_equals_big_batch_steps_at_the_scaled_lr():
    x, y = data()
    trace = [32, 64, 32, 16, 64]  # 208 samples: one epoch takes the first four steps (144 samples)
    sampler = CustomSampler(len(y), trace, num_replicas=1, rank=0, minibatch_size=16, when_exhausted="cycle")
    module = Module(DataLoader(TensorDataset(x, y), batch_sampler=sampler))
    callback = TraceBatchSize(sampler, ref_batch_size=32, rule="linear")
    trainer([callback], max_epochs=2).fit(module)

    reference = CustomSampler(len(y), trace, num_replicas=1, rank=0, minibatch_size=16, when_exhausted="cycle")
    batches, lrs = [], []
    for epoch in range(2):
        schedule = reference.schedule.epoch(epoch)
        for step in range(len(schedule)):
            indices = torch.cat([torch.as_tensor(m) for m in schedule.micro_batches(step, 0)])
            batches.append(indices)
            lrs.append(0.1 * len(indices) / 32)
    assert callback.optimizer.updates == len(batches) >= 6
    assert_same_weights(module.net, big_batch_sgd(batches, lrs))


def test_trace_batch_size_offers_every_rule_of_the_registry(monkeypatch):
    """A rule added to aikit.core.scaling.RULES trains through the callback without touching it
    (its updates the big-batch steps at that rule's LR), and the refusal lists it."""
    monkeypatch.setitem(RULES, "cbrt", Rule("cbrt", lambda batch, ref, noise: (batch / ref) ** (1 / 3)))
    x, y = data()
    trace = [32, 64, 32, 16, 64]
    sampler = CustomSampler(len(y), trace, num_replicas=1, rank=0, micro_batch=16, when_exhausted="cycle")
    module = Module(DataLoader(TensorDataset(x, y), batch_sampler=sampler))
    callback = TraceBatchSize(sampler, 32, rule="cbrt", warmup_steps=2)
    trainer([callback], max_epochs=1).fit(module)
    schedule = sampler.schedule.epoch(0)
    batches = [torch.cat([torch.as_tensor(m) for m in schedule.micro_batches(step, 0)])
               for step in range(len(schedule))]
    lrs = [0.1 * (1 + ((len(b) / 32) ** (1 / 3) - 1) * min(1.0, (u + 1) / 2)) for u, b in enumerate(batches)]
    assert callback.optimizer.policy.rule is RULES["cbrt"] and callback.optimizer.updates == len(batches) == 3
    assert_same_weights(module.net, big_batch_sgd(batches, lrs))
    with pytest.raises(ValueError, match=r"one of \('linear', 'sqrt', 'constant', 'seesaw', 'cbrt'\), got 'cube'"):
        TraceBatchSize(sampler, 32, rule="cube")
    with pytest.raises(ValueError, match=r"^TraceBatchSize needs lr_decay, the LR decay over samples its trace"):
        TraceBatchSize(sampler, 32, rule="seesaw")
    assert TraceBatchSize(sampler, 32, rule="seesaw", lr_decay=cosine_decay(1000)).rule == "seesaw"


def test_trace_batch_size_refuses_lightning_accumulation():
    sampler = CustomSampler(128, [32], num_replicas=1, rank=0, minibatch_size=16, when_exhausted="cycle")
    x, y = data()
    module = Module(DataLoader(TensorDataset(x, y), batch_sampler=sampler))
    with pytest.raises(ValueError, match="leave Trainer's accumulate_grad_batches at 1"):
        trainer([TraceBatchSize(sampler, 32)], max_epochs=1, accumulate_grad_batches=2).fit(module)


def test_autolrs_callback_equals_the_hook_called_by_hand():
    x, y = data()
    xv, yv = data(32)

    def validation(model):
        return lambda: float(nn.functional.cross_entropy(model(xv), yv))

    module = Module(DataLoader(TensorDataset(x, y), batch_size=8))
    callback = AutoLRSCallback(validation(module.net), 1e-3, 1.0, **AUTOLRS)
    # 32 updates of 2 micro-batches: warmup, trials with restores, training
    trainer([callback], max_epochs=4, accumulate_grad_batches=2).fit(module)

    model = net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    by_hand = TorchAutoLRS(model, optimizer, validation(model), 1e-3, 1.0, **AUTOLRS)
    autolrs_by_hand(by_hand, optimizer, lambda x, y: nn.functional.cross_entropy(model(x), y))
    assert_same_search(callback.autolrs, by_hand)
    assert callback.lr == by_hand.lr
    assert_same_weights(module.net, model)


def test_the_lightning_callback_has_the_hugging_face_callbacks_name_and_keeps_its_first():
    assert AutoLRSCallback.__name__ == "AutoLRSCallback"  # as aikit.integrations.huggingface names it
    assert AutoLRS is AutoLRSCallback  # scripts that import the first name keep working
