"""Keras' fit_trace and PyTorch's trace optimizer ask one LR policy: over one trace they give every
update the same LR, to the bit, and a rule added to the registry is offered by both without
touching either."""

from __future__ import annotations

import pytest
import torch
from tf_common import data, keras, mlp

import aikit.elastic.TF as elastic_tf
from aikit.core.scaling import RULES, Rule, cosine_decay
from aikit.core.trace import load_trace
from aikit.elastic.Torch import CustomSampler, TraceOptimizer
from aikit.ga.TF.optimizers import Optimizer

SIZES = [8, 16, 4, 12, 8, 24, 4, 8]
TRACE = load_trace(SIZES, "cycle")


def keras_lrs(x, y, **policy) -> list[float]:
    model = mlp()
    model.compile(Optimizer(keras.optimizers.SGD(0.05), 1), loss="mse")
    rows = elastic_tf.fit_trace(model, x, y, TRACE, micro_batch=4, base_lr=0.05, epochs=2, seed=7, **policy)
    return [row["lr"] for row in rows]


def torch_lrs(x, **policy) -> list[float]:
    sampler = CustomSampler(len(x), TRACE, seed=7, micro_batch=4, balanced=True)
    model = torch.nn.Linear(x.shape[1], 1).double()
    sgd = torch.optim.SGD(model.parameters(), lr=0.05)
    optimizer = TraceOptimizer(sgd, sampler, **policy)
    lrs = []
    sgd.register_step_pre_hook(lambda opt, *_: lrs.append(opt.param_groups[0]["lr"]))
    for epoch in range(2):
        sampler.set_epoch(epoch)
        optimizer.set_epoch(epoch)
        for batch in sampler:
            model(torch.as_tensor(x[batch])).sum().backward()
            optimizer.step()
    return lrs


@pytest.mark.parametrize("policy", [
    {"rule": "sqrt", "ref_batch_size": 8, "warmup_steps": 3, "lr_decay": cosine_decay(120)},
    {"rule": "seesaw", "ref_batch_size": 4, "lr_decay": cosine_decay(100, final=0.1)},
    {"rule": "linear", "ref_batch_size": 16, "warmup_steps": 5},
    {"rule": "constant", "ref_batch_size": 16, "lr_decay": cosine_decay(80)},
])
def test_fit_trace_and_the_trace_optimizer_give_every_update_the_same_lr(float64, policy):
    x, y = data(64)
    keras_side, torch_side = keras_lrs(x, y, **policy), torch_lrs(x, **policy)
    assert keras_side == torch_side and len(torch_side) > len(SIZES) and len(set(torch_side)) > 3


def test_a_rule_added_to_the_registry_is_offered_by_both(float64, monkeypatch):
    monkeypatch.setitem(RULES, "cbrt", Rule("cbrt", lambda batch, ref, noise: (batch / ref) ** (1 / 3)))
    x, y = data(64)
    keras_side = keras_lrs(x, y, rule="cbrt", ref_batch_size=8)
    torch_side = torch_lrs(x, rule="cbrt", ref_batch_size=8)
    assert keras_side == torch_side
    assert sorted(set(keras_side)) == [0.05 * (batch / 8) ** (1 / 3) for batch in sorted(set(SIZES))]
    # fit_trace takes every rule, adascale too (the label of the run whose learning_rates it replays)
    with pytest.raises(ValueError, match=r"one of \('adascale', 'linear', 'sqrt', 'constant', 'seesaw', 'cbrt'\), "
                                         r"got 'x'"):
        keras_lrs(x, y, rule="x", ref_batch_size=8)
