"""Trace optimizers in one process: every update is the big-batch update at the rule's LR,
the base LR survives for schedulers, and a run stopped mid-epoch resumes to the same bits."""

import io
import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import DataLoader
from trace_common import MINIBATCH, big_batch_history, dataset, make_model

from aikit.elastic.Torch import ConstantOptimizer, CustomSampler, LinearRuleOptimizer, RootRuleOptimizer

RULES = {
    LinearRuleOptimizer: lambda batch, ref: batch / ref,
    RootRuleOptimizer: lambda batch, ref: math.sqrt(batch / ref),
    ConstantOptimizer: lambda batch, ref: 1.0,
}


def train(model, sampler, optimizer, data, epochs, stop_after=None):
    """The issue's loop; returns early (micro-batches counted over the run) when told to."""
    seen = 0
    for epoch in epochs:
        sampler.set_epoch(epoch)
        optimizer.set_epoch(epoch)
        for x, y in DataLoader(data, batch_sampler=sampler):
            if seen == stop_after:
                return
            optimizer.zero_grad()  # scripts written for plain optimizers do this: it must not undo accumulation
            nn.functional.mse_loss(model(x), y[:, :1]).backward()
            optimizer.step()
            seen += 1


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(1, 6).map(lambda k: k * MINIBATCH), min_size=1, max_size=12),
    st.sampled_from(list(RULES)),
    st.sampled_from([{}, {"momentum": 0.9}, {"momentum": 0.5, "weight_decay": 0.01, "nesterov": True}]),
)
def test_every_update_equals_the_big_batch_update_at_the_rules_lr(sizes, cls, sgd):
    data = dataset(60)
    model, reference = make_model(), make_model()
    sampler = CustomSampler(data, sizes, minibatch_size=MINIBATCH, when_exhausted="cycle")
    inner = torch.optim.SGD(model.parameters(), lr=0.05, **sgd)
    optimizer = cls(inner, sampler, ref_batchsize=8)
    history = []
    inner.register_step_post_hook(lambda *_: history.append([p.detach().clone() for p in model.parameters()]))
    train(model, sampler, optimizer, data, range(2))
    epochs = [sampler.schedule.epoch(e) for e in range(2)]
    expected = big_batch_history(reference, epochs, data, 0.05, 8, RULES[cls], **sgd)
    assert len(history) == len(expected) == optimizer.updates
    for got, want in zip(history, expected, strict=True):
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)


def test_lr_is_scaled_per_step_with_warmup_and_the_base_lr_is_restored_for_schedulers():
    data = dataset(80)
    model = make_model()
    sampler = CustomSampler(data, [4, 8, 16, 32], minibatch_size=MINIBATCH, when_exhausted="cycle")
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = LinearRuleOptimizer(inner, sampler, ref_batchsize=8, warmup_steps=3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)  # composes with the wrapper
    used = []
    inner.register_step_pre_hook(lambda opt, *_: used.append(opt.param_groups[0]["lr"]))
    train(model, sampler, optimizer, data, range(1))
    assert inner.param_groups[0]["lr"] == 0.1  # restored after every update
    scheduler.step()
    train(model, sampler, optimizer, data, range(1, 2))
    assert inner.param_groups[0]["lr"] == 0.05
    batches = [int(b) for e in range(2) for b in sampler.schedule.epoch(e).batch_sizes]
    first = len(sampler.schedule.epoch(0))
    expected = [
        (0.1 if u < first else 0.05) * (1 + (b / 8 - 1) * min(1.0, (u + 1) / 3)) for u, b in enumerate(batches)
    ]
    assert used == pytest.approx(expected, rel=1e-12)


def test_log_steps_in_aikits_format_prints_epoch_trace_step_batch_and_lr(capsys):
    data = dataset(40)
    sampler = CustomSampler(data, [4, 8], minibatch_size=MINIBATCH, when_exhausted="cycle")
    model = make_model()
    optimizer = LinearRuleOptimizer(torch.optim.SGD(model.parameters(), lr=0.2), sampler, ref_batchsize=8,
                                    log_steps=2, log_format="aikit")
    train(model, sampler, optimizer, data, range(2))
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["aikit trace: epoch 0 step 1 batch 8 lr 0.2", "aikit trace: epoch 0 step 3 batch 8 lr 0.2"]
    assert "aikit trace: epoch 1 step 7 batch 8 lr 0.2" in lines  # steps counted over the trace, not per epoch
    assert len(lines) == optimizer.updates // 2


def test_log_steps_prints_eth_easls_lines_with_the_step_index_within_each_epoch(capsys):
    data = dataset(40)
    sampler = CustomSampler(data, [4, 8, 16], minibatch_size=MINIBATCH, when_exhausted="cycle")
    model = make_model()
    optimizer = LinearRuleOptimizer(torch.optim.SGD(model.parameters(), lr=0.2), sampler, ref_batchsize=8,
                                    log_steps=2)
    train(model, sampler, optimizer, data, range(2))
    # 40 samples: epoch 0 is steps [4, 8, 16, 4, 8] (40), epoch 1 starts again at step 0 of the epoch
    assert capsys.readouterr().out.splitlines() == [
        "    CustomOptimizer: Step=0, bs=4, lr=(0.1,)", "    CustomOptimizer: Step=2, bs=16, lr=(0.4,)",
        "    CustomOptimizer: Step=4, bs=8, lr=(0.2,)",
        "    CustomOptimizer: Step=0, bs=16, lr=(0.4,)", "    CustomOptimizer: Step=2, bs=8, lr=(0.2,)",
    ]


@pytest.mark.parametrize("stop_after", [0, 1, 2, 5, 9, 13, 21])  # at step starts, and mid-step
def test_state_dicts_resume_a_run_stopped_mid_epoch_to_the_same_bits(stop_after):
    data = dataset(60)

    def fresh():
        model = make_model()
        sampler = CustomSampler(data, [8, 12, 4, 16], minibatch_size=MINIBATCH, when_exhausted="cycle")
        optimizer = RootRuleOptimizer(torch.optim.Adam(model.parameters(), lr=0.01), sampler, ref_batchsize=8)
        return model, sampler, optimizer

    model, sampler, optimizer = fresh()
    train(model, sampler, optimizer, data, range(3))
    uninterrupted = [p.detach().clone() for p in model.parameters()]

    model, sampler, optimizer = fresh()
    train(model, sampler, optimizer, data, range(2), stop_after=stop_after + 15)  # in epoch 1
    checkpoint = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint)
    epoch = optimizer.epoch

    checkpoint.seek(0)
    state = torch.load(checkpoint)
    model, sampler, optimizer = fresh()
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])  # also puts the sampler where training stood
    train(model, sampler, optimizer, data, range(epoch, 3))
    for a, b in zip(model.parameters(), uninterrupted, strict=True):
        assert torch.equal(a, b)


def test_the_sampler_defaults_to_the_last_one_made_as_seed_001_writes_it():
    model = make_model()
    sampler = CustomSampler(dataset(40), [8], minibatch_size=MINIBATCH, when_exhausted="cycle")
    assert LinearRuleOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), ref_batchsize=256).sampler is sampler


def test_misuse_gets_errors_that_say_what_to_do():
    data = dataset(40)
    model = make_model()
    sampler = CustomSampler(data, [8, 8, 8, 8, 8], minibatch_size=MINIBATCH)
    with pytest.raises(ValueError, match=r"LinearRuleOptimizer needs ref_batch_size \(eth-easl's ref_batchsize\)"):
        LinearRuleOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), sampler)
    with pytest.raises(ValueError, match="needs the TraceSampler that feeds it, got 3"):
        ConstantOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), 3)
    with pytest.raises(ValueError, match="ref_batchsize must be a positive integer, got 0"):
        RootRuleOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), sampler, ref_batchsize=0)
    two = CustomSampler(data, 8, num_replicas=2, rank=0, minibatch_size=MINIBATCH)
    with pytest.raises(ValueError, match=r"deals to 2 replicas but this run has 1 \(single\): give the sampler "
                                         r"num_replicas=1"):
        LinearRuleOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), two, ref_batchsize=8)
    optimizer = ConstantOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), sampler)
    train(model, sampler, optimizer, data, range(1))
    with pytest.raises(RuntimeError, match=r"epoch 0 has 5 steps and all are done: call set_epoch\(1\)"):
        optimizer.step()
    with pytest.raises(ValueError, match=r"not a ConstantOptimizer state.*load the wrapped optimizer's own state"):
        optimizer.load_state_dict(optimizer.optimizer.state_dict())


def test_clipping_and_amp_apply_to_each_traced_update():
    """max_grad_norm and a GradScaler on a trace optimizer: each update is the clipped big-batch
    update (the scaler unscales before clipping)."""
    data = dataset(60)
    model, reference = make_model(), make_model()
    sampler = CustomSampler(data, [8, 12, 4, 16], minibatch_size=MINIBATCH, when_exhausted="cycle")
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    optimizer = LinearRuleOptimizer(inner, sampler, ref_batchsize=8, max_grad_norm=0.1, scaler=scaler)
    history = []
    inner.register_step_post_hook(lambda *_: history.append([p.detach().clone() for p in model.parameters()]))
    for x, y in DataLoader(data, batch_sampler=sampler):
        scaler.scale(nn.functional.mse_loss(model(x), y[:, :1])).backward()
        optimizer.step()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    x, y = data.tensors
    plan = sampler.schedule.epoch(0)
    assert len(history) == len(plan)
    for step, got in enumerate(history):
        index = torch.as_tensor(plan.step_indices(step))  # which samples: the step's, from the schedule
        ref_opt.param_groups[0]["lr"] = 0.05 * len(index) / 8
        ref_opt.zero_grad()
        nn.functional.mse_loss(reference(x[index]), y[index, :1]).backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.1)
        ref_opt.step()
        for a, b in zip(got, reference.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)


def test_a_trace_optimizer_refuses_to_wrap_a_ga_optimizer():
    from aikit.ga.Torch.optim import Optimizer as GAOptimizer

    model = make_model()
    sampler = CustomSampler(dataset(40), [8], minibatch_size=MINIBATCH, when_exhausted="cycle")
    ga = GAOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), 2)
    with pytest.raises(TypeError, match=r"optimizer is already an aikit GA Optimizer \(Optimizer\), which accumulates "
                                        r"and updates by itself: give this trace optimizer the plain torch optimizer"):
        LinearRuleOptimizer(ga, sampler, ref_batchsize=8)



def poisoned_trace_run(poisoned_step: int | None, scaler=None):
    """A LinearRuleOptimizer with warmup through a trace of three steps of 8 (two micro-batches
    of 4), the last micro-batch of ``poisoned_step`` times NaN; returns the LR of every update
    applied and what each step left."""
    data = dataset(24)
    model = make_model()
    sampler = CustomSampler(data, [8, 8, 8], minibatch_size=MINIBATCH)
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    optimizer = LinearRuleOptimizer(inner, sampler, ref_batchsize=4, warmup_steps=3, scaler=scaler)
    lrs = []
    inner.register_step_pre_hook(lambda *_: lrs.append(inner.param_groups[0]["lr"]))
    sampler.set_epoch(0)
    optimizer.set_epoch(0)
    after = []
    for micro, (x, y) in enumerate(DataLoader(data, batch_sampler=sampler)):
        loss = nn.functional.mse_loss(model(x), y[:, :1])
        loss = loss * math.nan if micro == 2 * (poisoned_step or 0) + 1 and poisoned_step is not None else loss
        (loss if scaler is None else scaler.scale(loss)).backward()
        if optimizer.step():
            after.append({"updated": optimizer.updated, "updates": optimizer.updates, "step": optimizer.step_index,
                          "applied": optimizer.applied, "skipped": optimizer.skipped,
                          "weights": [p.detach().clone() for p in model.parameters()]})
    return lrs, after


@pytest.mark.parametrize("amp", [False, True], ids=["check", "GradScaler"])
def test_a_trace_update_with_a_nan_gradient_is_skipped_and_its_warmup_does_not_advance(amp):
    """The step's samples are spent (the trace moves on), no weight changes, and neither
    ``applied`` nor ``updates`` (which warmup counts) advance, by the check or by AMP's scaler."""
    from aikit.core.errors import NonFiniteGradientWarning

    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8) if amp else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lrs, (first, skipped, last) = poisoned_trace_run(1, scaler)
    assert [first["updated"], skipped["updated"], last["updated"]] == [True, False, True]
    assert all(torch.equal(a, b) for a, b in zip(skipped["weights"], first["weights"], strict=True))
    assert [a["step"] for a in (first, skipped, last)] == [1, 2, 3]  # the trace goes on
    assert [a["updates"] for a in (first, skipped, last)] == [1, 1, 2]
    assert [a["applied"] for a in (first, skipped, last)] == [1, 1, 2]
    assert [a["skipped"] for a in (first, skipped, last)] == [0, 1, 1]
    clean_lrs, _ = poisoned_trace_run(None)
    assert lrs == clean_lrs[:2]  # the update after the skip takes the warmup's second LR, not its third
    assert [type(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == (
        [] if amp else [NonFiniteGradientWarning])
