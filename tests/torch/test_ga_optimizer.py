"""The GA wrapper's promise: k micro-steps equal one real step on the concatenated batch.

Every test compares against an actual big-batch step of an identical model and optimizer in
float64, never against numbers the code produced itself.
"""

from __future__ import annotations

import copy
import gc
import io
import math
import pickle
import re
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aikit.core.errors import NoGradientWarning, NonFiniteGradientWarning, TrainingFailed
from aikit.ga.Torch.optim import Optimizer
from aikit.runtime.Torch.buckets import assign_buckets

OPTIMIZERS = {
    "sgd_momentum_wd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.01),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, centered=True, weight_decay=0.01),
}
TOL = dict(rtol=1e-6, atol=1e-9)


def model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3)).double()


def batches(sizes_per_update: list[int], seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(g, 5, generator=gen, dtype=torch.float64), torch.randint(0, 3, (g,), generator=gen))
        for g in sizes_per_update
    ]


def loss_fn(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(net(x), y)


def big_batch_run(make_opt, data, max_grad_norm=None, schedule=None) -> torch.nn.Module:
    """The reference: one plain optimizer step per global batch."""
    net = model()
    opt = make_opt(net.parameters())
    sched = None if schedule is None else torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    for x, y in data:
        opt.zero_grad()
        loss_fn(net, x, y).backward()
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(net.parameters(), max_grad_norm)
        opt.step()
        if sched is not None:
            sched.step()
    return net


def split(x: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    return list(torch.split(x, sizes))


def assert_same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, **TOL)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_equal_micro_batches_equal_one_big_batch_step(name):
    """The seed recipe as written: backward and step() per micro-batch, no weights given."""
    data = batches([32, 32, 32])
    net = model()
    opt = Optimizer(OPTIMIZERS[name](net.parameters()), 4)
    for x, y in data:
        for xm, ym in zip(split(x, [8] * 4), split(y, [8] * 4), strict=True):
            opt.zero_grad()
            loss_fn(net, xm, ym).backward()
            opt.step()
    assert_same(net, big_batch_run(OPTIMIZERS[name], data))
    steps = {int(s["step"]) for s in opt.state.values() if "step" in s}
    assert steps in (set(), {3})  # the wrapped optimizer counted 3 updates, not 12 micro-steps


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_ragged_micro_batches_equal_one_big_batch_step(name):
    """43/43/42 micro-batches (G=128 on 3 devices' worth of steps) weighted by their samples."""
    sizes = [43, 43, 42]
    data = batches([128, 128])
    net = model()
    opt = Optimizer(OPTIMIZERS[name](net.parameters()), 3, global_batch_size=128)
    for x, y in data:
        for xm, ym in zip(split(x, sizes), split(y, sizes), strict=True):
            with opt.accumulate(net, samples=len(xm)):
                loss_fn(net, xm, ym).backward()
            opt.step()
    assert_same(net, big_batch_run(OPTIMIZERS[name], data))


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=5))
def test_any_split_of_the_batch_equals_the_big_batch(sizes):
    make = OPTIMIZERS["sgd_momentum_wd"]
    data = batches([sum(sizes)] * 2)
    net = model()
    opt = Optimizer(make(net.parameters()), len(sizes), global_batch_size=sum(sizes))
    for x, y in data:
        for xm, ym in zip(split(x, sizes), split(y, sizes), strict=True):
            with opt.accumulate(net, samples=len(xm)):
                loss_fn(net, xm, ym).backward()
            opt.step()
            assert opt.updated == (opt.micro_step == 0)
    assert_same(net, big_batch_run(make, data))


def test_an_empty_micro_batch_contributes_nothing():
    """A device with no share of a step (weight 0) still runs backward; its NaN mean loss is
    not allowed to poison the update."""
    make = OPTIMIZERS["adam"]
    data = batches([6, 6])
    net = model()
    opt = Optimizer(make(net.parameters()), 3, global_batch_size=6)
    for x, y in data:
        for xm, ym in zip(split(x, [4, 0, 2]), split(y, [4, 0, 2]), strict=True):
            with opt.accumulate(net, samples=len(xm)):
                loss_fn(net, xm, ym).backward()
            opt.step()
    assert_same(net, big_batch_run(make, data))


def test_an_empty_micro_batch_with_a_nan_gradient_is_dropped():
    """With a learned loss weight (Kendall et al.'s uncertainty weighting), an empty
    micro-batch's NaN mean loss gives its parameter a NaN gradient: weight 0 must drop it."""
    data = batches([6, 6])

    def run(micro_sizes):
        net = model()
        log_var = torch.zeros((), dtype=torch.float64, requires_grad=True)
        opt = Optimizer(torch.optim.SGD([*net.parameters(), log_var], lr=0.1), len(micro_sizes),
                        global_batch_size=6)
        for x, y in data:
            for xm, ym in zip(split(x, micro_sizes), split(y, micro_sizes), strict=True):
                with opt.accumulate(net, samples=len(xm)):
                    (torch.exp(-log_var) * loss_fn(net, xm, ym) + log_var).backward()
                opt.step()
        return [*net.parameters(), log_var]

    for got, want in zip(run([4, 0, 2]), run([6]), strict=True):
        torch.testing.assert_close(got, want, **TOL)


def test_scheduler_and_step_count_advance_once_per_update():
    make = OPTIMIZERS["adam"]
    schedule = lambda update: 0.5**update  # noqa: E731
    data = batches([16] * 3)
    net = model()
    opt = Optimizer(make(net.parameters()), 2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)  # attaches to the wrapper itself
    for x, y in data:
        for xm, ym in zip(split(x, [8, 8]), split(y, [8, 8]), strict=True):
            loss_fn(net, xm, ym).backward()
            opt.step()
            if opt.updated:
                sched.step()
    assert_same(net, big_batch_run(make, data, schedule=schedule))
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01 * 0.5**3)
    assert all(int(s["step"]) == 3 for s in opt.optimizer.state.values())


def test_gradient_clipping_applies_once_to_the_accumulated_gradient():
    make = OPTIMIZERS["sgd_momentum_wd"]
    data = batches([24, 24])
    net = model()
    opt = Optimizer(make(net.parameters()), 3, max_grad_norm=0.05)
    for x, y in data:
        for xm, ym in zip(split(x, [8] * 3), split(y, [8] * 3), strict=True):
            loss_fn(net, xm, ym).backward()
            opt.step()
    reference = big_batch_run(make, data, max_grad_norm=0.05)
    assert_same(net, reference)
    assert not torch.allclose(reference[0].weight, big_batch_run(make, data)[0].weight)  # clipping bit


def test_closure_is_evaluated_once_per_call_and_its_loss_returned():
    make = OPTIMIZERS["adamw"]
    data = batches([20])
    net = model()
    opt = Optimizer(make(net.parameters()), 2)
    x, y = data[0]
    losses = []
    for xm, ym in zip(split(x, [10, 10]), split(y, [10, 10]), strict=True):

        def closure(xm=xm, ym=ym):
            opt.zero_grad()
            loss = loss_fn(net, xm, ym)
            loss.backward()
            return loss

        losses.append(opt.step(closure))
    with torch.no_grad():
        expected = [float(loss_fn(model(), *b)) for b in zip(split(x, [10, 10]), split(y, [10, 10]), strict=True)]
    assert [float(v.detach()) for v in losses] == pytest.approx(expected)
    assert_same(net, big_batch_run(make, data))


def test_amp_grad_scaler_unscales_and_steps_once_per_update():
    make = OPTIMIZERS["sgd_momentum_wd"]
    data = batches([16, 16])
    net = model()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    opt = Optimizer(make(net.parameters()), 2, scaler=scaler)
    for x, y in data:
        for xm, ym in zip(split(x, [8, 8]), split(y, [8, 8]), strict=True):
            scaler.scale(loss_fn(net, xm, ym)).backward()
            opt.step()
    assert_same(net, big_batch_run(make, data))


def test_an_update_amp_skips_for_inf_is_reported_and_cleared():
    net = model()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    opt = Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 2, scaler=scaler)
    before = [p.detach().clone() for p in net.parameters()]
    x, y = batches([4])[0]
    for poison in (False, True):
        scaler.scale(loss_fn(net, x, y) * (float("inf") if poison else 1.0)).backward()
        opt.step()
    assert not opt.updated and opt.micro_step == 0 and scaler.get_scale() < 2.0**10
    assert all(p.grad is None for p in net.parameters())  # the next update starts clean
    assert all(torch.equal(p, q) for p, q in zip(net.parameters(), before, strict=True))


def test_zero_grad_mid_update_keeps_the_accumulated_gradient():
    net = model()
    opt = Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 2)
    x, y = batches([4])[0]
    loss_fn(net, x, y).backward()
    opt.step()
    before = net[0].weight.grad.clone()
    opt.zero_grad()
    torch.testing.assert_close(net[0].weight.grad, before)
    loss_fn(net, x, y).backward()
    opt.step()
    assert opt.updated and net[0].weight.grad is None


def _train(net, opt, data, sizes, start=0, stop=None):
    micro = [(xm, ym) for x, y in data for xm, ym in zip(split(x, sizes), split(y, sizes), strict=True)]
    for xm, ym in micro[start:stop]:
        with opt.accumulate(net, samples=len(xm)):
            loss_fn(net, xm, ym).backward()
        opt.step()


@pytest.mark.parametrize("name", ["adam", "sgd_momentum_wd"])
def test_state_dict_mid_update_resumes_to_the_same_bits(name):
    make, sizes, data = OPTIMIZERS[name], [5, 4, 3], batches([12] * 3)
    net = model()
    opt = Optimizer(make(net.parameters()), 3, global_batch_size=12)
    _train(net, opt, data, sizes)  # uninterrupted

    first = model()
    opt1 = Optimizer(make(first.parameters()), 3, global_batch_size=12)
    _train(first, opt1, data, sizes, stop=5)  # one update and two micro-steps
    buffer = io.BytesIO()
    torch.save({"model": first.state_dict(), "optimizer": opt1.state_dict()}, buffer)
    buffer.seek(0)
    checkpoint = torch.load(buffer)

    resumed = model(seed=7)
    opt2 = Optimizer(make(resumed.parameters()), 3, global_batch_size=12)
    resumed.load_state_dict(checkpoint["model"])
    opt2.load_state_dict(checkpoint["optimizer"])
    assert opt2.micro_step == 2
    _train(resumed, opt2, data, sizes, start=5)
    for p, q in zip(net.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(p, q)


def test_pickle_keeps_the_accumulation_position_and_pending_gradients():
    net = model()
    opt = Optimizer(torch.optim.Adam(net.parameters(), lr=0.01), 3, global_batch_size=12)
    _train(net, opt, batches([12, 12]), [4, 4, 4], stop=4)
    copy_ = pickle.loads(pickle.dumps(opt))
    assert (copy_.micro_step, copy_.steps) == (1, 3)
    for p, q in zip(opt.optimizer.param_groups[0]["params"], copy_.optimizer.param_groups[0]["params"],
                    strict=True):
        assert torch.equal(p, q) and torch.equal(p.grad, q.grad)
    assert copy_.optimizer.state_dict()["state"].keys() == opt.optimizer.state_dict()["state"].keys()


def test_steps_may_change_between_updates_only():
    net = model()
    opt = Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 2)
    opt.steps = 3
    x, y = batches([4])[0]
    loss_fn(net, x, y).backward()
    opt.step()
    with pytest.raises(ValueError, match=r"steps can change only between updates, but 1 of 3 micro-steps"):
        opt.steps = 2


def test_checkpoint_mid_update_refuses_a_different_steps():
    net = model()
    opt = Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 3, global_batch_size=12)
    _train(net, opt, batches([12]), [4, 4, 4], stop=1)
    other = Optimizer(torch.optim.SGD(model().parameters(), lr=0.1), 2)
    with pytest.raises(ValueError, match=r"saved 1 micro-steps into an update of steps=3, but this optimizer "
                                         r"has steps=2: resume with steps=3"):
        other.load_state_dict(opt.state_dict())
    between = Optimizer(torch.optim.SGD(model().parameters(), lr=0.1), 3)
    between.load_state_dict({**between.state_dict()})  # round trip at position 0
    other.load_state_dict(between.state_dict())  # a new steps is fine between updates
    assert other.steps == 2


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda p: Optimizer(torch.optim.SGD(p, lr=0.1), 0), "steps must be a positive integer, got 0"),
        (lambda p: Optimizer(torch.optim.SGD(p, lr=0.1), 2.5), "steps must be a positive integer, got 2.5"),
        (lambda p: Optimizer(torch.optim.SGD(p, lr=0.1), 2, max_grad_norm=-1),
         "max_grad_norm must be a positive number or None, got -1"),
        (lambda p: Optimizer(object(), 2), "optimizer must be a torch.optim.Optimizer, got object"),
        (lambda p: Optimizer(Optimizer(torch.optim.SGD(p, lr=0.1), 2), 2), "already an aikit GA Optimizer"),
        (lambda p: Optimizer(torch.optim.SGD(p, lr=0.1), 2).load_state_dict(torch.optim.SGD(p, lr=0.1).state_dict()),
         r"this is a torch optimizer's state_dict, not an aikit GA Optimizer's: load it with "
         r"optimizer.optimizer.load_state_dict"),
        (lambda p: Optimizer(torch.optim.SGD(p, lr=0.1), 2).load_state_dict({"optimizer": {}, "ga": {"steps": 2}}),
         r"state_dict\['ga'\] needs keys"),
    ],
)
def test_bad_input_gets_a_clear_error(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call(list(model().parameters()))


def test_an_update_with_the_wrong_number_of_samples_is_refused():
    net = model()
    opt = Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 2, global_batch_size=16)
    x, y = batches([15])[0]
    for xm, ym in zip(split(x, [8, 7]), split(y, [8, 7]), strict=True):
        with opt.accumulate(net, samples=len(xm)):
            loss_fn(net, xm, ym).backward()
        if opt.sync_gradients:
            with pytest.raises(ValueError, match=r"the 2 micro-batches of this update held 15 samples, but "
                                                 r"global_batch_size is 16"):
                opt.step()
        else:
            opt.step()
    with pytest.raises(ValueError, match=r"samples must be a non-negative integer, got -3"), \
            opt.accumulate(net, samples=-3):
        pass


def test_samples_without_a_global_batch_is_refused(monkeypatch):
    import aikit.runtime.process

    monkeypatch.setattr(aikit.runtime.process, "_state", aikit.runtime.process.ProcessState())
    net = model()
    opt = Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 2)
    with pytest.raises(ValueError, match=r"no global batch is known: pass Optimizer\(..., global_batch_size=G\)"), \
            opt.accumulate(net, samples=4):
        pass


def test_wrapping_keeps_the_optimizer_and_its_state():
    net = model()
    inner = torch.optim.Adam(net.parameters(), lr=0.01, betas=(0.8, 0.9))
    x, y = batches([4])[0]
    loss_fn(net, x, y).backward()
    inner.step()
    before = copy.deepcopy(inner.state_dict())
    opt = Optimizer(inner, 2)
    assert opt.optimizer is inner and opt.defaults["betas"] == (0.8, 0.9)
    assert opt.state_dict()["optimizer"]["state"][0]["exp_avg"].equal(before["state"][0]["exp_avg"])


# --- a real torch.optim.Optimizer: schedulers, hooks, AMP with clipping, sparse gradients -------

SCHEDULERS = {
    "step": lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5),
    "one_cycle": lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=6),
    "lambda_warmup": lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda update: min(1.0, (update + 1) / 3)),
}


@pytest.mark.parametrize("name", SCHEDULERS)
def test_a_plain_torch_loop_moves_the_lr_once_per_update_with_update_scheduler(name):
    """The loop calls scheduler.step() after every optimizer.step(), as written for plain torch."""
    from aikit.ga.Torch.optim import UpdateScheduler

    make = OPTIMIZERS["sgd_momentum_wd"]
    data = batches([12] * 6)
    net = model()
    inner = make(net.parameters())
    opt = Optimizer(inner, 3)
    scheduler = UpdateScheduler(SCHEDULERS[name](opt))
    used = []
    inner.register_step_pre_hook(lambda o, *_: used.append(o.param_groups[0]["lr"]))
    for x, y in data:
        for xm, ym in zip(split(x, [4] * 3), split(y, [4] * 3), strict=True):
            loss_fn(net, xm, ym).backward()
            opt.step()
            scheduler.step()
    reference = model()
    ref_opt = make(reference.parameters())
    ref_scheduler, expected = SCHEDULERS[name](ref_opt), []
    for x, y in data:
        ref_opt.zero_grad()
        loss_fn(reference, x, y).backward()
        expected.append(ref_opt.param_groups[0]["lr"])
        ref_opt.step()
        ref_scheduler.step()
    assert used == pytest.approx(expected, rel=1e-12) and len(set(used)) > 1
    assert scheduler.get_last_lr() == ref_scheduler.get_last_lr()
    assert_same(net, reference)


@pytest.mark.parametrize("given", ["cosine", None, torch.optim.lr_scheduler.CosineAnnealingLR])
def test_update_scheduler_of_what_is_no_scheduler_says_to_build_one(given):
    """It said "... but str was built on NoneType"."""
    from aikit.ga.Torch.optim import UpdateScheduler

    with pytest.raises(TypeError) as refused:
        UpdateScheduler(given)
    assert str(refused.value) == (
        f"UpdateScheduler wraps a torch LR scheduler built on the aikit optimizer, got {given!r:.60} (a "
        f"{type(given).__name__}): build one first, e.g. UpdateScheduler(torch.optim.lr_scheduler."
        "CosineAnnealingLR(optimizer, T_max=updates))")


def test_update_scheduler_refuses_a_scheduler_of_a_plain_optimizer():
    from aikit.ga.Torch.optim import UpdateScheduler

    plain = torch.optim.SGD(model().parameters(), lr=0.1)
    with pytest.raises(TypeError, match=r"UpdateScheduler schedules an aikit optimizer .* built on SGD: build it on"):
        UpdateScheduler(torch.optim.lr_scheduler.StepLR(plain, 2))


def test_state_dict_hooks_registered_on_the_wrapper_run():
    net = model()
    opt = Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 2)
    calls = []
    opt.register_state_dict_pre_hook(lambda o: calls.append(("save_pre", o is opt)))
    opt.register_state_dict_post_hook(lambda o, sd: {**sd, "note": "added"})
    opt.register_load_state_dict_pre_hook(lambda o, sd: {k: v for k, v in sd.items() if k != "note"})
    opt.register_load_state_dict_post_hook(lambda o: calls.append(("load_post", o is opt)))
    saved = opt.state_dict()
    assert saved["note"] == "added"
    opt.load_state_dict(saved)
    assert calls == [("save_pre", True), ("load_post", True)]
    assert isinstance(opt, torch.optim.Optimizer) and opt.param_groups is opt.optimizer.param_groups


def test_amp_with_clipping_unscales_before_it_clips():
    """Clipping the still-scaled gradient would cut it to max_grad_norm / scale."""
    make = OPTIMIZERS["sgd_momentum_wd"]
    data = batches([16, 16])
    net = model()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    opt = Optimizer(make(net.parameters()), 2, scaler=scaler, max_grad_norm=0.05)
    for x, y in data:
        for xm, ym in zip(split(x, [8, 8]), split(y, [8, 8]), strict=True):
            scaler.scale(loss_fn(net, xm, ym)).backward()
            opt.step()
            assert opt.updated == (opt.micro_step == 0)  # a successful AMP update says so
    assert_same(net, big_batch_run(make, data, max_grad_norm=0.05))


def test_sparse_gradients_with_clipping_get_an_aikit_error_and_nothing_changes():
    emb = torch.nn.Embedding(10, 3, sparse=True).double()
    before = emb.weight.detach().clone()
    opt = Optimizer(torch.optim.SGD(emb.parameters(), lr=0.1), 1, max_grad_norm=1.0)
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(ValueError, match=r"max_grad_norm=1.0 cannot clip sparse gradients \(nn.Embedding"):
        opt.step()
    assert torch.equal(emb.weight, before) and emb.weight.grad is None and opt.micro_step == 0
    unclipped = Optimizer(torch.optim.SGD(emb.parameters(), lr=0.1), 2)  # without clipping, sparse works
    for _ in range(2):
        emb(torch.tensor([1, 2])).sum().backward()
        unclipped.step()
    torch.testing.assert_close(emb.weight[1], before[1] - 0.1)
    assert torch.equal(emb.weight[3], before[3])


def test_a_failed_load_changes_nothing():
    net = model()
    opt = Optimizer(torch.optim.Adam(net.parameters(), lr=0.01), 3, global_batch_size=12)
    _train(net, opt, batches([12]), [4, 4, 4], stop=2)
    saved = opt.state_dict()
    saved["ga"]["pending_grads"][0] = torch.zeros(2, 2, dtype=torch.float64)
    other_net = model(seed=3)
    other = Optimizer(torch.optim.Adam(other_net.parameters(), lr=0.01), 3, global_batch_size=12)
    _train(other_net, other, batches([12], seed=4), [4, 4, 4], stop=4)
    before = copy.deepcopy(other.state_dict())
    with pytest.raises(ValueError, match=r"pending gradient 0 has shape \(2, 2\), its parameter \(7, 5\)"):
        other.load_state_dict(saved)
    after = other.state_dict()
    assert after["ga"] == {**before["ga"], "pending_grads": after["ga"]["pending_grads"]}
    for a, b in zip(after["ga"]["pending_grads"], before["ga"]["pending_grads"], strict=True):
        assert torch.equal(a, b)
    assert torch.equal(after["optimizer"]["state"][0]["exp_avg"], before["optimizer"]["state"][0]["exp_avg"])


def test_reduce_at_update_in_one_process_flushes_a_short_window_to_its_mean():
    """An epoch of 12 + 12 + 7 samples with G = 12: the last update is the mean over its 7."""
    make = OPTIMIZERS["adam"]
    sizes_per_window = [[5, 4, 3], [5, 4, 3], [5, 2]]
    data = batches([sum(s) for s in sizes_per_window])
    net = model()
    opt = Optimizer(make(net.parameters()), 3, global_batch_size=12, reduce=True)
    for (x, y), sizes in zip(data, sizes_per_window, strict=True):
        for xm, ym in zip(split(x, sizes), split(y, sizes), strict=True):
            with opt.accumulate(net, samples=len(xm)):
                loss_fn(net, xm, ym).backward()
            opt.step()
        opt.flush()
    assert opt.micro_step == 0
    assert_same(net, big_batch_run(make, data))


def test_the_divisor_is_the_micro_steps_accumulated_when_a_short_window_is_flushed():
    make = OPTIMIZERS["sgd_momentum_wd"]
    data = batches([16, 8])
    net = model()
    opt = Optimizer(make(net.parameters()), 4, reduce=True)
    for x, y in data:
        for xm, ym in zip(split(x, [4] * (len(x) // 4)), split(y, [4] * (len(x) // 4)), strict=True):
            loss_fn(net, xm, ym).backward()
            opt.step()
        opt.flush()
    assert_same(net, big_batch_run(make, data))


def test_bucket_cap_mb_is_a_positive_number_of_megabytes_or_none():
    net = model()
    for bad in (0, -1.0, True, "25"):
        with pytest.raises(ValueError, match=rf"bucket_cap_mb must be a positive number of megabytes \(DDP's "
                                             rf"default is 25\) or None, got {re.escape(repr(bad))}"):
            Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 2, reduce=True, bucket_cap_mb=bad)
    whole = Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 2, reduce=True, bucket_cap_mb=None)
    assert whole.engine.buckets is None  # one all-reduce after the backward, no hooks


def test_buckets_take_the_parameters_in_reverse_order_one_dtype_each_the_first_one_mib():
    sizes = [(300_000, torch.float32), (10, torch.float64), (200_000, torch.float32), (100, torch.float32),
             (70_000, torch.float64)]
    p0, p1, p2, p3, p4 = (torch.nn.Parameter(torch.zeros(n, dtype=dtype)) for n, dtype in sizes)
    # float32 from the back: 400 B, 800 kB, then 1.2 MB passes the first bucket's 1 MiB; the float64
    # ones (560 kB + 80 B) never fill a bucket and travel last
    got = assign_buckets([p0, p1, p2, p3, p4], cap_bytes=2 << 20)
    assert [[id(p) for p in bucket] for bucket in got] == [[id(p3), id(p2), id(p0)], [id(p4), id(p1)]]
    small = assign_buckets([p0, p1, p2, p3, p4], cap_bytes=500)  # under 1 MiB the cap is the limit
    assert [[id(p) for p in bucket] for bucket in small] == [[id(p4)], [id(p3), id(p2)], [id(p0)], [id(p1)]]


def test_a_dropped_reduce_at_update_optimizer_leaves_no_hook_on_the_parameters():
    """Its hooks would otherwise start all-reduces from every later backward over the same
    parameters (steps=1: every backward ends an update)."""
    net = model()
    opt = Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 1, reduce=True)
    assert all(len(p._post_accumulate_grad_hooks) == 1 for p in net.parameters())
    del opt
    gc.collect()
    assert all(not p._post_accumulate_grad_hooks for p in net.parameters())
    copied = copy.deepcopy(Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 1, reduce=True, bucket_cap_mb=4))
    assert copied.bucket_cap_mb == 4 and copied.engine.buckets.cap_bytes == 4 << 20


# --- an inf/NaN gradient: the update skipped, as a GradScaler skips one ------------------------


def poisoned_run(make, max_grad_norm=None, poison=float("nan"), **options):
    """Three updates of two micro-steps (adam with a StepLR under UpdateScheduler), the second
    update's last micro-batch times ``poison``; returns what each update left."""
    from aikit.ga.Torch.optim import UpdateScheduler

    net = model()
    opt = Optimizer(make(net.parameters()), 2, max_grad_norm=max_grad_norm, **options)
    scheduler = UpdateScheduler(torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5))
    after = []
    for update, (x, y) in enumerate(batches([8, 8, 8])):
        for micro, (xm, ym) in enumerate(zip(split(x, [4, 4]), split(y, [4, 4]), strict=True)):
            loss = loss_fn(net, xm, ym)
            (loss * poison if update == 1 and micro == 1 else loss).backward()
            opt.step()
            scheduler.step()
        after.append({"updated": opt.updated, "weights": [p.detach().clone() for p in net.parameters()],
                      "steps": {int(s["step"]) for s in opt.optimizer.state.values()}, "applied": opt.applied,
                      "lr": opt.param_groups[0]["lr"], "skipped": opt.skipped, "position": opt.micro_step,
                      "grads": [p.grad for p in net.parameters()]})
    return net, after


@pytest.mark.parametrize(("poison", "max_grad_norm"), [(float("nan"), None), (float("nan"), 1.0),
                                                       (float("inf"), 1.0), (float("inf"), None)])
def test_an_update_with_an_inf_or_nan_gradient_is_skipped_and_counted_as_amp_skips_are(poison, max_grad_norm):
    make = OPTIMIZERS["adam"]
    with pytest.warns(NonFiniteGradientWarning) as caught:
        net, (first, skipped, last) = poisoned_run(make, max_grad_norm, poison)
    assert [first["updated"], skipped["updated"], last["updated"]] == [True, False, True]
    assert all(torch.equal(a, b) for a, b in zip(skipped["weights"], first["weights"], strict=True))  # no weight moved
    assert skipped["steps"] == first["steps"] == {1} and last["steps"] == {2}  # Adam's step count did not advance
    assert (skipped["applied"], skipped["lr"]) == (1, first["lr"])  # nor did the UpdateScheduler
    assert (skipped["skipped"], skipped["position"], skipped["grads"]) == (1, 0, [None] * 4)  # the window is spent
    assert (last["applied"], last["skipped"], last["lr"]) == (2, 1, first["lr"] / 2)  # and training goes on
    # the run equals the big-batch run on the two updates applied
    data = batches([8, 8, 8])
    assert_same(net, big_batch_run(make, [data[0], data[2]], max_grad_norm=max_grad_norm,
                                   schedule=lambda step: 0.5**step))
    (warning,) = caught  # once
    assert re.match(  # inf times a zero in the chain rule is NaN: an inf loss may give a NaN norm
        r"aikit skipped an update: its gradient is not finite \(total norm (nan|inf)\), so no weight changed and "
        r"nothing that counts updates advanced, as a GradScaler skips one \(optimizer.updated is False, "
        r"optimizer.skipped counts the skips\)\. Check the loss and the data for inf/NaN", str(warning.message))
    assert "10 skips in a row raise TrainingFailed (max_skips_in_a_row)" in str(warning.message)
    assert "skip_nonfinite=False applies such gradients" in str(warning.message)


def test_the_first_skip_is_warned_once_per_optimizer_and_a_run_of_them_raises_training_failed():
    x, y = batches([4])[0]
    net = model()
    opt = Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 1, max_skips_in_a_row=3)
    before = [p.detach().clone() for p in net.parameters()]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for poisoned in (True, True, False, True, True):  # an applied update ends a run
            (loss_fn(net, x, y) * (math.nan if poisoned else 1.0)).backward()
            opt.step()
        assert [type(w.message) for w in caught] == [NonFiniteGradientWarning]
        moved = [p.detach().clone() for p in net.parameters()]
        loss_fn(net, x, y).mul(math.inf).backward()
        with pytest.raises(TrainingFailed) as error:
            opt.step()
    assert str(error.value) == (
        "3 updates in a row were skipped because their gradient was not finite (total norm nan): the weights have "
        "not changed since (optimizer.updated is False; optimizer.skipped is 5), and every batch gives inf/NaN at "
        "them. Check the learning rate (lower it, or warm it up), the loss (a log or a division by 0, a mean over "
        "an empty batch) and the data (inf/NaN inputs or labels); max_skips_in_a_row=None skips for ever, "
        "skip_nonfinite=False applies such gradients")
    assert isinstance(error.value, RuntimeError) and not opt.updated and opt.skipped == 5 and opt.applied == 1
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), moved, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(moved, before, strict=True))
    assert all(p.grad is None for p in net.parameters())
    other = Optimizer(torch.optim.SGD(model().parameters(), lr=0.1), 1, max_skips_in_a_row=None)
    with pytest.warns(NonFiniteGradientWarning, match=r"max_skips_in_a_row=None: it skips them for ever"):
        for _ in range(20):  # a second optimizer warns for itself, and None never raises
            for p in other.param_groups[0]["params"]:
                p.grad = torch.full_like(p, math.nan)
            other.step()
    assert other.skipped == 20


def test_skip_nonfinite_false_applies_the_nan_as_torch_does_and_reads_nothing(monkeypatch):
    import aikit.runtime.Torch.accumulator as accumulator

    reads = []
    monkeypatch.setattr(accumulator, "read_norm", lambda norm: reads.append(norm) or float(norm))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        net, (first, applied, last) = poisoned_run(OPTIMIZERS["adam"], 1.0, skip_nonfinite=False)
    assert [first["updated"], applied["updated"], last["updated"]] == [True, True, True]
    assert all(torch.isnan(p).all() for p in net.parameters()) and last["skipped"] == 0 and last["applied"] == 3
    assert reads == []


@pytest.mark.parametrize("max_grad_norm", [None, 1.0])
def test_the_finiteness_check_reads_the_one_norm_once_per_update_and_never_under_amp(monkeypatch, max_grad_norm):
    """One read from the device per update, of the total norm clipping computes (not a second
    norm), none in the micro-steps before; a GradScaler checks itself, so none there."""
    import aikit.runtime.Torch.accumulator as accumulator

    reads, norms = [], []
    clip = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(accumulator, "read_norm", lambda norm: reads.append(norm) or float(norm))
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda *a, **k: norms.append(clip(*a, **k)) or norms[-1])
    net = model()
    opt = Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 3, max_grad_norm=max_grad_norm)
    for x, y in batches([6, 6]):
        for xm, ym in zip(split(x, [2, 2, 2]), split(y, [2, 2, 2]), strict=True):
            loss_fn(net, xm, ym).backward()
            opt.step()
            assert len(reads) == opt.applied  # none in the micro-steps before an update
    assert len(reads) == 2
    assert max_grad_norm is None or [r is n for r, n in zip(reads, norms, strict=True)] == [True] * 2  # the clip's
    reads.clear()
    scaled = Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 1, max_grad_norm=max_grad_norm,
                       scaler=torch.amp.GradScaler("cpu", init_scale=2.0**4))
    scaled.scaler.scale(loss_fn(net, *batches([4])[0])).backward()
    scaled.step()
    assert scaled.updated and reads == []


def test_an_update_amp_skips_is_counted_in_skipped_without_a_warning():
    net = model()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    opt = Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 1, scaler=scaler)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(10):  # the scaler's own search for a first scale, halving 2**10 down to 1: not warned
            opt.scaler.scale(loss_fn(net, *batches([4])[0]) * math.inf).backward()
            opt.step()
    assert not opt.updated and opt.skipped == 10 and opt.applied == 0 and scaler.get_scale() == 1
    with pytest.warns(NonFiniteGradientWarning, match=r"whose scale is down to 0\.5"):  # below 1: a failure's start
        opt.scaler.scale(loss_fn(net, *batches([4])[0]) * math.inf).backward()
        opt.step()


# --- a forgotten backward() -------------------------------------------------------------------


def test_an_update_with_no_gradient_at_all_is_warned_once_and_changes_nothing():
    net = model()
    opt = Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 2)
    before = [p.detach().clone() for p in net.parameters()]
    with pytest.warns(NoGradientWarning) as caught:
        for _ in range(4):
            opt.step()
    (warning,) = caught
    assert str(warning.message) == (
        "aikit: an update had no gradient at all: no backward reached the optimizer's parameters in its 2 "
        "micro-step(s), so it changed nothing (optimizer.updated is still True). Call loss.backward() before every "
        "optimizer.step() (with a loss that reaches the parameters). Warned once per optimizer.")
    assert opt.updated and all(torch.equal(a, b) for a, b in zip(net.parameters(), before, strict=True))


@pytest.mark.parametrize("forgotten", [0, 1, 2])
def test_a_micro_step_without_a_backward_is_warned_once(forgotten):
    net = model()
    opt = Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 3)
    x, y = batches([6])[0]
    with pytest.warns(NoGradientWarning) as caught:
        for _ in range(2):
            for micro, (xm, ym) in enumerate(zip(split(x, [2, 2, 2]), split(y, [2, 2, 2]), strict=True)):
                if micro != forgotten:
                    loss_fn(net, xm, ym).backward()
                opt.step()
    (warning,) = caught
    assert str(warning.message).startswith(
        "aikit: 1 of the 3 micro-steps of an update had no backward since the step() before, so it added nothing: "
        "the update is still the mean over all 3 micro-steps (a smaller one). Call loss.backward() before every "
        "optimizer.step()")


def test_every_micro_step_with_a_backward_an_empty_declared_one_and_create_graph_warn_nothing():
    net = model()
    opt = Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 3, global_batch_size=4)
    x, y = batches([4])[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoGradientWarning)
        for _ in range(2):
            for xm, ym in zip(split(x, [2, 0, 2]), split(y, [2, 0, 2]), strict=True):
                with opt.accumulate(net, samples=len(xm)):
                    if len(xm):  # an empty micro-batch (a replica's share of a short window) needs no backward
                        loss_fn(net, xm, ym).backward()
                opt.step()
        graph = Optimizer(torch.optim.SGD(model().parameters(), lr=0.1), 2)
        for _ in range(4):  # each backward with create_graph=True sets a new .grad, of version 0
            graph.zero_grad()
            sum(p.pow(2).sum() for p in graph.param_groups[0]["params"]).backward(create_graph=True)
            graph.step()
    assert opt.applied == 2 and graph.applied == 2
