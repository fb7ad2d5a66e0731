"""ElasticState in one process: a run stopped anywhere and resumed from its last commit ends
at the weights of the uninterrupted big-batch run; commits are atomic; bad resumes are refused."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from resize_common import (
    MINIBATCH,
    REF_BATCH,
    SEED,
    N,
    digits_subset,
    loss_of,
    make_model,
    make_sgd,
    max_difference,
    reference,
    total_steps,
    trace,
    train,
)

from aikit.core.trace import Trace
from aikit.elastic.Torch import CustomSampler, LinearRuleOptimizer, checkpoint
from aikit.elastic.Torch.resize import ElasticState
from aikit.ga.Torch.optim import Optimizer as GAOptimizer


@pytest.fixture(scope="module")
def data():
    x, y = digits_subset()
    return x, y, reference(x, y)


def build(directory, trace_=None, seed=SEED, restarted=False, permutation="numpy"):
    """What a user's script builds at start: model, sampler, trace optimizer, state. A restarted
    process gets other initial weights, so only the restore can bring the run's back."""
    model = make_model()
    if restarted:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    sampler = CustomSampler(N, trace_ if trace_ is not None else trace(), minibatch_size=MINIBATCH, seed=seed,
                            permutation=permutation)
    opt = LinearRuleOptimizer(make_sgd(model), sampler, ref_batchsize=REF_BATCH)
    return model, opt, ElasticState(directory, model=model, optimizer=opt, verbose=False)


# micro-batches: step 0 has 2, step 1 has 4, step 2 has 6; epoch 0 ends after 30 (7 steps)
@pytest.mark.parametrize("killed_after", [2, 9, 29, 30, 31, 45])
def test_resume_after_kill_equals_uninterrupted_big_batch_run(tmp_path, data, killed_after):
    x, y, expected = data
    train(x, y, *build(tmp_path), stop_after_micro=killed_after)
    model, opt, state = build(tmp_path, restarted=True)
    assert state.restore() is True
    train(x, y, model, opt, state)
    assert opt.updates == total_steps()
    assert max_difference(model.state_dict(), expected) < 1e-10


def test_restore_in_the_same_process_drops_a_step_cut_short(tmp_path, data):
    """Horovod's survivors restore in process: gradients of the unfinished step must go."""
    x, y, expected = data
    model, opt, state = build(tmp_path)
    train(x, y, model, opt, state, stop_after_micro=9)  # 3 micro-batches into step 2
    assert opt.micro_step == 3 and model[0].weight.grad is not None
    state.restore()
    assert opt.micro_step == 0 and opt.step_index == 2
    train(x, y, model, opt, state)
    assert max_difference(model.state_dict(), expected) < 1e-10


def test_fresh_directory_starts_from_scratch(tmp_path):
    _, opt, state = build(tmp_path / "new")
    assert state.restore() is False
    assert (opt.epoch, opt.step_index, opt.updates) == (0, 0, 0)


def test_commit_mid_step_is_refused(tmp_path, data):
    x, y, _ = data
    model, opt, state = build(tmp_path)
    idx = next(iter(opt.sampler))
    loss_of(model, torch.from_numpy(x[idx]), torch.from_numpy(y[idx])).backward()
    assert opt.step() is False
    with pytest.raises(RuntimeError, match=r"commit\(\) in the middle of step 0 of epoch 0 \(1 of its micro-batches "
                       r"accumulated\): commit right after an update, when optimizer.step\(\) returns True"):
        state.commit()


def test_a_crash_while_writing_leaves_the_previous_commit(tmp_path, data, monkeypatch):
    x, y, _ = data
    model, opt, state = build(tmp_path)
    train(x, y, model, opt, state, stop_after_micro=6)  # steps 0 and 1 committed
    committed = {k: v.clone() for k, v in model.state_dict().items()}

    def dies_before_the_rename(tmp, path):
        raise KeyboardInterrupt("killed while writing")

    monkeypatch.setattr(checkpoint.os, "replace", dies_before_the_rename)
    with pytest.raises(KeyboardInterrupt):
        train(x, y, model, opt, state, stop_after_micro=6)
    monkeypatch.undo()
    model2, opt2, state2 = build(tmp_path, restarted=True)
    assert state2.restore() is True
    assert (opt2.epoch, opt2.step_index, opt2.updates) == (0, 2, 2)
    assert max_difference(model2.state_dict(), committed) == 0.0


def test_resuming_with_other_samples_per_step_is_refused(tmp_path, data):
    x, y, _ = data
    train(x, y, *build(tmp_path), stop_after_micro=2)
    _, _, state = build(tmp_path, trace_=Trace([16, 32, 48], when_exhausted="cycle"))
    with pytest.raises(ValueError, match=r"written by a run with other samples per step \(trace resize-test then, "
                       r"list now \(different sizes\)\).*start from an empty directory"):
        state.restore()
    _, _, state = build(tmp_path, seed=SEED + 1)
    with pytest.raises(ValueError, match=rf"seed {SEED} then, {SEED + 1} now"):
        state.restore()
    _, _, state = build(tmp_path, permutation="torch")  # eth-easl's sample order: other samples per step
    with pytest.raises(ValueError, match=r"permutation 'numpy' then, 'torch' now"):
        state.restore()


def test_random_streams_continue_where_the_commit_left_them(tmp_path, data):
    x, y, _ = data
    model, opt, state = build(tmp_path)
    train(x, y, model, opt, state, stop_after_micro=2)
    expected = (torch.rand(3), np.random.rand(), random.random())
    torch.manual_seed(123), np.random.seed(123), random.seed(123)
    build(tmp_path)[2].restore()
    got = (torch.rand(3), np.random.rand(), random.random())
    assert torch.equal(got[0], expected[0]) and got[1:] == expected[1:]


def test_plain_values_are_kept_and_objects_must_match(tmp_path):
    model = make_model()
    state = ElasticState(tmp_path, model=model, best_loss=None, verbose=False)
    state.best_loss = 0.25
    state.commit()
    again = ElasticState(tmp_path, model=make_model(), best_loss=None, verbose=False)
    assert again.restore() and again.best_loss == 0.25
    other = ElasticState(tmp_path, model=model, best_loss=None, scaler=torch.optim.SGD(model.parameters()),
                         verbose=False)
    with pytest.raises(ValueError, match=r"holds \['best_loss', 'model'\] but not \['scaler'\]: keep the same objects"):
        other.restore()


def test_the_sampler_is_not_kept_separately(tmp_path):
    sampler = CustomSampler(N, trace(), minibatch_size=MINIBATCH)
    with pytest.raises(ValueError, match="sampler= is a CustomSampler: its position is the trace optimizer's"):
        ElasticState(tmp_path, model=make_model(), sampler=sampler)


def test_the_ga_optimizer_commits_between_updates_and_resumes_with_other_steps(tmp_path):
    """Plan-driven GA (aikit.ga.Torch.optim.Optimizer): a new world size re-plans ``steps``."""
    x = torch.randn(8, 64, dtype=torch.float64)
    model = make_model()
    opt = GAOptimizer(make_sgd(model), steps=2)
    state = ElasticState(tmp_path, model=model, optimizer=opt, verbose=False)
    model(x).sum().backward()
    opt.step()
    with pytest.raises(RuntimeError, match=r"commit\(\) in the middle of an update: optimizer has 1 of its 2 "
                       r"micro-steps accumulated; commit right after the update, when optimizer.micro_step == 0"):
        state.commit()
    model(x).sum().backward()
    opt.step()
    state.commit()
    model2 = make_model()
    opt2 = GAOptimizer(make_sgd(model2), steps=4)  # the plan for fewer devices
    assert ElasticState(tmp_path, model=model2, optimizer=opt2, verbose=False).restore()
    assert (opt2.steps, opt2.micro_step) == (4, 0)
    assert max_difference(model2.state_dict(), model.state_dict()) == 0.0
    for p, p2 in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(opt2.state[p2]["momentum_buffer"], opt.state[p]["momentum_buffer"])


def test_a_failed_restore_changes_nothing(tmp_path, data):
    """A checkpoint whose model does not fit is refused before any object (the scheduler, which
    would load first, included) or the sampler position changes."""
    x, y, _ = data
    model, opt, _ = build(tmp_path)
    state = ElasticState(tmp_path, model=model, optimizer=opt, verbose=False,
                         scheduler=torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5))
    train(x, y, model, opt, state, stop_after_micro=6)  # two commits
    wide = torch.nn.Sequential(torch.nn.Linear(64, 17), torch.nn.Tanh(), torch.nn.Linear(17, 10)).double()
    sampler = CustomSampler(N, trace(), minibatch_size=MINIBATCH, seed=SEED)
    opt2 = LinearRuleOptimizer(make_sgd(wide), sampler, ref_batchsize=REF_BATCH)
    scheduler = torch.optim.lr_scheduler.StepLR(opt2, step_size=1, gamma=0.5)
    scheduler.step()
    state2 = ElasticState(tmp_path, scheduler=scheduler, optimizer=opt2, model=wide, verbose=False)
    weights = {k: v.clone() for k, v in wide.state_dict().items()}
    before = (scheduler.state_dict(), opt2.param_groups[0]["lr"], opt2.epoch, opt2.step_index, opt2.updates)
    with pytest.raises(ValueError, match=r"cannot be restored into model=: 0.weight has shape \(16, 64\) in the "
                                         r"checkpoint, \(17, 64\) here"):
        state2.restore()
    assert (scheduler.state_dict(), opt2.param_groups[0]["lr"], opt2.epoch, opt2.step_index, opt2.updates) == before
    assert max_difference(wide.state_dict(), weights) == 0.0 and state2.commits == 0


def test_a_restore_that_fails_while_loading_puts_back_what_it_loaded(tmp_path):
    """A state aikit cannot check beforehand (a GradScaler's) fails while loading: the objects
    loaded before it (a scheduler) are put back."""
    model = make_model()
    opt = make_sgd(model)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    ElasticState(tmp_path, a_scheduler=scheduler, scaler=torch.amp.GradScaler("cpu", enabled=False),
                 verbose=False).commit()
    fresh = torch.optim.lr_scheduler.StepLR(make_sgd(make_model()), step_size=3, gamma=0.1)
    before = fresh.state_dict()
    state = ElasticState(tmp_path, a_scheduler=fresh, scaler=torch.amp.GradScaler("cpu"), verbose=False)
    with pytest.raises(RuntimeError, match="source state dict is empty"):
        state.restore()
    assert fresh.state_dict() == before
