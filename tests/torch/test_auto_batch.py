"""``init(G, "auto", trial=step)`` and ``AutoBatch`` (issue 38): the largest per-device batch that
fits, found by the allocator truly failing (a subprocess under ``RLIMIT_AS``: auto_batch_case.py),
the global batch kept through the search and through an out-of-memory error mid-training, and
the refusals of bad input."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import aikit.elastic.Torch as elastic
from aikit.core.errors import InvalidType, InvalidValue
from aikit.core.plan import make_plan
from aikit.ga.Torch.optim import Optimizer

CASE = Path(__file__).with_name("auto_batch_case.py")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc: Linux")


def run_case(name: str) -> dict:
    done = subprocess.run([sys.executable, str(CASE), name], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(Path(__file__).parents[2]), "PATH": "/usr/bin:/bin",
                               # a fixed mmap threshold: glibc's moving one keeps freed memory mapped, as slack
                               "MALLOC_MMAP_THRESHOLD_": "65536"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]) | {"log": done.stderr}


def test_the_search_finds_the_largest_device_batch_that_fits_and_a_longer_window_re_plans_with_nothing_lost():
    found = run_case("search")
    g, steps, device_batch, _ = found["plan"]
    assert g == 48 and device_batch < g and steps == -(-g // device_batch)  # the global batch kept, GA steps from it
    tries = dict(map(tuple, found["tries"]))
    assert tries[device_batch] and not any(fits for size, fits in tries.items() if size > device_batch)
    assert any(not fits for fits in tries.values())  # the allocator truly failed
    assert f"auto batch: per-device batch {device_batch} fits ({len(tries)} tries in" in found["log"]
    replans = found["replans"]  # (update, device batch, new): the long window (update 2) did not fit
    assert replans and {u for u, _, _ in replans} <= {0, 2} and 2 in {u for u, _, _ in replans}
    assert all(new < old for _, old, new in replans) and found["final"] == replans[-1][2]
    assert "DefaultCPUAllocator: can't allocate memory" in found["said"]
    assert found["updates"] == 4
    assert found["same"] is True or found["same"] < 1e-12  # every window's samples once: the big-batch SGD step


def test_a_search_where_nothing_fits_names_the_memory_it_tried():
    found = run_case("nothing_fits")
    assert found["error"] == "OutOfMemory"
    message = found["message"]
    assert "even per-device batch 1 ran out of memory" in message and "you tried to allocate" in message
    assert "RLIMIT_AS" in message and "48 out of memory" in message and "give max_device_batch a number" in message


def test_candidates_that_cannot_make_the_global_batch_are_refused_with_those_that_can():
    with pytest.raises(InvalidValue, match=r"candidates \[20\] cannot make global batch 50 .*policy 'error'.*"
                                           r"divides it: 50, 25, 10, 5, 2, 1, \.\.\.\): use those, or a global batch "
                                           r"near 50 such as 48 or 51, or policy 'ragged'"):
        elastic.init(50, "auto", policy="error", trial=lambda batch: None, candidates=[20, 10])


def test_auto_needs_a_trial_and_a_number_takes_none():
    with pytest.raises(InvalidType, match="needs trial="):
        elastic.init(48, "auto")
    with pytest.raises(InvalidValue, match="trial= and candidates= are for max_device_batch='auto'"):
        elastic.init(48, 16, trial=lambda batch: None)


def test_an_error_that_is_not_out_of_memory_is_raised_as_it_is():
    def trial(batch: int) -> None:
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        elastic.init(48, "auto", trial=trial)


def test_the_candidates_tried_are_plans_of_the_global_batch_largest_first():
    tried = []
    plan = elastic.init(48, "auto", trial=lambda batch: tried.append(batch) or batch <= 10)
    assert tried == [48] and plan.steps == 1  # 48 did not fail: it fits
    sizes = []

    def trial(batch: int) -> None:
        sizes.append(batch)
        if batch > 10:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    plan = elastic.init(48, "auto", trial=trial)
    assert plan.device_batch == 10 and plan.steps == 5 and plan.global_batch_size == 48
    assert sizes[:3] == [48, 24, 12] and set(sizes) <= {48, 24, 16, 12, 10, 8, 7, 6, 5, 4, 3, 2, 1}


def test_a_resumed_run_whose_saved_device_batch_no_longer_fits_says_so_once(caplog):
    net = torch.nn.Linear(2, 1)
    plan = make_plan(48, 12, 1)
    auto = elastic.AutoBatch(Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 4, global_batch_size=48), net,
                             plan)
    with caplog.at_level(logging.WARNING, logger="aikit.elastic"):
        auto.load_state_dict({"device_batch": 24})
        auto.load_state_dict({"device_batch": 12})
    (said,) = [r.getMessage() for r in caplog.records]
    assert "saved at per-device batch 24, which no longer fits here: re-planned to 4 GA steps of 12" in said
    assert auto.plan == plan and auto.state_dict() == {"device_batch": 12}


def test_auto_batch_needs_the_ga_optimizer_with_the_global_batch():
    net = torch.nn.Linear(2, 1)
    with pytest.raises(InvalidValue, match="global_batch_size=48"):
        elastic.AutoBatch(Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), 4), net, make_plan(48, 12, 1))


def test_replicas_with_different_memory_agree_on_the_smallest_size_any_found(torchrun, tmp_path, monkeypatch):
    """Two gloo processes under torchrun, rank 1 with less memory (a real RLIMIT_AS each): both
    get the same plan of the global batch, at the size rank 1 could run."""
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")  # as run_case: freed memory unmapped, no slack
    torchrun(CASE.with_name("auto_batch_replicas.py"), tmp_path, timeout=120)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["plan"] == ranks[1]["plan"]  # one plan: the same GA steps and micro-batches on both
    g, steps, device_batch = ranks[0]["plan"]
    assert g == 48 and steps == -(-g // (2 * device_batch))
    assert ranks[1]["own"] < ranks[0]["own"], ranks  # the limits truly differ
    assert device_batch == ranks[1]["own"]  # the smallest any replica found


def test_auto_written_otherwise_and_a_bad_candidate_are_named():
    with pytest.raises(InvalidValue, match=r"max_device_batch='AUTO': write max_device_batch='auto' \(lower case"):
        elastic.init(48, "AUTO", trial=lambda batch: None)
    with pytest.raises(InvalidValue, match=r"candidates\[1\] must be a positive integer, got 0"):
        elastic.init(48, "auto", trial=lambda batch: None, candidates=[24, 0])


def found_86(batch: int) -> None:
    """A trial that runs out of memory above 86 per device: 256's plans try 256, 128, 86 ..."""
    if batch > 86:
        raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {batch} MiB")


def test_a_ragged_plan_found_by_auto_is_refused_to_a_loop_that_declares_no_samples():
    """Issue 47: init(256, "auto") found 86 (86/85/85 per update) and docs/torch.md's basic loop,
    DataLoader(batch_size=aikit.elastic.Torch.batch_size) with equal micro-steps, trained 258, 258,
    258, 250 samples per update without a word. The GA wrapper now refuses such an update by name,
    nothing applied; the loop that declares the plan's micro-batches trains the big-batch step."""
    plan = elastic.init(256, "auto", trial=found_86)
    assert plan.micro_batch_sizes == ((86,), (85,), (85,)) and elastic.batch_size == 86
    torch.manual_seed(0)
    x, y = torch.randn(1024, 4, dtype=torch.float64), torch.randn(1024, 1, dtype=torch.float64)
    net = torch.nn.Linear(4, 1).double()
    start = [p.detach().clone() for p in net.parameters()]
    optimizer = Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), elastic.steps)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=elastic.batch_size)
    with pytest.raises(InvalidValue) as refused:
        for xb, yb in loader:  # docs/torch.md's basic loop
            torch.nn.functional.mse_loss(net(xb), yb).backward()
            optimizer.step()
    assert str(refused.value).startswith(
        "the plan of aikit.elastic.Torch.init is ragged (global batch 256 as 86, 85, 85 per GA step), but this "
        "update's 3 micro-steps declared no samples, so each weighs 1/3: not the plan's update (a loader of "
        "batch_size 86 trains 258 samples per update). Feed each window of 256 samples as micro_batch_slices(plan)")
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), start, strict=True))  # nothing applied
    assert all(p.grad is None for p in net.parameters()) and optimizer.applied == 0

    from aikit.core.plan import micro_batch_slices

    optimizer = Optimizer(torch.optim.SGD(net.parameters(), lr=0.1), elastic.steps)
    reference = torch.nn.Linear(4, 1).double()
    reference.load_state_dict(net.state_dict())
    big = torch.optim.SGD(reference.parameters(), lr=0.1)
    for update in range(len(x) // plan.global_batch_size):  # "When the batch must change": every window's samples
        window = slice(update * plan.global_batch_size, (update + 1) * plan.global_batch_size)
        for piece in micro_batch_slices(plan):
            xb, yb = x[window][piece], y[window][piece]
            with optimizer.accumulate(net, samples=len(xb)):
                torch.nn.functional.mse_loss(net(xb), yb).backward()
            optimizer.step()
        big.zero_grad()
        torch.nn.functional.mse_loss(reference(x[window]), y[window]).backward()
        big.step()
    assert optimizer.applied == 4
    for got, want in zip(net.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
