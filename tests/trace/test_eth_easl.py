"""eth-easl's variable batch size through aikit's names: its argument order and verbose lines,
its public surface with the same answers as its own code, and whole runs bit-identical to a
re-implementation of it (tests/trace/eth_easl_original.py) with ``permutation="torch"``."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from eth_easl_original import OriginalSampler, original_run
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aikit.core.trace import TraceStepWarning
from aikit.datasets import digits
from aikit.elastic.Torch import CustomOptimizer, CustomSampler, LinearRuleMomentumOptimizer, LinearRuleOptimizer

SEED_TRACE = Path(__file__).parent / "data" / "eth_easl_test_trace.csv"  # eth-easl's test/test_trace.csv


def head_of_seed_trace(tmp_path: Path, rows: int = 30) -> str:
    """eth-easl's own sample trace, cut where its batches still fit digits (its step column
    restarts at row 10: two runs concatenated)."""
    path = tmp_path / "trace.csv"
    pd.read_csv(SEED_TRACE).head(rows).to_csv(path, index=False)
    return str(path)


def digits_data() -> TensorDataset:
    x, y, _, _ = digits()
    return TensorDataset(torch.as_tensor(x), torch.as_tensor(y, dtype=torch.long))


def digits_model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10), nn.LogSoftmax(dim=1))


# --- the constructor ---------------------------------------------------------------------------

def test_positional_arguments_follow_eth_easls_order_seed_third():
    sampler = CustomSampler(200, [64, 32], 7, when_exhausted="cycle")  # eth-easl: seed third, not 7 replicas
    assert (sampler.seed, sampler.num_replicas, sampler.rank, sampler.minibatch_size) == (7, 1, 0, 32)
    every = CustomSampler(200, [8, 16], 7, 2, 1, 4, False, when_exhausted="cycle")
    assert (every.seed, every.num_replicas, every.rank, every.minibatch_size) == (7, 2, 1, 4)
    by_keyword = CustomSampler(dataset=200, trace=[8, 16], seed=7, num_replicas=2, rank=1, minibatch_size=4,
                               verbose=False, when_exhausted="cycle")
    assert list(every) == list(by_keyword)


@pytest.mark.parametrize(("args", "message"), [
    ((2, 1, 4, 8), r"rank must be an integer in 0..0, got 4"),  # aikit 0.1: (num_replicas, rank, mb, seed)
    ((2, 0), r"num_replicas must be a positive integer, got 0"),  # rank 0 of 2, as aikit 0.1 read it
])
def test_aikit_0_1s_positional_order_is_refused_with_the_order_named(args, message):
    """aikit 0.1 took (num_replicas, rank, minibatch_size, seed) after the trace: such calls fail
    loudly and say why. (``CustomSampler(ds, trace, k)`` alone now means seed k, the replicas
    coming from the engine: under aikit 0.1 it trained only when k was the engine's world size.)"""
    with pytest.raises(ValueError, match=message + r".*arguments after the trace are seed, num_replicas, rank, "
                                               r"minibatch_size, verbose, in eth-easl's order; aikit 0.1 took "
                                               r"num_replicas third: pass them by keyword"):
        CustomSampler(400, [16, 32], *args, verbose=False)


def test_verbose_prints_eth_easls_two_lines_on_rank_0(capsys):
    CustomSampler(100, [64, 32, 96], 42, 2, 0, 32)  # the original's default verbose=True, rank 0 given
    assert capsys.readouterr().out.splitlines() == [
        "    MySampler (rank 0): Loaded trace starting with 64, 32,...",
        "    MySampler (rank 0): trace_samples=192, minibatches_per_epoch=3 => max_epoch=~2",
    ]
    CustomSampler(100, [64, 32, 96], 42, 2, 1, 32)  # rank 1: nothing
    CustomSampler(100, [64, 32, 96], minibatch_size=32)  # rank left to the engine: nothing, as the original
    CustomSampler(100, [64, 32, 96], 42, 2, 0, 32, False)
    assert capsys.readouterr().out == ""
    CustomSampler(100, [64], minibatch_size=32, verbose=True, when_exhausted="stop")  # rank 0 of the engine
    assert capsys.readouterr().out.splitlines()[0] == "    MySampler (rank 0): Loaded trace starting with 64,..."
    with pytest.raises(TypeError, match="verbose must be True, False or None, got 'yes'"):
        CustomSampler(100, [64], minibatch_size=32, verbose="yes")


# --- the sampler's surface, against the original's own code -------------------------------------

@st.composite
def traces(draw):
    mb = draw(st.sampled_from([1, 2, 4, 8]))
    size = draw(st.integers(3 * mb, 200))
    sizes = draw(st.lists(st.integers(1, size // mb).map(lambda k: k * mb), min_size=1, max_size=30))
    # long enough for three epochs and a step more (the original reads one step past an epoch's end)
    sizes += [mb] * (4 * size // mb + 1)
    return size, sizes, mb, draw(st.integers(1, 3)), draw(st.integers(0, 10**6))


@settings(max_examples=60, deadline=None)
@given(traces(), st.data())
def test_sampler_surface_answers_as_eth_easls_code(setup, data):
    size, sizes, mb, replicas, seed = setup
    rank = data.draw(st.integers(0, replicas - 1))
    ours = CustomSampler(size, sizes, seed, replicas, rank, mb, permutation="torch")
    theirs = OriginalSampler(size, sizes, seed, replicas, rank, mb)
    assert ours.trace == theirs.trace and ours.seed == seed
    assert (ours.minibatches_per_epoch, ours.max_epoch) == (theirs.minibatches_per_epoch, theirs.max_epoch)
    for epoch in range(3):
        assert ours.get_epoch_range(epoch) == theirs.get_epoch_range(epoch)
        epochtrace = ours.get_epochtrace(epoch)
        assert epochtrace == theirs.get_epochtrace(epoch)
        assert ours.get_batch_assignments(epochtrace) == theirs.get_batch_assignments(epochtrace)
        ours.set_epoch(epoch)
        theirs.set_epoch(epoch)
        # the same samples in the same order; where the original yields a dummy batch, aikit yields none
        real = [batch for batch, step in zip(theirs, _dealt_steps(theirs, epochtrace), strict=True) if step]
        assert list(ours) == real


def _dealt_steps(sampler: OriginalSampler, epochtrace: list[int]) -> list[bool]:
    """For each batch the original yields: True when real, False for its dummy batch."""
    return [real for batches in sampler.get_batch_assignments(epochtrace)
            for real in ([True] * len(batches) if batches else [False])]


def test_a_repeating_trace_has_no_end_and_a_bad_epochtrace_is_named():
    sampler = CustomSampler(100, 32, minibatch_size=32)  # an int: constant for ever
    assert (sampler.trace, sampler.max_epoch) == ([32], math.inf)
    assert sampler.get_epochtrace(5) == [32, 32, 32]
    with pytest.raises(ValueError, match=r"batch size 48 is not a multiple of minibatch_size 32; use 32 or 64"):
        sampler.get_batch_assignments([32, 48])
    with pytest.raises(ValueError, match="the steps need 128 samples but an epoch holds 96"):
        sampler.get_batch_assignments([64, 64])


def test_permutation_must_be_known_or_a_function_returning_a_permutation():
    with pytest.raises(ValueError, match=r"permutation must be one of \['numpy', 'torch'\] or a function"):
        CustomSampler(100, 32, minibatch_size=32, permutation="jax")
    with pytest.raises(ValueError, match=r"permutation 'repeats' returned index 0 more than once for epoch 0: it must "
                                         r"return a permutation of range\(100\), every index once"):
        def repeats(seed, epoch, size):
            return np.zeros(size, dtype=np.int64)
        CustomSampler(100, 32, minibatch_size=32, permutation=repeats)
    reversed_order = CustomSampler(8, 4, minibatch_size=4, permutation=lambda seed, epoch, size: np.arange(size)[::-1])
    assert list(reversed_order) == [[7, 6, 5, 4], [3, 2, 1, 0]]


# --- the optimizers' surface ---------------------------------------------------------------------

def test_get_lr_set_lr_get_bs_current_lr_and_adapt_lr_mean_what_they_meant():
    data = digits_data()
    model = digits_model()
    sampler = CustomSampler(data, [64, 32, 96, 128], minibatch_size=32, when_exhausted="cycle")
    inner = torch.optim.SGD([{"params": model[1].parameters()}, {"params": model[3].parameters(), "lr": 0.2}], lr=0.1)
    optimizer = LinearRuleOptimizer(inner, sampler, ref_batchsize=64)
    used = []
    inner.register_step_pre_hook(lambda opt, *_: used.append(tuple(g["lr"] for g in opt.param_groups)))
    expected = []
    for x, y in DataLoader(data, batch_sampler=sampler):
        if optimizer.micro_step == 0:  # first micro-batch of a step: what the update will use
            expected.append((optimizer.get_bs(), optimizer.current_lr()))
        assert optimizer.get_lr() == (0.1, 0.2)  # the base LRs, between updates
        nn.functional.nll_loss(model(x), y).backward()
        optimizer.step()
    plan = sampler.epoch_schedule
    assert [bs for bs, _ in expected] == plan.batch_sizes.tolist()
    assert [lr for _, lr in expected] == [0.1 * bs / 64 for bs in plan.batch_sizes.tolist()]
    assert used == [(0.1 * bs / 64, 0.2 * bs / 64) for bs in plan.batch_sizes.tolist()]
    assert optimizer.get_bs() == 0 and optimizer.current_lr() == 0.0  # past the epoch, as the original
    optimizer.set_epoch(1)
    optimizer.adapt_lr()  # by hand: the rule's LR for the current step, from the LR held now
    assert optimizer.get_lr() == pytest.approx((0.1 * optimizer.get_bs() / 64, 0.2 * optimizer.get_bs() / 64))
    optimizer.set_lr((0.1, 0.2))
    assert inner.param_groups[1]["lr"] == 0.2
    with pytest.raises(ValueError, match=r"set_lr needs one LR per param group \(2\), got 1"):
        optimizer.set_lr((0.1,))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_custom_optimizer_keeps_the_lr_and_averages_or_sums(reduction):
    """eth-easl's base class: CustomOptimizer(optimizer, sampler, log_steps, reduction)."""
    data = digits_data()
    model, reference = digits_model(), digits_model()
    sampler = CustomSampler(data, [64, 32, 96], minibatch_size=32, when_exhausted="cycle")
    optimizer = CustomOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), sampler, None, reduction)
    plain = torch.optim.SGD(reference.parameters(), lr=0.1)
    x, y = data.tensors
    for step in range(3):
        micro_batches = [b.tolist() for b in sampler.epoch_schedule.micro_batches(step, 0)]
        for xs, ys in DataLoader(data, batch_sampler=micro_batches):
            nn.functional.nll_loss(model(xs), ys).backward()
            optimizer.step()
        index = torch.as_tensor(sampler.epoch_schedule.step_indices(step))
        plain.zero_grad()
        loss = nn.functional.nll_loss(reference(x[index]), y[index])
        (loss * (len(index) // 32) if reduction == "sum" else loss).backward()  # sum of micro-batch means
        plain.step()
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="reduction must be 'mean' or 'sum', got 'max'"):
        CustomOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), sampler, reduction="max")


def test_linear_rule_momentum_warns_when_it_replaces_the_optimizers_weight_decay():
    sampler = CustomSampler(64, 32, minibatch_size=32)
    model = digits_model()
    with pytest.warns(UserWarning, match=r"replaces the wrapped optimizer's weight_decay \[0.0005\] by "
                                         r"weight_decay=0.0001"):
        LinearRuleMomentumOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=5e-4), sampler, 128)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LinearRuleMomentumOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), sampler, 128, weight_decay=5e-4)


# --- whole runs, bit for bit -------------------------------------------------------------------------

def aikit_run(cls, data, trace, epochs, replicas=1, **options):
    model = digits_model()
    with pytest.warns(TraceStepWarning, match=r"row 10, line 12: step 0"):
        sampler = CustomSampler(data, trace, 42, minibatch_size=32, permutation="torch")
    inner = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    optimizer = cls(inner, sampler, ref_batchsize=96, **options)
    history = []
    inner.register_step_post_hook(lambda *_: history.append([p.detach().clone() for p in model.parameters()]))
    for epoch in epochs:
        sampler.set_epoch(epoch)
        optimizer.set_epoch(epoch)
        for x, y in DataLoader(data, batch_sampler=sampler):
            nn.functional.nll_loss(model(x), y).backward()
            optimizer.step()
    return history


@pytest.mark.parametrize(("cls", "rule"), [(LinearRuleOptimizer, "linear"), (LinearRuleMomentumOptimizer, "momentum")])
def test_a_whole_run_is_bit_identical_to_eth_easls(tmp_path, cls, rule):
    """Five epochs of eth-easl's own trace (batches 32..512, its step column restarting) over
    digits: every update's parameters equal the original's bit for bit."""
    torch.set_num_threads(1)  # one summation order in every matmul, here and in the reference
    data = digits_data()
    trace = head_of_seed_trace(tmp_path)
    ours = aikit_run(cls, data, trace, range(5))
    model = digits_model()
    theirs = original_run(model, *data.tensors, nn.functional.nll_loss, trace, seed=42, num_replicas=1,
                          minibatch_size=32, epochs=range(5), ref_batchsize=96, rule=rule,
                          optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5))
    assert len(ours) == len(theirs) > 20
    for step, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        for p, q in zip(a, b, strict=True):
            assert torch.equal(p, q), f"update {step} differs by {(p - q).abs().max():.3g}"


def test_the_sample_order_is_part_of_the_samplers_state():
    data = digits_data()
    ours = CustomSampler(data, 64, 42, minibatch_size=32)
    theirs = CustomSampler(data, 64, 42, minibatch_size=32, permutation="torch")
    assert list(ours) != list(theirs)  # same seed, other samples: a resume must not mix them
    assert (ours.permutation, theirs.permutation) == ("numpy", "torch")
    with pytest.raises(ValueError, match=r"sampler state is for seed 42, 1 replicas and permutation 'torch', this "
                                         r"sampler has seed 42, 1 and 'numpy'"):
        ours.load_state_dict(theirs.state_dict())
