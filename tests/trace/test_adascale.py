"""AdaScaleOptimizer in one process: every update's gain, per param group and for the whole
model, equals the gain computed from per-sample gradients of that update's micro-batches; the LR
is the micro-batch's LR times the gain; progress advances by the gain; a resume reaches the same bits."""

from __future__ import annotations

import io
import math

import pytest
import torch
from adascale_reference import ReferenceGain, per_sample_grads
from torch import nn
from torch.utils.data import DataLoader
from trace_common import MINIBATCH, dataset, make_model

from aikit.core.errors import NonFiniteGradientWarning
from aikit.elastic.Torch import AdaScaleOptimizer, CustomSampler
from aikit.runtime.Torch.noise import mean_sq_norms

TRACE = [8, 12, 4, 16, 24, 8]  # 2, 3, 1, 4, 6, 2 micro-batches: the 1 has no noise to measure


def two_groups(model: nn.Module, lr: float = 0.05) -> torch.optim.SGD:
    weights = [p for name, p in model.named_parameters() if name.endswith("weight")]
    biases = [p for name, p in model.named_parameters() if name.endswith("bias")]
    return torch.optim.SGD([{"params": weights}, {"params": biases, "lr": 2 * lr}], lr=lr, momentum=0.9)


def group_slices(model: nn.Module) -> list[list[int]]:
    """Where each group's parameters lie in the flattened gradient (model.parameters() order)."""
    spans, start = {}, 0
    for name, p in model.named_parameters():
        spans[name] = (start, start + p.numel())
        start += p.numel()
    return [[i for name, (a, b) in spans.items() if name.endswith(kind) for i in range(a, b)]
            for kind in ("weight", "bias")]


def run(epochs=range(2), decay=0.5, stop_after=None, resume_from=None, scaler=None):
    data = dataset(60)
    model = make_model()
    sampler = CustomSampler(data, TRACE, minibatch_size=MINIBATCH, when_exhausted="cycle")
    inner = two_groups(model)
    optimizer = AdaScaleOptimizer(inner, sampler, ref_batchsize=16, decay=decay, scaler=scaler)
    if resume_from is not None:
        model.load_state_dict(resume_from["model"])
        optimizer.load_state_dict(resume_from["optimizer"])
    seen = {"params": [], "lr": [], "gains": [], "model_gain": [], "progress": [], "parts": []}

    def record(opt, *_):
        seen["params"].append([p.detach().clone() for p in model.parameters()])
        seen["lr"].append([g["lr"] for g in opt.param_groups])
        seen["gains"].append(optimizer.gain())
        seen["model_gain"].append(optimizer.last_gain)

    inner.register_step_pre_hook(record)
    parts, micro_batches = [], 0
    for epoch in epochs:
        sampler.set_epoch(epoch)
        optimizer.set_epoch(epoch)
        for x, y in DataLoader(data, batch_sampler=sampler):
            if micro_batches == stop_after:
                return model, optimizer, seen
            parts.append(y[:, 1].long().tolist())
            loss = nn.functional.mse_loss(model(x), y[:, :1])
            (loss if scaler is None else scaler.scale(loss)).backward()
            micro_batches += 1
            if optimizer.step():
                seen["parts"].append(parts)
                seen["progress"].append(optimizer.progress)
                parts = []
    return model, optimizer, seen


@pytest.mark.parametrize("decay", [0.0, 0.5])
def test_every_gain_equals_the_gain_from_per_sample_gradients(decay):
    model, _, seen = run(decay=decay)
    x, y = dataset(60).tensors
    reference = ReferenceGain(group_slices(model), decay)
    probe = make_model()
    progress = 0.0
    assert len(seen["parts"]) == len(seen["params"]) > 8
    for update, (params, parts) in enumerate(zip(seen["params"], seen["parts"], strict=True)):
        grads = per_sample_grads(probe, params, x, y)
        per_group, whole = reference.update(grads, parts, MINIBATCH)
        assert seen["gains"][update] == pytest.approx(per_group, rel=1e-9), update
        assert seen["model_gain"][update] == pytest.approx(whole, rel=1e-9), update
        # the LR: the base LR scaled to one micro-batch (4 / 16), times the group's gain
        assert seen["lr"][update] == pytest.approx([0.05 * 4 / 16 * per_group[0], 0.1 * 4 / 16 * per_group[1]],
                                                   rel=1e-9)
        progress += whole
        assert seen["progress"][update] == pytest.approx(progress, rel=1e-12)
    assert any(len(parts) == 1 for parts in seen["parts"])  # a step without noise to measure was there
    assert max(max(g) for g in seen["gains"]) > 1.2  # and the gain did move


def test_amps_loss_scale_is_divided_out_of_the_gains():
    _, plain, seen = run()
    _, scaled, seen_scaled = run(scaler=torch.amp.GradScaler("cpu", init_scale=2.0**10))
    assert len(seen_scaled["gains"]) == len(seen["gains"]) > 8
    for scaled_gains, gains in zip(seen_scaled["gains"], seen["gains"], strict=True):
        assert scaled_gains == pytest.approx(gains, rel=1e-9)
    assert scaled.progress == pytest.approx(plain.progress, rel=1e-9)


@pytest.mark.parametrize("stop_after", [3, 6, 11])  # at a step start and mid-step
def test_a_resumed_run_reaches_the_same_bits(stop_after):
    whole_model, whole, _ = run(range(2))
    model, optimizer, _ = run(range(2), stop_after=stop_after)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    state = torch.load(buffer)
    epoch = state["optimizer"]["trace"]["epoch"]
    resumed_model, resumed, _ = run(range(epoch, 2), resume_from=state)
    for a, b in zip(resumed_model.parameters(), whole_model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert resumed.progress == whole.progress and resumed.gain() == whole.gain()


def test_the_original_surface_and_bad_states():
    model, optimizer, _ = run(range(1))
    assert isinstance(optimizer.gain(), tuple) and len(optimizer.gain()) == 2
    lr = optimizer.current_lr()  # a tuple per group, as eth-easl's AdaScale returns
    assert isinstance(lr, tuple) and len(lr) == 2
    var, sq = optimizer.grad_var_avg, optimizer.grad_sqr_avg  # eth-easl's units: one micro-batch's variance
    last = int(optimizer.epoch_schedule.batch_sizes[-1]) // MINIBATCH
    assert ((var + sq) / (var / last + sq)).tolist() == pytest.approx(optimizer.gain(), rel=1e-9)
    state = optimizer.state_dict()
    state["adascale"]["trackers"] = state["adascale"]["trackers"][:1]
    with pytest.raises(ValueError, match=r"one tracker and one gain per param group \(2\)"):
        optimizer.load_state_dict(state)
    with pytest.raises(ValueError, match="AdaScaleOptimizer has no warmup"):
        AdaScaleOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), optimizer.sampler, warmup_steps=3)


def test_a_state_with_the_earlier_one_row_of_pending_norms_resumes():
    """States saved before the per-micro-batch recorder kept one summed row per group: still loadable."""
    whole_model, whole, _ = run(range(2))
    model, optimizer, _ = run(range(2), stop_after=13)  # 3 micro-batches into a step of 6
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    pending = state["optimizer"]["adascale"]["pending"]
    assert pending is not None and len(pending) == 3  # one row per micro-batch of the step so far
    state["optimizer"]["adascale"]["pending"] = [sum(column) for column in zip(*pending, strict=True)]
    epoch = state["optimizer"]["trace"]["epoch"]
    resumed_model, resumed, _ = run(range(epoch, 2), resume_from=state)
    for a, b in zip(resumed_model.parameters(), whole_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    assert resumed.progress == pytest.approx(whole.progress, rel=1e-12)


def test_each_update_reads_its_gradient_norms_from_the_device_once_with_the_same_bits(monkeypatch):
    """The squared norm of each group's update gradient: one read from the device per update (all
    parameters' norms in one tensor), not one per parameter, and bit for bit what one read per
    parameter, added up in parameter order, gave."""
    reads, expected, found = [], [], []
    observe = AdaScaleOptimizer._observe
    originals = {name: getattr(torch.Tensor, name) for name in ("tolist", "item", "__float__")}

    def counting(name, count):
        def read(tensor, *args, **kwargs):
            count[0] += 1
            return originals[name](tensor, *args, **kwargs)
        return read

    def counted(self, totals):
        scale = self._gradient_scale()
        expected.append([sum(float(p.grad.to(self.noise.norms.dtype).pow(2).sum()) for p in group["params"]
                             if p.grad is not None) * scale**2 for group in self.param_groups])  # one read each
        found.append(mean_sq_norms(self.param_groups, self.noise.norms.dtype, scale))
        count = [0]
        with monkeypatch.context() as patched:
            for name in originals:
                patched.setattr(torch.Tensor, name, counting(name, count))
            observe(self, totals)
        reads.append((self.get_bs() // MINIBATCH, count[0]))

    monkeypatch.setattr(AdaScaleOptimizer, "_observe", counted)
    run(epochs=range(2))
    assert len(reads) > 4 and found == expected
    assert [count for _, count in reads] == [1 if parts >= 2 else 0 for parts, _ in reads]
    assert any(parts == 1 for parts, _ in reads)  # an update without noise to measure reads nothing


def test_a_skipped_update_makes_no_progress():
    """An update skipped for a NaN gradient (no AMP) made no step: progress, the scale-invariant
    iteration count an LR schedule reads, stays where it was; the others advance by their gain."""
    data = dataset(60)
    model = make_model()
    sampler = CustomSampler(data, TRACE, minibatch_size=MINIBATCH)
    optimizer = AdaScaleOptimizer(two_groups(model), sampler, ref_batchsize=16)
    sampler.set_epoch(0)
    optimizer.set_epoch(0)
    advanced = []  # (updated, progress made) per update
    with pytest.warns(NonFiniteGradientWarning):
        for x, y in DataLoader(data, batch_sampler=sampler):
            step, before = optimizer.step_index, optimizer.progress
            (nn.functional.mse_loss(model(x), y[:, :1]) * (math.nan if step == 3 else 1.0)).backward()
            optimizer.step()
            if optimizer.step_index != step:
                advanced.append((optimizer.updated, optimizer.progress - before))
    assert len(advanced) >= 4 and [updated for updated, _ in advanced] == [step != 3 for step in range(len(advanced))]
    assert advanced[3][1] == 0 and all(made >= 1 for updated, made in advanced if updated)


def test_aikits_own_adascale_is_the_trace_optimizers_rule_the_gain_of_the_batch_over_its_reference():
    """``TraceOptimizer(rule="adascale")``: every update's LR is the base LR times AdaScale's gain of
    its batch over ``ref_batch_size`` from the whole model's smoothed noise (Johnson et al.), the
    noise measured as eth-easl's AdaScaleOptimizer measures it; it takes no loss-term weights, and
    its state keeps the noise, so a resume mid-step reaches the same bits."""
    from aikit.elastic.Torch import TraceOptimizer

    def trained(stop_after=None, resume_from=None):
        data, model = dataset(60), make_model()
        sampler = CustomSampler(data, TRACE, minibatch_size=MINIBATCH, when_exhausted="cycle")
        inner = two_groups(model)
        optimizer = TraceOptimizer(inner, sampler, "adascale", ref_batch_size=16, noise_decay=0.5)
        if resume_from is not None:
            model.load_state_dict(resume_from["model"])
            optimizer.load_state_dict(resume_from["optimizer"])
        seen = {"params": [], "lr": [], "parts": []}
        def record(opt, *_):
            seen["params"].append([p.detach().clone() for p in model.parameters()])
            seen["lr"].append([g["lr"] for g in opt.param_groups])

        inner.register_step_pre_hook(record)
        parts, micro_batches = [], 0
        for epoch in range(sampler.epoch if resume_from else 0, 2):
            sampler.set_epoch(epoch)
            optimizer.set_epoch(epoch)
            for x, y in DataLoader(data, batch_sampler=sampler):
                if micro_batches == stop_after:
                    return model, optimizer, seen
                parts.append(y[:, 1].long().tolist())
                nn.functional.mse_loss(model(x), y[:, :1]).backward()
                micro_batches += 1
                if optimizer.step():
                    seen["parts"].append(parts)
                    parts = []
        return model, optimizer, seen

    model, optimizer, seen = trained()
    x, y = dataset(60).tensors
    reference, probe = ReferenceGain(group_slices(model), 0.5), make_model()
    for params, parts, lrs in zip(seen["params"], seen["parts"], seen["lr"], strict=True):
        reference.update(per_sample_grads(probe, params, x, y), parts, MINIBATCH)
        var, sq = (sum(v) / (1 - 0.5**reference.updates) if reference.updates else 0.0
                   for v in (reference.var, reference.sq))
        batch = len(parts) * MINIBATCH
        gain = 1.0 if not reference.updates or batch == 16 else (var / 16 + max(sq, 0)) / (var / batch + max(sq, 0))
        assert lrs == pytest.approx([0.05 * gain, 0.1 * gain], rel=1e-9)
    assert len({round(lr[0], 6) for lr in seen["lr"]}) > 3  # the LR follows the batch and the noise
    with pytest.raises(ValueError, match="takes no weight="), optimizer.accumulate(model, weight=3):
        pass
    whole_model, *_ = trained()
    stopped, stopped_optimizer, _ = trained(stop_after=13)  # mid-step: the norms so far are in the state
    state = {"model": stopped.state_dict(), "optimizer": stopped_optimizer.state_dict()}
    assert set(state["optimizer"]) == {"optimizer", "trace", "noise"}
    resumed, *_ = trained(resume_from=state)
    for a, b in zip(resumed.parameters(), whole_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
