"""One trace optimizer with the LR rule as a value: eth-easl's class names are it with a rule (the
same updates, bit for bit), a rule added to the registry trains without touching it, aikit's own
name takes its sampler explicitly while eth-easl's names keep eth-easl's default, and every class
that moved is named in MOVED_CLASSES, which a restore reads."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader
from trace_common import MINIBATCH, dataset, make_model

import aikit.elastic.Torch as elastic
from aikit.core.errors import InvalidType, InvalidValue
from aikit.core.lr_policy import LRPolicy
from aikit.core.scaling import RULES, Rule, cosine_decay
from aikit.elastic.Torch import (
    ConstantOptimizer,
    CustomSampler,
    LinearRuleOptimizer,
    RootRuleOptimizer,
    SeesawOptimizer,
    TraceOptimizer,
)
from aikit.elastic.Torch.restore_checks import MOVED_CLASSES

TRACE = [8, 12, 4, 16, 24, 8]


def trained(make_optimizer, epochs: int = 2):
    """The LR and parameters of every update of a run through TRACE."""
    data = dataset(60)
    model = make_model()
    sampler = CustomSampler(data, TRACE, minibatch_size=MINIBATCH, when_exhausted="cycle")
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    optimizer = make_optimizer(sgd, sampler)
    lrs, params = [], []
    sgd.register_step_pre_hook(lambda opt, *_: lrs.append(opt.param_groups[0]["lr"]))
    sgd.register_step_post_hook(lambda *_: params.append([p.detach().clone() for p in model.parameters()]))
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        optimizer.set_epoch(epoch)
        for x, y in DataLoader(data, batch_sampler=sampler):
            nn.functional.mse_loss(model(x), y[:, :1]).backward()
            optimizer.step()
    return lrs, params, optimizer


DECAY = cosine_decay(200)


@pytest.mark.parametrize(("cls", "rule", "options"), [
    (LinearRuleOptimizer, "linear", {"ref_batch_size": 8, "warmup_steps": 3}),
    (RootRuleOptimizer, "sqrt", {"ref_batch_size": 8, "lr_decay": DECAY}),
    (SeesawOptimizer, "seesaw", {"ref_batch_size": 8, "lr_decay": DECAY}),
    (ConstantOptimizer, "constant", {"lr_decay": DECAY}),
])
def test_eth_easls_names_are_the_one_optimizer_with_a_rule(cls, rule, options):
    lrs, params, named = trained(lambda opt, sampler: cls(opt, sampler, **options))
    one_lrs, one_params, one = trained(lambda opt, sampler: TraceOptimizer(opt, sampler, rule, **options))
    assert lrs == one_lrs and len(set(lrs)) > 2
    assert all(torch.equal(a, b) for got, want in zip(params, one_params, strict=True)
               for a, b in zip(got, want, strict=True))
    assert isinstance(named, TraceOptimizer) and named.rule == one.rule == rule
    assert named.policy == one.policy


def test_a_rule_added_to_the_registry_trains_without_touching_the_optimizer(monkeypatch):
    monkeypatch.setitem(RULES, "cbrt", Rule("cbrt", lambda batch, ref, noise: (batch / ref) ** (1 / 3)))
    lrs, _, optimizer = trained(lambda opt, sampler: TraceOptimizer(opt, sampler, "cbrt", ref_batch_size=8))
    batches = [b for e in range(2) for b in optimizer.sampler.schedule.epoch(e).batch_sizes.tolist()]
    assert lrs == [0.1 * (b / 8) ** (1 / 3) for b in batches]
    sampler = CustomSampler(60, TRACE, minibatch_size=MINIBATCH)
    with pytest.raises(InvalidValue,
                       match=r"one of \('adascale', 'linear', 'sqrt', 'constant', 'seesaw', 'cbrt'\), got 'x'"):
        TraceOptimizer(torch.optim.SGD(make_model().parameters(), lr=0.1), sampler, "x", ref_batch_size=8)


def test_aikits_name_takes_its_sampler_explicitly_eth_easls_take_the_last_one_made():
    model = make_model()
    sampler = CustomSampler(dataset(40), [8], minibatch_size=MINIBATCH, when_exhausted="cycle")
    with pytest.raises(InvalidType, match=r"^TraceOptimizer needs the TraceSampler that feeds it, got None: pass it "
                                          r"as second argument, TraceOptimizer\(optimizer, sampler, \.\.\.\)$"):
        TraceOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), ref_batch_size=8)
    assert LinearRuleOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), ref_batchsize=256).sampler is sampler
    assert TraceOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), sampler, ref_batch_size=8).sampler is sampler


def test_a_policy_is_given_whole_or_by_its_parts():
    sampler = CustomSampler(dataset(40), [8], minibatch_size=MINIBATCH, when_exhausted="cycle")
    policy = LRPolicy("sqrt", 8, warmup_steps=2)
    optimizer = TraceOptimizer(torch.optim.SGD(make_model().parameters(), lr=0.1), sampler, policy=policy)
    assert optimizer.policy is policy and repr(optimizer).endswith("rule='sqrt', ref_batch_size=8)")
    with pytest.raises(InvalidValue, match="got policy= and rule=, ref_batch_size=, warmup_steps= or lr_decay="):
        TraceOptimizer(torch.optim.SGD(make_model().parameters(), lr=0.1), sampler, policy=policy, ref_batch_size=8)
    with pytest.raises(InvalidValue, match="TraceOptimizer needs ref_batch_size, the global batch its LR was tuned"):
        TraceOptimizer(torch.optim.SGD(make_model().parameters(), lr=0.1), sampler, "linear")


def test_every_class_that_moved_is_named_in_moved_classes():
    """A commit records each kept object's class path: every path a trace optimizer had before
    the move (all in trace_optim) maps to where that class lives now."""
    before = ["LinearRuleOptimizer", "RootRuleOptimizer", "SeesawOptimizer", "ConstantOptimizer", "CustomOptimizer",
              "LinearRuleMomentumOptimizer", "AdaScaleOptimizer", "TraceOptimizer"]
    for name in before:
        cls = getattr(elastic, name)
        now = f"{cls.__module__}.{cls.__qualname__}"
        old = f"aikit.elastic.Torch.trace_optim.{name}"
        assert MOVED_CLASSES.get(old, old) == now
    for old, new in MOVED_CLASSES.items():
        module, _, name = new.rpartition(".")
        assert getattr(importlib.import_module(module), name) is getattr(elastic, name)
        assert old.rpartition(".")[2] == name
