"""An update AMP skipped advances nothing that counts updates (issue 38), whatever counts them.

CPU autocast (fp16 and bf16) with a GradScaler that overflows: ``first``, its initial scale is
enormous, so the first updates' scaled gradients overflow and the scaler skips them, halving its
scale until they fit (before the optimizer holds state); ``alternate``, every update applied
grows the scale to one that overflows and the skip takes it back (every other update skipped,
a fused optimizer's inside its kernel). Run A trains every window so; run B trains only the
windows whose update A applied, at the scale A applied them at. A skipped update changes nothing
(it spent its samples, nothing else), so A and B end equal, to the bit: weights, the wrapped
optimizer's step count, an ``UpdateScheduler``'s LR, a trace optimizer's position in its warmup,
AutoLRS's search. With non-fused and fused AdamW
and SGD (torch 2.13's fused CPU kernels, which take the inf flag as a tensor and skip in the
kernel). Also: the adaptive controller decides nothing on a skipped update, an LR finder records
no point for one, ``ElasticState`` restores the count of real updates, and what each path reads
from the device per update.
"""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils.data import DataLoader, TensorDataset

from aikit.autolrs.Torch import AutoLRS
from aikit.core.errors import NonFiniteGradientWarning, TrainingFailed
from aikit.elastic.Torch import AdaptiveOptimizer, AdaptiveSampler, CustomSampler, ElasticState, LinearRuleOptimizer
from aikit.ga.Torch.optim import Optimizer, UpdateScheduler
from aikit.lr_finder.Torch import LRFinder

# enormous: fp16's largest is 65504 (the backward overflows in fp16 until the scale is about 2**15);
# bf16 has float32's range, so there the scale times the first gradients overflows float32 (later,
# smaller gradients may not: the pattern 'alternate' runs in fp16 only)
SCALES = {torch.float16: 2.0**30, torch.bfloat16: 2.0**127}
FITS = 2.0**4  # a scale under which no gradient here overflows
AUTOLRS_WINDOWS = 64
WINDOWS, MICRO, STEPS = 24, 4, 2
AUTOLRS = {"tau": 8, "tau_max": 8, "trial_ratio": 2, "trials": 2, "warmup_steps": 2, "warmup_lr": 0.01, "seed": 3}
DTYPES = pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
# when the skips come: "first" before the optimizer holds state, "alternate" every other update after it
PATTERNS = pytest.mark.parametrize("dtype, pattern", [(torch.float16, "first"), (torch.bfloat16, "first"),
                                                      (torch.float16, "alternate")],
                                   ids=["fp16-first", "bf16-first", "fp16-alternate"])
FUSED = pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
INNER = pytest.mark.parametrize("inner", ["AdamW", "SGD"])


def inner_optimizer(name: str, params, fused: bool) -> torch.optim.Optimizer:
    if name == "AdamW":
        return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, fused=fused)
    return torch.optim.SGD(params, lr=1e-2, momentum=0.9, fused=fused)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))


def data(samples: int = WINDOWS * MICRO * STEPS) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(samples, 4, generator=gen)
    return x, x.sum(1, keepdim=True).sin() + 3.0  # a loss about 10 at the start


def loss_of(net: nn.Module, x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    with torch.autocast("cpu", dtype=dtype):
        out = net(x)
    return nn.functional.mse_loss(out.float(), y)


def steps_of(inner: torch.optim.Optimizer) -> set[int]:
    """The wrapped optimizer's step count (AdamW keeps one per parameter; SGD none)."""
    return {int(state["step"]) for state in inner.state.values() if "step" in state}


def windows(count: int = WINDOWS) -> list[tuple[torch.Tensor, torch.Tensor]]:
    x, y = data(count * MICRO * STEPS)
    return list(zip(x.split(MICRO * STEPS), y.split(MICRO * STEPS), strict=True))


def overflowing(dtype: torch.dtype, pattern: str) -> torch.amp.GradScaler:
    """Run A's scaler. ``first``: an enormous initial scale, so the first updates overflow (before
    the optimizer holds state: a fused one is read as a plain one, see aikit.runtime.Torch.amp);
    ``alternate``: a scale that fits, grown after every update applied to one that overflows and
    taken back by the skip, so every other update is skipped, the fused ones inside the kernel."""
    if pattern == "first":
        return torch.amp.GradScaler("cpu", init_scale=SCALES[dtype])
    growth = SCALES[dtype] / FITS
    return torch.amp.GradScaler("cpu", init_scale=FITS, growth_factor=growth, backoff_factor=1 / growth,
                                growth_interval=1)


def replaying(a: torch.amp.GradScaler, pattern: str) -> torch.amp.GradScaler:
    """Run B's scaler: the scale A applied its updates at, held."""
    return torch.amp.GradScaler("cpu", init_scale=a.get_scale() if pattern == "first" else FITS,
                                growth_interval=2**30)


def applied_windows(updated: list[bool], pattern: str) -> list[int]:
    """The windows whose update was applied, checked to follow ``pattern`` (and to skip some)."""
    applied = [i for i, u in enumerate(updated) if u]
    if pattern == "first":
        assert applied[0] >= 1 and applied == list(range(applied[0], len(updated))), updated
    else:
        assert applied == list(range(0, len(updated), 2)), updated
    return applied


def ga_run(inner_name: str, fused: bool, dtype: torch.dtype, scaler: torch.amp.GradScaler,
           kept: list[int] | None = None):
    """The GA wrapper over ``inner_name`` with an UpdateScheduler (an LR halving every 4 updates),
    trained on the windows ``kept`` (all by default); returns what it ended with."""
    net = model()
    inner = inner_optimizer(inner_name, net.parameters(), fused)
    optimizer = Optimizer(inner, STEPS, scaler=scaler)
    scheduler = UpdateScheduler(torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5))
    updated, all_windows = [], windows()
    for i in range(WINDOWS) if kept is None else kept:
        x, y = all_windows[i]
        for xm, ym in zip(x.split(MICRO), y.split(MICRO), strict=True):
            scaler.scale(loss_of(net, xm, ym, dtype)).backward()
            optimizer.step()
            scheduler.step()
        updated.append(optimizer.updated)
    return {"net": net, "inner": inner, "scaler": scaler, "optimizer": optimizer, "scheduler": scheduler,
            "updated": updated}


def assert_same_weights(a: nn.Module, b: nn.Module) -> None:
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)


@PATTERNS
@FUSED
@INNER
def test_a_skipped_update_advances_no_step_count_and_no_update_scheduler(inner, fused, dtype, pattern):
    a = ga_run(inner, fused, dtype, overflowing(dtype, pattern))
    kept = applied_windows(a["updated"], pattern)
    b = ga_run(inner, fused, dtype, replaying(a["scaler"], pattern), kept)
    assert all(b["updated"])
    assert_same_weights(a["net"], b["net"])  # the skipped updates changed nothing
    applied = len(kept)
    assert (a["optimizer"].applied, a["optimizer"].skipped) == (applied, WINDOWS - applied)
    assert a["scheduler"].last_epoch == b["scheduler"].last_epoch == applied
    assert a["inner"].param_groups[0]["lr"] == b["inner"].param_groups[0]["lr"] == 1e-2 * 0.5 ** (applied // 4)
    assert steps_of(a["inner"]) == steps_of(b["inner"]) == ({applied} if inner == "AdamW" else set())


def trace_run(fused: bool, dtype: torch.dtype, scaler: torch.amp.GradScaler, kept: list[int] | None = None):
    """A LinearRuleOptimizer (warmup over 6 updates, fused or not AdamW) through a trace of the
    windows ``kept`` (all by default); returns what it ended with and the LR of every update applied."""
    kept = list(range(WINDOWS)) if kept is None else kept
    net = model()
    inner = inner_optimizer("AdamW", net.parameters(), fused)
    x, y = data()
    size = MICRO * STEPS
    sampler = CustomSampler(len(kept) * size, [size] * len(kept), micro_batch=MICRO, shuffle=False)
    optimizer = LinearRuleOptimizer(inner, sampler, ref_batch_size=size // 2, warmup_steps=6, scaler=scaler)
    lrs = []
    inner.register_step_pre_hook(lambda *_: lrs.append(inner.param_groups[0]["lr"]))
    sampler.set_epoch(0)
    optimizer.set_epoch(0)
    updated = []
    for indices in sampler:
        indices = torch.as_tensor(indices)
        indices = torch.as_tensor(kept)[indices // size] * size + indices % size  # the sample in its window
        scaler.scale(loss_of(net, x[indices], y[indices], dtype)).backward()
        if optimizer.step():
            updated.append(optimizer.updated)
    return {"net": net, "optimizer": optimizer, "scaler": scaler, "lrs": lrs, "updated": updated, "inner": inner}


@PATTERNS
@FUSED
def test_a_skipped_update_advances_no_trace_position_warmup_or_lr(fused, dtype, pattern):
    a = trace_run(fused, dtype, overflowing(dtype, pattern))
    kept = applied_windows(a["updated"], pattern)
    b = trace_run(fused, dtype, replaying(a["scaler"], pattern), kept)
    assert_same_weights(a["net"], b["net"])
    applied_lrs = a["lrs"] if not fused or pattern == "first" else a["lrs"][::2]  # a fused kernel runs on a skip
    assert applied_lrs == b["lrs"]  # the warmup went on at the updates applied, not at those tried
    assert b["lrs"][0] == 1e-2 * (1 + (2 - 1) / 6)  # its first step, ref 8 -> batch 16 at 1/6 of the warmup
    assert a["optimizer"].updates == b["optimizer"].updates == len(kept)
    assert (a["optimizer"].applied, a["optimizer"].skipped) == (len(kept), WINDOWS - len(kept))
    assert steps_of(a["inner"]) == {len(kept)}


def autolrs_run(fused: bool, dtype: torch.dtype, scaler: torch.amp.GradScaler, kept: list[int] | None = None):
    """AutoLRS (a short search: warmup, trials with restores) over the GA wrapper (one
    micro-batch per update) under AMP, called after every update, skipped or not."""
    net = model()
    inner = inner_optimizer("AdamW", net.parameters(), fused)
    optimizer = Optimizer(inner, 1, scaler=scaler)
    xv, yv = data(32)

    def val_fn() -> float:
        with torch.no_grad():
            return float(loss_of(net, xv, yv, dtype))

    autolrs = AutoLRS(net, optimizer, val_fn, 1e-4, 1e-1, **AUTOLRS)
    lrs, updated, all_windows = [], [], windows(count=AUTOLRS_WINDOWS)
    for i in range(AUTOLRS_WINDOWS) if kept is None else kept:
        x, y = all_windows[i]
        scaler.scale(loss_of(net, x, y, dtype)).backward()
        optimizer.step()
        updated.append(optimizer.updated)
        lrs.append(inner.param_groups[0]["lr"]) if optimizer.updated else None
        autolrs.on_train_batch_end(loss_of(net, x, y, dtype).detach())
    return {"net": net, "autolrs": autolrs, "scaler": scaler, "optimizer": optimizer, "lrs": lrs,
            "updated": updated}


@PATTERNS
@FUSED
def test_a_skipped_update_advances_no_autolrs_stage(fused, dtype, pattern):
    a = autolrs_run(fused, dtype, overflowing(dtype, pattern))
    kept = applied_windows(a["updated"], pattern)
    b = autolrs_run(fused, dtype, replaying(a["scaler"], pattern), kept)
    assert b["optimizer"].skipped == 0
    assert a["lrs"] == b["lrs"]  # every applied update at the LR the search gave it, in the same order
    history = [(r.step, r.phase, r.lr, r.loss) for r in a["autolrs"].controller.history]
    assert history == [(r.step, r.phase, r.lr, r.loss) for r in b["autolrs"].controller.history]
    assert {r.phase for r in a["autolrs"].controller.history} >= {"warmup", "trial", "train"}
    assert_same_weights(a["net"], b["net"])


def test_autolrs_ignores_a_step_that_made_no_update_of_a_plain_or_an_accelerated_optimizer():
    net = model()
    inner = torch.optim.SGD(net.parameters(), lr=1e-2)
    autolrs = AutoLRS(net, inner, lambda: 1.0, 1e-4, 1e-1, **AUTOLRS)
    before = autolrs.controller.state_dict()
    inner.step_was_skipped = True  # what Accelerate's AcceleratedOptimizer says after AMP skipped its step
    autolrs.on_train_batch_end(2.0)
    assert autolrs.controller.state_dict() == before
    inner.step_was_skipped = False
    autolrs.on_train_batch_end(2.0)
    assert autolrs.controller.state_dict() != before


def test_an_adaptive_run_decides_nothing_on_a_skipped_update(monkeypatch):
    dtype = torch.float16
    x, y = data(512)
    net = model()
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALES[dtype])
    sampler = AdaptiveSampler(len(x), ref_batch_size=16, max_batch=64, micro_batch=4, seed=5, interval=1,
                              min_estimates=0, decay=0.0)
    optimizer = AdaptiveOptimizer(torch.optim.SGD(net.parameters(), lr=1e-2), sampler, "linear", scaler=scaler)
    proposals, updated = [], []
    propose = sampler.controller.propose
    monkeypatch.setattr(sampler.controller, "propose", lambda: proposals.append(len(updated)) or propose())
    sampler.set_epoch(0)
    optimizer.set_epoch(0)
    for indices in DataLoader(range(len(x)), batch_sampler=sampler):
        scaler.scale(loss_of(net, x[indices], y[indices], dtype)).backward()
        if optimizer.step():
            updated.append(optimizer.updated)
            if len(updated) == 30:
                break
    skips = applied_windows(updated, "first")[0]
    assert proposals == list(range(skips, 30))  # a decision after every applied update (its index), none after a skip
    assert sampler.controller.noise.updates == 30 - skips  # no noise estimate from a skipped update
    assert len(optimizer.history) == 30  # every update's row: the skipped ones' samples were spent
    assert len(sampler.controller.batches) == 30  # and the trace holds them, replayable


@DTYPES
@FUSED
def test_an_lr_finder_records_no_point_for_a_skipped_update(fused, dtype):
    net = model()
    inner = inner_optimizer("AdamW", net.parameters(), fused)
    stepped = []
    inner.register_step_post_hook(lambda *_: stepped.append(inner.param_groups[0]["lr"]))
    optimizer = Optimizer(inner, 2, scaler=torch.amp.GradScaler("cpu", init_scale=SCALES[dtype]))
    x, y = data()
    finder = LRFinder(net, optimizer, nn.MSELoss(), amp_backend="torch",
                      amp_config={"device_type": "cpu", "dtype": dtype})
    finder.range_test(DataLoader(TensorDataset(x, y), batch_size=MICRO), start_lr=1e-5, end_lr=1e-2, num_iter=6,
                      progress_bar=False, diverge_th=float("inf"))
    assert optimizer.skipped >= 1 and optimizer.applied == 6  # the skipped updates made again, at their LR
    assert len(finder.history["lr"]) == 6 and finder.history["lr"] == sorted(set(finder.history["lr"]))
    assert all(loss < 100 for loss in finder.history["loss"])
    if not fused:  # a fused kernel is called on a skip too (and skips inside)
        assert stepped == pytest.approx(finder.history["lr"], rel=1e-12)


@FUSED
def test_an_lr_finder_over_a_plain_optimizer_records_no_point_for_a_skipped_update(fused):
    """The same without GA: the finder's own GradScaler step (one read per point)."""
    net = model()
    inner = inner_optimizer("AdamW", net.parameters(), fused)
    stepped = []  # the skips come first, before a fused optimizer holds state: its step() not called either
    inner.register_step_post_hook(lambda *_: stepped.append(inner.param_groups[0]["lr"]))
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALES[torch.float16])
    x, y = data()
    finder = LRFinder(net, inner, nn.MSELoss(), amp_backend="torch", grad_scaler=scaler,
                      amp_config={"device_type": "cpu", "dtype": torch.float16})
    finder.range_test(DataLoader(TensorDataset(x, y), batch_size=MICRO), start_lr=1e-5, end_lr=1e-2, num_iter=6,
                      progress_bar=False, diverge_th=float("inf"))
    assert scaler.get_scale() < SCALES[torch.float16]  # some updates overflowed and were skipped
    assert len(finder.history["lr"]) == 6 and finder.history["lr"] == sorted(set(finder.history["lr"]))
    assert stepped == pytest.approx(finder.history["lr"], rel=1e-12)  # each point an update applied at its LR
    assert all(loss < 100 for loss in finder.history["loss"])


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
def test_elastic_state_commits_and_restores_only_real_updates(tmp_path, fused):
    """A commit after the skipped updates holds the updates applied (the warmup clock), the scheduler
    and the scaler: the restored run goes on exactly as the uninterrupted one."""
    dtype = torch.float16
    uninterrupted = trace_run(fused, dtype, overflowing(dtype, "first"))
    skips = applied_windows(uninterrupted["updated"], "first")[0]

    def build():
        net = model()
        inner = inner_optimizer("AdamW", net.parameters(), fused)
        scaler = torch.amp.GradScaler("cpu", init_scale=SCALES[dtype])
        sampler = CustomSampler(WINDOWS * MICRO * STEPS, [MICRO * STEPS] * WINDOWS, micro_batch=MICRO,
                                shuffle=False)
        optimizer = LinearRuleOptimizer(inner, sampler, ref_batch_size=MICRO * STEPS // 2, warmup_steps=6,
                                        scaler=scaler)
        state = ElasticState(tmp_path, model=net, optimizer=optimizer, scaler=scaler, verbose=False)
        return net, sampler, optimizer, scaler, state

    x, y = data()
    net, sampler, optimizer, scaler, state = build()
    state.restore()
    sampler.set_epoch(0)
    optimizer.set_epoch(0)
    for indices in sampler:
        scaler.scale(loss_of(net, x[indices], y[indices], dtype)).backward()
        if optimizer.step() and optimizer.step_index == skips + 3:
            state.commit()  # three real updates after the skips
            break
    assert optimizer.updates == 3 and optimizer.skipped == skips
    net, sampler, optimizer, scaler, state = build()
    assert state.restore()
    assert optimizer.updates == 3 and scaler.get_scale() == uninterrupted["scaler"].get_scale()
    for indices in sampler:
        scaler.scale(loss_of(net, x[indices], y[indices], dtype)).backward()
        optimizer.step()
    assert optimizer.updates == WINDOWS - skips
    assert_same_weights(net, uninterrupted["net"])


# --- what the skip costs: reads from the device per update ---------------------------------------------

_READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__")
_COUNTED = (str(Path(__import__("aikit").__file__).parent), str(Path(torch.amp.__file__).parent))


class HostReads(TorchFunctionMode):
    """Counts the reads of a tensor's value on the host made by aikit or torch.amp (not those an
    optimizer's own Python makes of its CPU step counters)."""

    def __init__(self) -> None:
        super().__init__()
        self.where: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in _READS:
            caller = sys._getframe(1)
            if caller.f_code.co_filename.startswith(_COUNTED):
                self.where.append(f"{Path(caller.f_code.co_filename).name}:{caller.f_lineno}")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
@pytest.mark.parametrize("overflow", [False, True], ids=["applied", "skipped"])
def test_an_amp_update_reads_one_number_and_a_fused_one_none_until_asked(fused, overflow):
    """The second update (the first made the optimizer's state: until then a fused one is read
    too, see aikit.runtime.Torch.amp) reads GradScaler's one number, or none for a fused optimizer
    until its outcome is asked for: then one."""
    net = model()
    inner = inner_optimizer("AdamW", net.parameters(), fused)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4)
    optimizer = Optimizer(inner, STEPS, scaler=scaler, max_grad_norm=1.0)
    first, second = windows()[:2]
    for xm, ym in zip(*(t.split(MICRO) for t in first), strict=True):
        scaler.scale(loss_of(net, xm, ym, torch.float16)).backward()
        optimizer.step()
    assert optimizer.updated
    if overflow:
        scaler.update(new_scale=2.0**30)
    for step, (xm, ym) in enumerate(zip(*(t.split(MICRO) for t in second), strict=True)):
        scaler.scale(loss_of(net, xm, ym, torch.float16)).backward()
        with HostReads() as reads:
            optimizer.step()
        if step < STEPS - 1:
            assert reads.where == []  # nothing in the micro-steps before the update
    assert len(reads.where) == (0 if fused else 1), reads.where  # the update: GradScaler's one read, or none
    with HostReads() as reads:
        assert optimizer.updated is not overflow and optimizer.applied == 2 - overflow
        assert optimizer.skipped == overflow
    assert len(reads.where) == (1 if fused else 0), reads.where  # asked: the fused update's one read, once


# --- without AMP: aikit's own finiteness check, its flag handed to a fused optimizer -------------------

def nan_run(fused: bool, poisoned: set[int], max_skips_in_a_row: int | None = 10, updates: int = 12):
    """float32 SGD-momentum/AdamW updates of STEPS micro-batches, no AMP; the updates in ``poisoned``
    get a NaN gradient (their last micro-batch's loss times NaN). Returns the net, the optimizer,
    the wrapped optimizer and the warnings."""
    net = model()
    inner = inner_optimizer("AdamW", net.parameters(), fused)
    optimizer = Optimizer(inner, STEPS, max_skips_in_a_row=max_skips_in_a_row)
    x, y = data(updates * MICRO * STEPS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for update, (xw, yw) in enumerate(zip(x.split(MICRO * STEPS), y.split(MICRO * STEPS), strict=True)):
            for step, (xm, ym) in enumerate(zip(xw.split(MICRO), yw.split(MICRO), strict=True)):
                loss = nn.functional.mse_loss(net(xm), ym)
                (loss * (math.nan if update in poisoned and step == STEPS - 1 else 1.0)).backward()
                optimizer.step()
        assert optimizer.skipped >= 0  # asked: a fused optimizer's flags read (and warned about) here at the latest
    return net, optimizer, inner, [str(w.message) for w in caught]


@pytest.mark.parametrize("poisoned", [set(), {3}, {3, 4, 9}], ids=["none", "one", "three"])
def test_a_fused_optimizer_skips_a_nan_update_in_its_kernel_as_the_foreach_one_skips_it(poisoned):
    """The finiteness check's flag, made in the pass that applies the GA mean, skips the update inside
    a fused AdamW's kernel (step count put back) with nothing read at the update: the same updates
    applied as the foreach AdamW's, which reads the flag, and the skips counted once asked."""
    foreach = nan_run(False, poisoned)
    fused = nan_run(True, poisoned)
    for got, want in zip(fused[0].parameters(), foreach[0].parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)  # fused and foreach kernels round apart
    assert steps_of(fused[2]) == steps_of(foreach[2]) == {12 - len(poisoned)}
    for _, optimizer, _, warned in (foreach, fused):
        assert optimizer.skipped == len(poisoned) and optimizer.applied == 12 - len(poisoned)
        assert len([w for w in warned if "aikit skipped an update" in w]) == (1 if poisoned else 0)
    if poisoned:
        assert "found on the device by the fused optimizer's check" in fused[3][0]


def test_a_fused_optimizer_reads_nothing_at_a_finite_update_and_one_number_when_asked():
    """After the first update (which makes the optimizer's state and is read), a fused optimizer's
    update reads nothing from the device; asking ``updated`` reads its flags once; the foreach
    optimizer reads the one flag at each update."""
    for fused, at_update in ((True, 0), (False, 1)):
        net = model()
        optimizer = Optimizer(inner_optimizer("AdamW", net.parameters(), fused), STEPS)
        x, y = data()
        for update in range(3):
            for step in range(STEPS):
                xm, ym = x[(update * STEPS + step) * MICRO:][:MICRO], y[(update * STEPS + step) * MICRO:][:MICRO]
                nn.functional.mse_loss(net(xm), ym).backward()
                with HostReads() as reads:
                    optimizer.step()
            if update:
                assert len(reads.where) == at_update, reads.where
        with HostReads() as reads:
            assert optimizer.updated and optimizer.applied == 3 and optimizer.skipped == 0
        assert len(reads.where) == (1 if fused else 0), reads.where


def test_a_fused_optimizer_stuck_on_nan_is_refused_at_the_next_read():
    """Every update NaN from the second on: the fused optimizer's flags are read every
    max_skips_in_a_row updates, so the run is refused by then, its weights as after the first."""
    net = model()
    optimizer = Optimizer(inner_optimizer("AdamW", net.parameters(), True), STEPS, max_skips_in_a_row=4)
    x, y = data()
    with pytest.warns(NonFiniteGradientWarning), pytest.raises(TrainingFailed, match=r"4 updates in a row"):
        for update in range(WINDOWS):
            for step in range(STEPS):
                xm, ym = x[(update * STEPS + step) * MICRO:][:MICRO], y[(update * STEPS + step) * MICRO:][:MICRO]
                (nn.functional.mse_loss(net(xm), ym) * (math.nan if update else 1.0)).backward()
                optimizer.step()
    assert update == 4  # the first update applied, then the fourth skip in a row read and refused at once
    net, optimizer, inner, _ = nan_run(True, set(range(1, 12)), max_skips_in_a_row=None)
    assert optimizer.skipped == 11 and steps_of(inner) == {1}
    reference = nan_run(True, set(), updates=1)[0]
    for got, want in zip(net.parameters(), reference.parameters(), strict=True):
        assert torch.equal(got, want)


# --- a run of skips under AMP: max_skips_in_a_row holds under a GradScaler too (issue 47) ----------------

def inf_at(update: int, first_finite: int) -> float:
    """The factor of an update's loss: finite for the first ``first_finite`` updates, inf after."""
    return 1.0 if update < first_finite else math.inf


def amp_run(optimizer_of, scaler: torch.amp.GradScaler, first_finite: int, updates: int = 40):
    """``updates`` fp16 updates of STEPS micro-batches through ``optimizer_of(net)``; every update's
    loss from ``first_finite`` on is inf. Returns the updates run before the error it raised (if
    any), the error and the warnings."""
    net = model()
    optimizer = optimizer_of(net)
    x, y = data(updates * MICRO * STEPS)
    ran, error = 0, None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for update in range(updates):
                for step in range(STEPS):
                    start = (update * STEPS + step) * MICRO
                    loss = loss_of(net, x[start:start + MICRO], y[start:start + MICRO], torch.float16)
                    scaler.scale(loss * inf_at(update, first_finite)).backward()
                    optimizer.step()
                ran += 1
        except TrainingFailed as failed:
            error = failed
    return ran, error, [w.message for w in caught if isinstance(w.message, NonFiniteGradientWarning)]


AMP_WRAPPERS = pytest.mark.parametrize("wrapper", ["ga", "ga-fused", "trace"])


def wrapped(wrapper: str, scaler: torch.amp.GradScaler):
    if wrapper == "trace":
        def trace(net):
            sampler = CustomSampler(100 * MICRO * STEPS, [MICRO * STEPS] * 100, micro_batch=MICRO, shuffle=False)
            optimizer = LinearRuleOptimizer(inner_optimizer("AdamW", net.parameters(), False), sampler,
                                            ref_batch_size=MICRO * STEPS, scaler=scaler)
            sampler.set_epoch(0)
            optimizer.set_epoch(0)
            return optimizer
        return trace
    return lambda net: Optimizer(inner_optimizer("AdamW", net.parameters(), wrapper == "ga-fused"), STEPS,
                                 scaler=scaler)


@AMP_WRAPPERS
def test_a_gradscaler_that_never_finds_a_scale_is_refused_once_its_scale_is_below_one(wrapper):
    """Every update inf from the start (issue 47's probe: 30 of 30 skipped, the scale halved down
    to 1e-44, nothing said). From GradScaler's default 65536 the first 16 skips find no scale that
    works but still scale the loss up (the scaler's own search, not counted); from the 17th, at a
    scale below 1, each counts: warned once, and the 10th in a row raises TrainingFailed."""
    scaler = torch.amp.GradScaler("cpu")  # init_scale 2**16, halved at every skip
    ran, error, warned = amp_run(wrapped(wrapper, scaler), scaler, first_finite=0)
    assert error is not None and ran == 16 + 10 - 1, (ran, scaler.get_scale())  # refused in update 26
    assert str(error).startswith("10 updates in a row were skipped because their gradient was not finite (found by "
                                 "AMP's GradScaler, whose scale is down to 0.000977 without finding one that works)")
    assert "skip_nonfinite" not in str(error)  # under AMP the scaler decides: that switch changes nothing
    assert len(warned) == 1 and "whose scale is down to 0.5" in str(warned[0])  # the first skip counted


@AMP_WRAPPERS
def test_a_gradscaler_that_found_its_scale_counts_a_run_of_skips_as_any_other(wrapper):
    """Four updates applied, then inf at every update: the scaler had a scale that works, so its
    skips count from the first, and the 10th in a row is refused in its own update (a fused
    optimizer's flags are read as soon as a run could be that long), not warned about before: a
    GradScaler's single skips are its work."""
    scaler = torch.amp.GradScaler("cpu", init_scale=FITS)
    ran, error, warned = amp_run(wrapped(wrapper, scaler), scaler, first_finite=4)
    assert error is not None and ran == 4 + 10 - 1, ran  # refused in the 10th skipped update
    assert str(error).startswith("10 updates in a row were skipped because their gradient was not finite (found "
                                 "by AMP's GradScaler)")
    assert warned == []


def test_a_gradscaler_finding_its_first_scale_from_far_above_is_not_refused():
    """Megatron-LM starts its scale at 2**32: the 20-odd skips until it fits halve a scale that is
    still above 1, the scaler's own search, and training goes on."""
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**32)
    ran, error, warned = amp_run(wrapped("ga", scaler), scaler, first_finite=40)
    assert (ran, error, warned) == (40, None, [])
    assert 1 <= scaler.get_scale() <= 2.0**16
