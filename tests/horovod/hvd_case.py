"""The training runs the Horovod tests compare: shared by the horovodrun workers and the tests.

A tiny float64 classifier on fixed random data. Each case is a sequence of update *windows*
(sample indices); a window shorter than the global batch is an epoch's last, partial update.
The reference trains one process on each whole window at once: the big-batch update.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from aikit.core.plan import make_plan

SAMPLES, FEATURES, CLASSES = 45, 6, 3


def data() -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.normal(size=(SAMPLES, FEATURES)), dtype=torch.float64)
    y = torch.tensor(rng.integers(0, CLASSES, size=SAMPLES))
    return x, y


class Net(torch.nn.Module):
    """A classifier with one layer no rank ever uses: it must keep no gradient (weight decay
    and momentum leave it alone), as in a single-process step. It comes first, so in the
    reverse order of the all-reduce's buckets it is last and holds back only its own."""

    def __init__(self) -> None:
        super().__init__()
        self.unused = torch.nn.Linear(2, 2)
        self.body = torch.nn.Sequential(torch.nn.Linear(FEATURES, 5), torch.nn.Tanh(), torch.nn.Linear(5, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return Net().double()


@dataclass(frozen=True)
class Case:
    """One run: global batch ``G``, max micro-batch ``M``, window lengths, optimizer settings."""

    name: str
    G: int
    M: int
    windows: tuple[int, ...]
    declare_samples: bool  # accumulate(samples=...) (exact for ragged micro-batches) or plain steps
    optimizer: str
    max_grad_norm: float | None = None
    scheduler: bool = False
    reduction: str = "mean"  # of the loss and of the GA wrapper ("sum": Run:AI's AIkit's arithmetic)
    bucket_cap_mb: float | None = 25.0  # the overlapped all-reduce's buckets (None: one all-reduce)
    split_backward: bool = False  # two backward calls per micro-batch (its two halves)
    straggler: bool = False  # rank 1 starts each update's last micro-step late: nothing is summed before it
    poisoned: int | None = None  # this window's first micro-batch on the last rank has a NaN loss: every rank skips it

    def window_indices(self) -> list[np.ndarray]:
        """The windows' sample indices: consecutive pieces of one fixed permutation per pass."""
        order, out, start, epoch = np.random.default_rng([1, 0]).permutation(SAMPLES), [], 0, 0
        for length in self.windows:
            if start + length > SAMPLES:
                epoch += 1
                order, start = np.random.default_rng([1, epoch]).permutation(SAMPLES), 0
            out.append(order[start : start + length])
            start += length
        return out

    def inner(self, net: torch.nn.Module) -> tuple[torch.optim.Optimizer, object]:
        if self.optimizer == "sgd":
            opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
        else:
            opt = torch.optim.AdamW(net.parameters(), lr=0.05, weight_decay=0.01)
        scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5) if self.scheduler else None
        return opt, scheduler


# 104-byte buckets: two float64 parameters each ([bias, weight] of body.2, of body.0, of unused),
# so the first two start from the last backward's hooks, the third (no gradient) at step()
PAIRS_MB = 1e-4
BUCKETS, STARTED_EARLY = 3, 2

CASES = (
    # G=11 over 2 ranks with at most 3 each: micro-batches [3, 3] then [3, 2]. Windows of 4 (only
    # the first GA step runs, then flush()) and of 8 (rank 1 has nothing in the second step).
    Case("ragged-sgd-clip", 11, 3, (11, 11, 4, 11, 8), True, "sgd", max_grad_norm=0.3),
    Case("ragged-adamw-sched", 11, 3, (11, 4, 11, 11, 8), True, "adamw", scheduler=True),
    # G=12: [3, 3] twice, no samples declared; the window of 6 is one GA step, then flush().
    Case("equal-sgd", 12, 3, (12, 6, 12, 12), False, "sgd"),
    # the same with a summed loss and reduction="sum": every update (the flushed one too) is the window's sum
    Case("equal-sgd-sum", 12, 3, (12, 6, 12, 12), False, "sgd", reduction="sum"),
    # the overlapped all-reduce in small buckets, and the same run with one all-reduce after the backward
    Case("ragged-sgd-clip-buckets", 11, 3, (11, 11, 4, 11, 8), True, "sgd", max_grad_norm=0.3,
         bucket_cap_mb=PAIRS_MB, straggler=True),
    Case("ragged-sgd-clip-one-all-reduce", 11, 3, (11, 11, 4, 11, 8), True, "sgd", max_grad_norm=0.3,
         bucket_cap_mb=None),
    # a second backward after the buckets started: every replica sums the final gradients again
    Case("equal-adamw-two-backwards", 12, 3, (12, 6, 12, 12), False, "adamw", scheduler=True,
         bucket_cap_mb=PAIRS_MB, split_backward=True),
    # a NaN gradient on one rank: the summed gradient is NaN on every rank, and every rank skips the update
    Case("ragged-adamw-nan-on-one-rank", 11, 3, (11, 11, 4, 11), True, "adamw", max_grad_norm=0.3, scheduler=True,
         poisoned=1),
)

# the Horovod elastic run (2 -> 1 -> 2 workers): G=11 in [3, 3] + [3, 2] on 2 workers, [3, 3, 3, 2] on 1
ELASTIC = Case("elastic-ragged-sgd-clip", 11, 3, (11,) * 30, True, "sgd", max_grad_norm=0.3)


def reference(case: Case, seed: int = 100) -> list[torch.Tensor]:
    """One process, one real step per window on all its samples at once."""
    x, y = data()
    net = model(seed)
    opt, scheduler = case.inner(net)
    for number, window in enumerate(case.window_indices()):
        if number == case.poisoned:
            continue  # skipped: no update, no scheduler step
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x[window]), y[window], reduction=case.reduction).backward()
        if case.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(net.parameters(), case.max_grad_norm)
        opt.step()
        if scheduler is not None:
            scheduler.step()
    return [p.detach().clone() for p in net.parameters()]


def train(case: Case, engine: str = "horovod") -> dict:
    """Train ``case`` on this rank with aikit's reduce-at-update GA: Horovod's DistributedOptimizer
    (hvd.init() done by the caller), or ``Optimizer(reduce=True)`` under torchrun without DDP."""
    import aikit.elastic
    import aikit.elastic.Torch
    from aikit.core.plan import micro_batch_slices
    from aikit.elastic.Torch import distributed
    from aikit.ga.Torch.optim import Optimizer
    from aikit.runtime.Torch.collectives import broadcast_

    rank = distributed.rank()
    plan = aikit.elastic.Torch.init(case.G, case.M)
    x, y = data()
    net = model(seed=100 + rank)  # ranks start apart: the broadcast must make them equal
    inner, scheduler = case.inner(net)
    options = {"max_grad_norm": case.max_grad_norm, "bucket_cap_mb": case.bucket_cap_mb, "reduction": case.reduction}
    if engine == "horovod":
        from aikit.elastic.Torch import horovod

        optimizer = horovod.DistributedOptimizer(inner, aikit.elastic.Torch.steps, **options)
        horovod.broadcast_state(net, optimizer)
    else:
        optimizer = Optimizer(inner, aikit.elastic.Torch.steps, reduce=True, **options)
        with torch.no_grad():
            broadcast_(list(net.state_dict().values()))
    mine, whole = micro_batch_slices(plan, rank), micro_batch_slices(plan)
    early = []  # per update ended by step(): buckets whose all-reduce started before that step()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for number, window in enumerate(case.window_indices()):
            for micro, (step_slice, my_slice) in enumerate(zip(whole, mine, strict=True)):
                if step_slice.start >= len(window):
                    break  # no rank has a sample in this GA step of the short window
                idx = window[my_slice]  # clipped to the window: a short window leaves some ranks less
                declared = (optimizer.accumulate(net, samples=len(idx)) if case.declare_samples
                            else contextlib.nullcontext())
                if case.straggler and rank == 1 and optimizer.sync_gradients:
                    time.sleep(0.2)  # rank 0 reaches step() first: it must wait for the sums
                with declared:
                    halves = np.array_split(idx, 2) if case.split_backward else [idx]
                    for part in (h for h in halves if len(h)):  # each half's share of the micro-batch mean
                        share = 1 if case.reduction == "sum" else len(part) / len(idx)
                        loss = torch.nn.functional.cross_entropy(net(x[part]), y[part], reduction=case.reduction)
                        if (number, micro, rank) == (case.poisoned, 0, distributed.world_size() - 1):
                            loss = loss * float("nan")
                        (loss * share).backward()
                if optimizer.sync_gradients and optimizer.engine.buckets is not None:
                    early.append(len(optimizer.engine.buckets.started))
                optimizer.step()
                if optimizer.updated and scheduler is not None:
                    scheduler.step()
            if optimizer.flush() and scheduler is not None:
                scheduler.step()
    assert optimizer.micro_step == 0
    return {
        "params": [p.detach().clone() for p in net.parameters()],
        "plan": {name: getattr(aikit.elastic, name) for name in aikit.elastic.PUBLIC},
        "inner_steps": max((int(s.get("step", 0)) for s in inner.state.values()), default=0),
        "started_early": early,
        "warnings": [str(w.message) for w in caught],
        "skipped": optimizer.skipped,
        "applied": optimizer.applied,
    }


def expected_early(case: Case, rank: int, world: int = 2) -> list[int]:
    """For each update of ``case`` (in PAIRS_MB buckets) that ``step()`` ends on ``rank``: how many
    buckets start their all-reduce during the last backward: STARTED_EARLY when the rank has
    samples in the last GA step, none when it sits it out."""
    plan = make_plan(case.G, case.M, world)
    last = plan.steps - 1
    before = sum(plan.size(s, d) for s in range(last) for d in range(world))  # samples ahead of the last step
    mine = before + sum(plan.size(last, d) for d in range(rank))  # where this rank's last micro-batch starts
    return [STARTED_EARLY if mine < length and plan.size(last, rank) else 0
            for length in case.windows if before < length]  # shorter windows end in flush()


# --- the checks of both engines' runs (tests/horovod/test_horovod_ga.py and tests/torch/test_reduce_at_update.py
# import them; each module's ``ranks`` fixture holds its engine's results) --------------------------------
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_two_ranks_with_ga_equal_the_big_batch_step(ranks, case):
    expected = reference(case)
    for rank in ranks:
        for got, want in zip(rank[case.name]["params"], expected, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


def test_the_wrapped_optimizer_steps_once_per_window(ranks):
    case = next(c for c in CASES if c.optimizer == "adamw")
    assert [r[case.name]["inner_steps"] for r in ranks] == [len(case.windows)] * 2


def test_the_overlapped_all_reduce_gives_the_bits_of_one_all_reduce_after_the_backward(ranks):
    for rank in ranks:
        for a, b in zip(rank["ragged-sgd-clip-buckets"]["params"], rank["ragged-sgd-clip-one-all-reduce"]["params"],
                        strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("case", [c for c in CASES if c.bucket_cap_mb == PAIRS_MB], ids=lambda c: c.name)
def test_buckets_start_their_all_reduce_during_the_last_backward(ranks, case):
    """Every bucket whose gradients are final is on the wire before step(); an idle rank starts
    all of them in step(), and a parameter without gradient holds back only its own bucket."""
    assert [r[case.name]["started_early"] for r in ranks] == [expected_early(case, rank) for rank in range(2)]


def test_a_nan_gradient_on_one_rank_skips_the_update_on_every_rank(ranks):
    """The check reads the summed gradient's norm, the same on every rank: every rank skips (the
    parameters equal the reference that leaves the window out: the test above), counts and warns."""
    case = next(c for c in CASES if c.poisoned is not None)
    for rank in ranks:
        result = rank[case.name]
        assert (result["skipped"], result["applied"]) == (1, len(case.windows) - 1)
        assert [w for w in result["warnings"] if w.startswith("aikit skipped an update")] == [
            w for w in result["warnings"] if "total norm nan" in w]
        assert len([w for w in result["warnings"] if "total norm nan" in w]) == 1
    for other in CASES:
        if other is not case:
            assert all(r[other.name]["skipped"] == 0 for r in ranks)


def test_a_second_backward_after_the_buckets_started_is_summed_and_said(ranks):
    for rank in ranks:
        for case in CASES:
            warned = [w for w in rank[case.name]["warnings"] if "gives up the overlap" in w]
            assert len(warned) == (1 if case.split_backward else 0), (case.name, rank[case.name]["warnings"])
