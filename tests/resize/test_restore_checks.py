"""Nothing lost, and everything checked before it loads (one process).

A commit never replaces or deletes a commit its run does not know: a second run that forgot
``restore()``, or a second live ElasticState on the same directory, is refused with the way out.
A checkpoint whose objects, optimizer state or counters do not fit is refused by name before
anything changes, a hand-edited one with a valid checksum included.
"""

from __future__ import annotations

import math

import pytest
import torch
from resize_common import MINIBATCH, REF_BATCH, SEED, N, make_model, make_sgd, trace

from aikit.core.errors import CommitError, InvalidValue
from aikit.elastic.Torch import CustomSampler, LinearRuleOptimizer, checkpoint
from aikit.elastic.Torch.resize import ElasticState
from aikit.ga.Torch.optim import Optimizer as GAOptimizer


def weights(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def files(directory) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir()}


def committed_run(directory, commits: int) -> ElasticState:
    """A run that restored (fresh) and committed ``commits`` times."""
    model = make_model()
    state = ElasticState(directory, model=model, verbose=False)
    state.restore()
    for _ in range(commits):
        with torch.no_grad():
            model[0].bias.add_(1.0)
        state.commit()
    return state


# ---- nothing lost ------------------------------------------------------------------------------


def test_a_run_that_forgot_restore_is_refused_before_it_deletes_newer_commits(tmp_path):
    committed_run(tmp_path, 5)  # keeps commits 4 and 5
    before = files(tmp_path)
    forgot = ElasticState(tmp_path, model=make_model(), verbose=False)
    with pytest.raises(CommitError, match=rf"commit 1 would replace or delete commit\(s\) 4, 5 in {tmp_path}, which "
                       r"this ElasticState did not restore: call state.restore\(\) before training to go on from "
                       r"them, pass ElasticState\(\.\.\., overwrite=True\) to start over there, or give it another"):
        forgot.commit()
    assert files(tmp_path) == before and forgot.commits == 0
    again = ElasticState(tmp_path, model=make_model(), verbose=False)
    assert again.restore() and again.commits == 5
    again.commit()
    assert [n for n, _ in checkpoint.commit_files(tmp_path)] == [6, 5]


def test_overwrite_true_starts_over_in_the_directory(tmp_path):
    committed_run(tmp_path, 3)
    fresh = ElasticState(tmp_path, model=make_model(), verbose=False, overwrite=True)
    fresh.commit()
    assert [n for n, _ in checkpoint.commit_files(tmp_path)] == [1]


def test_a_second_live_state_on_a_directory_is_refused_at_its_next_commit(tmp_path):
    first = committed_run(tmp_path, 1)
    second = ElasticState(tmp_path, model=make_model(), verbose=False)
    assert second.restore() and second.commits == 1
    second.commit()  # commit 2, which the first does not know
    before = files(tmp_path)
    with pytest.raises(CommitError, match=rf"commit\(s\) 2 in {tmp_path} were written by another ElasticState after "
                       r"this one committed commit 1: two runs cannot share a directory"):
        first.commit()
    assert files(tmp_path) == before
    second.commit()  # the one that restored last goes on
    third = ElasticState(tmp_path, model=make_model(), verbose=False)
    third.restore()
    second_again = ElasticState(tmp_path, model=make_model(), verbose=False)
    second_again.restore()
    third.commit()  # both restored commit 3; the one that commits 4 second is refused
    with pytest.raises(CommitError, match=r"commit\(s\) 4 .* after this one restored commit 3"):
        second_again.commit()


def test_a_commit_replaced_under_the_same_number_is_noticed(tmp_path):
    """Two runs that wrote the same commit number at once: the loser finds its commit replaced."""
    first = committed_run(tmp_path, 2)
    other = ElasticState(tmp_path, model=make_model(), verbose=False, overwrite=True)
    other.commits = 1
    other.commit()  # replaces commit 2
    with pytest.raises(CommitError, match=r"commit\(s\) 2 .* written by another ElasticState after this one "
                                          r"committed commit 2"):
        first.commit()


def test_a_directory_that_is_a_file_is_refused_when_the_state_is_built(tmp_path):
    path = tmp_path / "ckpt"
    path.write_text("not a directory")
    with pytest.raises(InvalidValue, match=rf"ElasticState's directory {path} is a file, not a directory: give a "
                                           r"directory \(it is created at the first commit\)"):
        ElasticState(path, model=make_model())
    with pytest.raises(InvalidValue, match=rf"directory {path / 'run'} lies under {path}, a file, not a directory"):
        ElasticState(path / "run", model=make_model())
    assert path.read_text() == "not a directory"


# ---- the objects kept ---------------------------------------------------------------------------


def test_an_object_kept_then_and_not_now_is_refused_by_name(tmp_path):
    model = make_model()
    opt = make_sgd(model)
    ElasticState(tmp_path, model=model, optimizer=opt, verbose=False,
                 scheduler=torch.optim.lr_scheduler.StepLR(opt, 2)).commit()
    fresh = make_model()
    state = ElasticState(tmp_path, model=fresh, optimizer=make_sgd(fresh), verbose=False)
    before = weights(fresh)
    with pytest.raises(InvalidValue, match=r"keeps scheduler= \(a torch.optim.lr_scheduler.StepLR\) as well, which "
                       r"this ElasticState does not: its state would be lost. Keep it \(ElasticState\(\.\.\., "
                       r"scheduler=\.\.\.\)\), or start over in another directory"):
        state.restore()
    assert all(torch.equal(a, b) for a, b in zip(weights(fresh), before, strict=True))


def test_a_plain_value_kept_then_and_not_now_is_warned_about(tmp_path):
    ElasticState(tmp_path, model=make_model(), best=0.5, verbose=False).commit()
    state = ElasticState(tmp_path, model=make_model(), verbose=False)
    with pytest.warns(UserWarning, match=r"keeps the value\(s\) \['best'\] as well, which this ElasticState does not "
                                         r"keep: they are not restored"):
        assert state.restore()


def test_an_optimizer_of_another_class_is_refused(tmp_path):
    model = make_model()
    ElasticState(tmp_path, optimizer=torch.optim.Adam(model.parameters()), verbose=False).commit()
    state = ElasticState(tmp_path, optimizer=torch.optim.AdamW(make_model().parameters()), verbose=False)
    with pytest.raises(InvalidValue, match=r"keeps a torch.optim.adam.Adam as optimizer=, this ElasticState a "
                                           r"torch.optim.adamw.AdamW: its state does not fit"):
        state.restore()


def test_adam_state_into_an_sgd_momentum_wrapper_is_refused_before_it_loads():
    """The state alone (no ElasticState): its hyper-parameters say which optimizer wrote it."""
    model = make_model()
    adam = GAOptimizer(torch.optim.Adam(model.parameters(), lr=0.001), steps=2)
    model(torch.randn(4, 64, dtype=torch.float64)).sum().backward()
    adam.step(), adam.step()
    sgd = GAOptimizer(make_sgd(make_model()), steps=2)
    with pytest.raises(InvalidValue, match=r"lacks the hyper-parameters \['dampening', 'momentum', 'nesterov'\] of a "
                                           r"SGD in group 0 .*saved by another kind of optimizer"):
        sgd.load_state_dict(adam.state_dict())
    assert sgd.param_groups[0]["lr"] == 0.05 and sgd.param_groups[0]["momentum"] == 0.9 and not sgd.state


def test_the_state_of_another_shape_of_model_is_refused_before_it_loads():
    small = torch.nn.Linear(4, 2)
    opt = GAOptimizer(torch.optim.Adam(small.parameters()), steps=1)
    small(torch.randn(3, 4)).sum().backward()
    opt.step()
    other = GAOptimizer(torch.optim.Adam(torch.nn.Linear(3, 5).parameters()), steps=1)
    with pytest.raises(InvalidValue, match=r"has state 'exp_avg' of parameter 0 of shape \(2, 4\), where its "
                                           r"parameter has shape \(5, 3\)"):
        other.load_state_dict(opt.state_dict())
    assert not other.state


@pytest.mark.parametrize("position", [7, -1, 4])
def test_a_ga_position_outside_its_update_is_refused(position):
    opt = GAOptimizer(make_sgd(make_model()), steps=4)
    state = opt.state_dict()
    state["ga"]["position"] = position
    with pytest.raises(InvalidValue, match=rf"the checkpoint's GA position must be an integer in \[0, 4\) for "
                                           rf"steps=4, got {position}"):
        opt.load_state_dict(state)
    assert opt.micro_step == 0


# ---- a hand-edited commit with a valid checksum -------------------------------------------------


def trace_run(directory, seed: int = 0):
    model = make_model()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(seed)
    sampler = CustomSampler(N, trace(), minibatch_size=MINIBATCH, seed=SEED)
    opt = LinearRuleOptimizer(make_sgd(model), sampler, ref_batchsize=REF_BATCH)
    return model, opt, ElasticState(directory, model=model, optimizer=opt, verbose=False)


def edit_momentum(payload):
    payload["objects"]["optimizer"]["optimizer"]["state"][0]["momentum_buffer"] = torch.zeros(3)


EDITS = {
    "lr nan": (lambda p: p["objects"]["optimizer"]["optimizer"]["param_groups"][0].update(lr=math.nan),
               r"cannot be restored into optimizer=: the checkpoint's optimizer has lr in group 0 = nan, where this "
               r"SGD has 0.05: it must be a finite number"),
    "lr text": (lambda p: p["objects"]["optimizer"]["optimizer"]["param_groups"][0].update(lr="0.1"),
                r"has lr in group 0 = '0.1', where this SGD has 0.05: it must be a number"),
    "updates text": (lambda p: p["objects"]["optimizer"]["trace"].update(updates="x"),
                     r"the checkpoint's trace updates must be a non-negative integer, got 'x'"),
    # a position out of its range: said as a negative one is, the field, its range and the fix (it was
    # "no micro-batch 0 of step 999 in epoch 0 for rank 0")
    "step negative": (lambda p: p["objects"]["optimizer"]["trace"].update(step=-5),
                      r"the checkpoint's trace step must be a non-negative integer, got -5; restore an intact commit "
                      r"\(was it edited\?\)$"),
    "step past the epoch": (lambda p: p["objects"]["optimizer"]["trace"].update(step=999),
                            r"the checkpoint's trace step must be an integer in 0\.\.7 \(epoch 0's 7 steps, 7 once "
                            r"they are done\), got 999; restore an intact commit \(was it edited\?\)$"),
    "micro past the step": (lambda p: p["objects"]["optimizer"]["trace"].update(micro=9),
                            r"the checkpoint's trace micro must be an integer in 0\.\.4 \(rank 0's micro-batches of "
                            r"step 1 in epoch 0\), got 9; restore an intact commit \(was it edited\?\)$"),
    "momentum shape": (edit_momentum, r"has state 'momentum_buffer' of parameter 0 of shape \(3,\), where its "
                                      r"parameter has shape \(16, 64\)"),
    "world size 0": (lambda p: p.update(world_size=0),
                     r"was not written by aikit as it is: its world_size must be a positive integer, got 0"),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_a_hand_edited_commit_with_a_valid_checksum_is_refused_before_anything_changes(tmp_path, edit):
    model, opt, state = trace_run(tmp_path)
    state.restore()
    x = torch.randn(MINIBATCH, 64, dtype=torch.float64)
    for _ in range(2):  # step 0 of the trace: 16 samples, two micro-batches
        torch.nn.functional.cross_entropy(model(x), torch.zeros(MINIBATCH, dtype=torch.long)).backward()
        opt.step()
    state.commit()
    path = checkpoint.commit_files(tmp_path)[0][1]
    payload = checkpoint.read(path)
    change, message = EDITS[edit]
    change(payload)
    checkpoint.write(tmp_path, payload["commit"], payload)  # a valid checksum over the edited state
    model2, opt2, state2 = trace_run(tmp_path, seed=1)
    before = weights(model2), opt2.param_groups[0]["lr"], (opt2.epoch, opt2.step_index, opt2.updates)
    with pytest.raises(InvalidValue, match=message):
        state2.restore()
    assert all(torch.equal(a, b) for a, b in zip(weights(model2), before[0], strict=True))
    assert (opt2.param_groups[0]["lr"], (opt2.epoch, opt2.step_index, opt2.updates)) == before[1:]
    assert not opt2.state and state2.commits == 0



@pytest.mark.parametrize(("then", "restores"), [
    ("aikit.elastic.Torch.trace_optim.LinearRuleOptimizer(torch.optim.sgd.SGD)", True),  # before the move
    ("aikit.elastic.Torch.trace_optim.RootRuleOptimizer(torch.optim.sgd.SGD)", False),  # moved, but another rule
    ("aikit.elastic.Torch.trace_optim.LinearRuleOptimizer(torch.optim.adam.Adam)", False),  # another inner optimizer
])
def test_a_commit_that_names_a_trace_optimizer_by_its_path_before_the_move_restores(tmp_path, then, restores):
    """The eth-easl optimizers moved from trace_optim.py to eth_easl.py (AdaScale to adascale.py):
    a commit written before names their old path, and restores into the class now there; a moved
    path is no wildcard (another rule, another wrapped optimizer are refused as before)."""
    model, _, state = trace_run(tmp_path)
    state.restore()
    state.commit()
    path = checkpoint.commit_files(tmp_path)[0][1]
    payload = checkpoint.read(path)
    assert payload["kinds"]["optimizer"] == "aikit.elastic.Torch.eth_easl.LinearRuleOptimizer(torch.optim.sgd.SGD)"
    payload["kinds"]["optimizer"] = then
    checkpoint.write(tmp_path, payload["commit"], payload)
    model2, _, state2 = trace_run(tmp_path, seed=1)
    if restores:
        assert state2.restore()
        assert all(torch.equal(a, b) for a, b in zip(weights(model2), weights(model), strict=True))
    else:
        with pytest.raises(InvalidValue, match=r"its state does not fit"):
            state2.restore()
