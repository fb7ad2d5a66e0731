"""The trace optimizers and ElasticState with the LR-free optimizers (issue 27): a trace run over
Schedule-Free or Prodigy equals its big-batch run; a commit saves Schedule-Free's eval() weights
(its contract: eval mode before saving) and puts it back in train mode; a restore resumes the
run exactly, in the mode the commit found it."""

from __future__ import annotations

import pytest
import torch
from prodigyopt import Prodigy
from resize_common import (
    LR,
    MINIBATCH,
    REF_BATCH,
    SEED,
    N,
    digits_subset,
    loss_of,
    make_model,
    trace,
    train,
    train_big_batches,
)
from schedulefree import AdamWScheduleFree, SGDScheduleFree

from aikit.elastic.Torch import CustomSampler, LinearRuleOptimizer, checkpoint
from aikit.elastic.Torch.resize import ElasticState
from aikit.ga.Torch.optim import Optimizer as GAOptimizer

OPTIMIZERS = {
    "AdamWScheduleFree": lambda model: AdamWScheduleFree(model.parameters(), lr=LR / 10, weight_decay=1e-4),
    "SGDScheduleFree": lambda model: SGDScheduleFree(model.parameters(), lr=LR, momentum=0.9),
    "Prodigy": lambda model: Prodigy(model.parameters(), lr=1.0, d0=1e-4),
}
SCHEDULE_FREE = ["AdamWScheduleFree", "SGDScheduleFree"]


@pytest.fixture(scope="module")
def data():
    return digits_subset()


def reference(x, y, name):
    """One big-batch update per trace step at the linear rule's LR (resize_common's run, for ``name``)."""
    model = make_model()
    opt = OPTIMIZERS[name](model)
    if name in SCHEDULE_FREE:
        opt.train()
    train_big_batches(model, opt, x, y)
    return model, opt


def build(directory, name, restarted=False):
    model = make_model()
    if restarted:  # a restarted process: only the restore can bring the run's weights back
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    sampler = CustomSampler(N, trace(), minibatch_size=MINIBATCH, seed=SEED)
    opt = LinearRuleOptimizer(OPTIMIZERS[name](model), sampler, ref_batchsize=REF_BATCH)
    if name in SCHEDULE_FREE:
        opt.train()  # the user's script: train mode before training (through the trace optimizer)
    return model, opt, ElasticState(directory, model=model, optimizer=opt, verbose=False)


def weights(model):
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_trace_run_over_an_lr_free_optimizer_equals_its_big_batch_run(tmp_path, data, name):
    x, y = data
    model, opt, state = build(tmp_path, name)
    train(x, y, model, opt, state, commit=False)
    expected, expected_opt = reference(x, y, name)
    for a, b in zip(model.parameters(), expected.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert opt.optimizer.param_groups[0]["k"] == expected_opt.param_groups[0]["k"] == opt.updates  # once an update
    if name == "Prodigy":
        assert opt.optimizer.param_groups[0]["d"] == pytest.approx(expected_opt.param_groups[0]["d"], rel=1e-10)
        assert opt.optimizer.param_groups[0]["lr"] == 1.0  # the base LR put back after each scaled update


@pytest.mark.parametrize("name", SCHEDULE_FREE)
@pytest.mark.parametrize("killed_after", [9, 31])
def test_a_commit_saves_schedule_free_eval_weights_and_a_restore_resumes_exactly(tmp_path, data, name, killed_after):
    x, y = data
    model, opt, state = build(tmp_path / "whole", name)
    train(x, y, model, opt, state)  # committing after every update
    assert opt.optimizer.param_groups[0]["train_mode"] is True  # each commit put it back in train mode
    uninterrupted = weights(model)
    twin = make_model()  # the same y and z, in a second model and optimizer: what eval() gives for them
    twin.load_state_dict(model.state_dict())
    twin_opt = OPTIMIZERS[name](twin)
    twin_opt.load_state_dict(opt.optimizer.state_dict())
    state.commit()  # once more (after the run's end): a commit of exactly these y and z
    twin_opt.eval()
    saved = checkpoint.read_latest(tmp_path / "whole")
    assert saved["train_mode"] == ["optimizer"]
    assert saved["objects"]["optimizer"]["optimizer"]["param_groups"][0]["train_mode"] is False
    for key, value in twin.state_dict().items():  # the commit saved the eval() weights, to the bit
        assert torch.equal(saved["objects"]["model"][key], value), key
    assert any(not torch.equal(a, b) for a, b in zip(twin.parameters(), uninterrupted, strict=True))  # (x, not y)

    train(x, y, *build(tmp_path / "killed", name), stop_after_micro=killed_after)
    model, opt, state = build(tmp_path / "killed", name, restarted=True)
    assert state.restore() is True
    assert opt.optimizer.param_groups[0]["train_mode"] is True  # in the mode the commit found it
    train(x, y, model, opt, state)
    for a, b in zip(weights(model), uninterrupted, strict=True):
        assert torch.equal(a, b)


def test_the_ga_optimizer_over_schedule_free_commits_and_resumes_exactly(tmp_path, data):
    x, y = (torch.from_numpy(a) for a in data)

    def run(directory, updates, restore=False):
        model = make_model()
        opt = GAOptimizer(AdamWScheduleFree(model.parameters(), lr=LR / 10), 2)
        opt.train()
        state = ElasticState(directory, model=model, optimizer=opt, step=0, verbose=False)
        if restore:
            assert state.restore()
        while state.step < updates:
            for micro in range(2):
                start = (state.step * 2 + micro) * MINIBATCH % (N - MINIBATCH)
                loss_of(model, x[start:start + MINIBATCH], y[start:start + MINIBATCH]).backward()
                opt.step()
            state.step += 1
            state.commit()
        return weights(model), opt

    uninterrupted, _ = run(tmp_path / "whole", 12)
    run(tmp_path / "killed", 5)
    resumed, opt = run(tmp_path / "killed", 12, restore=True)
    assert opt.optimizer.param_groups[0]["train_mode"] is True and opt.optimizer.param_groups[0]["k"] == 12
    for a, b in zip(resumed, uninterrupted, strict=True):
        assert torch.equal(a, b)


def test_a_schedule_free_optimizer_committed_in_eval_mode_is_restored_in_eval_mode(tmp_path, data):
    x, y = data
    model, opt, state = build(tmp_path, "AdamWScheduleFree")
    train(x, y, model, opt, state, commit=False, stop_after_micro=6)  # after 2 updates (2 + 4 micro-batches)
    opt.eval()  # the user evaluates, then commits
    evaluated = weights(model)
    state.commit()
    assert opt.optimizer.param_groups[0]["train_mode"] is False
    assert all(torch.equal(a, b) for a, b in zip(weights(model), evaluated, strict=True))  # untouched
    assert checkpoint.read_latest(tmp_path)["train_mode"] == []
    model, opt, state = build(tmp_path, "AdamWScheduleFree", restarted=True)
    state.restore()
    assert opt.optimizer.param_groups[0]["train_mode"] is False
    assert all(torch.equal(a, b) for a, b in zip(weights(model), evaluated, strict=True))
