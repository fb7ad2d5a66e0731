"""The PyTorch adapters' settings by aikit's name or the original system's: ``micro_batch`` or
eth-easl's ``minibatch_size``, ``ref_batch_size`` or eth-easl's ``ref_batchsize`` (aikit 0.1's
``base_batch`` for ``AdaptiveSampler``), ``max_device_batch`` or Run:AI's ``max_gpu_batch_size``:
the same run either way, a message naming the one written, both refused."""

from __future__ import annotations

import pytest
import torch

import aikit.elastic.Torch as elastic
from aikit.core.errors import InvalidValue
from aikit.elastic.Torch import (
    AdaptiveOptimizer,
    AdaptiveSampler,
    AdaScaleOptimizer,
    CustomSampler,
    LinearRuleMomentumOptimizer,
    LinearRuleOptimizer,
)


def sgd() -> torch.optim.SGD:
    return torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)


def test_custom_sampler_takes_micro_batch_or_minibatch_size():
    new, old = CustomSampler(64, [16, 32, 16], micro_batch=8), CustomSampler(64, [16, 32, 16], minibatch_size=8)
    positional = CustomSampler(64, [16, 32, 16], 42, 1, 0, 8)  # eth-easl's order
    assert new.micro_batch == new.minibatch_size == old.micro_batch == positional.micro_batch == 8
    assert [list(new)] == [list(old)] == [list(positional)]
    with pytest.raises(InvalidValue, match="batch size 12 is not a multiple of micro_batch 8; use 8 or 16"):
        CustomSampler(64, [12], micro_batch=8)
    with pytest.raises(InvalidValue, match="batch size 12 is not a multiple of minibatch_size 8; use 8 or 16"):
        CustomSampler(64, [12], minibatch_size=8)
    with pytest.raises(InvalidValue, match="micro_batch and minibatch_size are one setting"):
        CustomSampler(64, [16, 32, 16], micro_batch=8, minibatch_size=8)
    assert old.get_batch_assignments([16]) == [[0, 1]]
    with pytest.raises(InvalidValue, match="not a multiple of minibatch_size 8"):
        old.get_batch_assignments([12])
    old.set_world(2, 1)  # an elastic resize keeps the name written
    assert old.micro_batch == 8 and old.schedule.micro_name == "minibatch_size"


@pytest.mark.parametrize("cls", [LinearRuleOptimizer, LinearRuleMomentumOptimizer, AdaScaleOptimizer])
def test_trace_optimizers_take_ref_batch_size_or_ref_batchsize(cls):
    sampler = CustomSampler(64, [16, 32, 16], micro_batch=8)
    new = cls(sgd(), sampler, ref_batch_size=64)
    old = cls(sgd(), sampler, ref_batchsize=64)
    assert new.ref_batch_size == new.ref_batchsize == old.ref_batch_size == 64
    assert "ref_batch_size=64" in repr(new)
    with pytest.raises(InvalidValue, match="ref_batchsize must be a positive integer, got 0"):
        cls(sgd(), sampler, ref_batchsize=0)
    with pytest.raises(InvalidValue, match="ref_batch_size must be a positive integer, got 0"):
        cls(sgd(), sampler, ref_batch_size=0)
    with pytest.raises(InvalidValue, match="ref_batch_size and ref_batchsize are one setting"):
        cls(sgd(), sampler, ref_batch_size=64, ref_batchsize=64)


def test_adascale_keeps_eth_easls_default_reference_and_argument_order():
    sampler = CustomSampler(64, [16, 32, 16], micro_batch=8)
    assert AdaScaleOptimizer(sgd(), sampler).ref_batch_size == 32
    assert AdaScaleOptimizer(sgd(), sampler, None, 16).ref_batch_size == 16  # (optimizer, sampler, log_steps, ref)


def test_init_takes_max_device_batch_or_run_ais_max_gpu_batch_size():
    assert elastic.init(256, max_device_batch=64) == elastic.init(global_batch_size=256, max_gpu_batch_size=64)
    assert elastic.init(256, 64).max_device_batch == 64
    with pytest.raises(InvalidValue, match="max_gpu_batch_size must be a positive integer, got -1"):
        elastic.init(256, max_gpu_batch_size=-1)
    with pytest.raises(InvalidValue, match="max_device_batch and max_gpu_batch_size are one setting"):
        elastic.init(256, 64, max_gpu_batch_size=64)


def test_adaptive_sampler_takes_ref_batch_size_or_base_batch():
    new = AdaptiveSampler(96, ref_batch_size=8, max_batch=32, micro_batch=4)
    old = AdaptiveSampler(96, base_batch=8, max_batch=32, micro_batch=4)
    assert new.controller.ref_batch_size == old.controller.ref_batch_size == 8  # the core speaks aikit's name
    assert "ref_batch_size=8" in repr(AdaptiveOptimizer(sgd(), new))
    with pytest.raises(InvalidValue, match=r"ref_batch_size=6 is not a multiple of micro_batch x replicas"):
        AdaptiveSampler(96, ref_batch_size=6, max_batch=32, micro_batch=4)
    with pytest.raises(InvalidValue, match=r"base_batch=6 is not a multiple of micro_batch x replicas"):
        AdaptiveSampler(96, base_batch=6, max_batch=32, micro_batch=4)
    with pytest.raises(InvalidValue, match="ref_batch_size and base_batch are one setting"):
        AdaptiveSampler(96, ref_batch_size=8, base_batch=8, max_batch=32, micro_batch=4)
    with pytest.raises(InvalidValue, match="AdaptiveSampler needs ref_batch_size"):
        AdaptiveSampler(96, max_batch=32, micro_batch=4)
