"""The LR rules of batch ramps in samples: Seesaw (base x decay(samples) x sqrt(B / B0)) and an
LR decay clocked by the samples trained, on the trace optimizers; and a balanced sampler that
refuses a world the steps still to train do not fit."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader
from trace_common import MINIBATCH, dataset, make_model

from aikit.core.ramp import seesaw_schedule
from aikit.core.scaling import cosine_decay, step_decay
from aikit.core.trace import schedule_trace
from aikit.elastic.Torch import (
    ConstantOptimizer,
    CustomSampler,
    LinearRuleMomentumOptimizer,
    RootRuleOptimizer,
    SeesawOptimizer,
)


def lrs_of(optimizer_class, trace, epochs: int = 2, **options) -> tuple[list[float], list[int], list[int]]:
    """Train ``epochs`` epochs; the LR each update of the wrapped SGD ran at, its batch, and the
    samples trained before it (every trace step is trained once, in order)."""
    data = dataset(96)
    sampler = CustomSampler(data, trace, minibatch_size=MINIBATCH, seed=3, when_exhausted="repeat_last")
    model = make_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.2)
    optimizer = optimizer_class(sgd, sampler, **options)
    seen, batches = [], []
    sgd.register_step_pre_hook(lambda opt, *_: seen.append(opt.param_groups[0]["lr"]))
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        optimizer.set_epoch(epoch)
        for x, y in DataLoader(data, batch_sampler=sampler):
            batch = optimizer.get_bs()
            nn.functional.mse_loss(model(x), y[:, :1]).backward()
            if optimizer.step():
                batches.append(batch)
    return seen, batches, np.concatenate(([0], np.cumsum(batches)))[:-1].tolist()


def test_seesaws_lr_is_base_times_decay_times_sqrt_of_the_batch_ratio():
    """The LR falls by 1/sqrt(2) where a step decay halves it and the trace doubles the batch; the
    decay reads the samples the trace trained, across epochs."""
    decay = step_decay([40, 120])
    trace = schedule_trace(seesaw_schedule(8, decay, max_batch=32), samples=300)
    seen, batches, samples = lrs_of(SeesawOptimizer, trace, ref_batchsize=8, lr_decay=decay)
    assert sorted(set(batches)) == [8, 16, 32] and len(seen) == len(batches) == len(samples)
    for lr, batch, before in zip(seen, batches, samples, strict=True):
        doublings = int(math.log2(batch // 8))
        assert doublings == sum(before >= m for m in (40, 120))  # the batch took over every halving
        assert lr == pytest.approx(0.2 * (0.5**doublings) * math.sqrt(2) ** doublings)  # x 1/sqrt(2) each


@pytest.mark.parametrize("optimizer_class, options, factor", [
    (ConstantOptimizer, {}, lambda batch: 1.0),
    (RootRuleOptimizer, {"ref_batchsize": 8}, lambda batch: math.sqrt(batch / 8)),
])
def test_an_lr_decay_is_clocked_by_the_samples_trained(optimizer_class, options, factor):
    decay = cosine_decay(200)
    trace = [8, 8, 16, 4, 24, 8, 12]
    seen, batches, samples = lrs_of(optimizer_class, trace, lr_decay=decay, **options)
    assert len(seen) == len(batches) > len(trace)  # past the trace's end: its last size repeats
    assert samples[:4] == [0, 8, 16, 32]
    assert seen == pytest.approx([0.2 * decay(s) * factor(b) for b, s in zip(batches, samples, strict=True)], rel=1e-12)


def test_the_samples_before_a_step_survive_a_resume():
    """A state loaded mid-epoch puts the decay at the samples of its step, not at 0."""
    decay = cosine_decay(100)
    data = dataset(96)
    sampler = CustomSampler(data, [8, 16, 8, 24], minibatch_size=MINIBATCH, seed=3, when_exhausted="cycle")
    optimizer = ConstantOptimizer(torch.optim.SGD(make_model().parameters(), lr=0.2), sampler, lr_decay=decay)
    state = {"optimizer": optimizer.state_dict()["optimizer"],
             "trace": {"epoch": 1, "step": 2, "micro": 0, "updates": 9, "rank": 0, "accumulated": None}}
    optimizer.load_state_dict(state)
    first = sampler.schedule.epoch(1).first_step
    assert optimizer.decay() == decay(sampler.schedule.trace.samples_before(first + 2)) < decay(0)


@pytest.mark.parametrize("call, message", [
    (lambda opt, s: SeesawOptimizer(opt, s, ref_batchsize=8),
     r"SeesawOptimizer needs lr_decay, the LR decay over samples its trace was made from"),
    (lambda opt, s: ConstantOptimizer(opt, s, lr_decay=0.5), r"lr_decay must be a function of the samples trained"),
    (lambda opt, s: LinearRuleMomentumOptimizer(opt, s, 8, lr_decay=cosine_decay(10)),
     r"lr_decay must be a function .* got CosineDecay.* for LinearRuleMomentumOptimizer"),
])
def test_lr_decays_are_refused_where_they_cannot_apply(call, message):
    sampler = CustomSampler(96, 8, minibatch_size=MINIBATCH)
    with pytest.raises(ValueError, match=message):
        call(torch.optim.SGD(make_model().parameters(), lr=0.1), sampler)


def test_a_balanced_sampler_needs_only_the_steps_still_to_train_to_fit_its_world():
    """Megatron #3913: every replica the same whole micro-batches, checked from the current step
    on, so steps trained on another world before a resume do not block it."""
    trace = [4, 4, 8, 8, 16]  # 1, 1, 2, 2, 4 micro-batches of 4: 40 samples, one epoch
    sampler = CustomSampler(40, trace, minibatch_size=4, num_replicas=2, rank=0, balanced=True)
    with pytest.raises(ValueError, match=r"balanced sampler: 2 replicas cannot each take whole micro-batches of 4 of "
                                         r"the trace from step 0 on: batch 4 is 1 micro-batches; world sizes that "
                                         r"fit: 1$"):
        next(iter(sampler))
    sampler.resume(0, 2, 0)  # steps 0 and 1 were trained on one replica
    assert [len(b) for b in sampler] == [4, 4, 4, 4]  # 8, 8 and 16: 1, 1 and 2 micro-batches for rank 0
    three = CustomSampler(40, trace, minibatch_size=4, num_replicas=3, rank=0, balanced=True)
    three.resume(0, 2, 0)
    with pytest.raises(ValueError, match=r"3 replicas cannot .* batch 8 is 2 micro-batches; world sizes that fit: 1, "
                                         r"2$"):
        next(iter(three))
    with pytest.raises(ValueError, match="balanced deals whole micro-batches of micro_batch to every replica"):
        CustomSampler(40, trace, max_device_batch=8, balanced=True)
    assert np.array_equal(CustomSampler(40, trace, minibatch_size=4, num_replicas=2, rank=1).schedule.trace.sizes,
                          trace)  # not balanced: idle replicas, as before
