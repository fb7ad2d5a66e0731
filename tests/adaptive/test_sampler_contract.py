"""AdaptiveSampler keeps the whole contract of the CustomSampler it extends: every public name of
either works on both, or is refused with a message that says why and what to use (never a bare
AttributeError from a missing attribute). ``trace`` is one thing on both: a property, the global
batch of every step (the trace's, or the updates trained so far)."""

from __future__ import annotations

import math

import pytest
import torch
from adaptive_common import Clock, adaptive_pair, dataset, make_model, train

from aikit.elastic.Torch import AdaptiveSampler, CustomSampler, LinearRuleOptimizer
from aikit.elastic.Torch.eth_easl import latest_sampler

MICRO, BASE, MAX = 4, 8, 64


def public_names(sampler) -> set[str]:
    return {name for name in dir(type(sampler)) if not name.startswith("_")} | \
        {name for name in vars(sampler) if not name.startswith("_")}


def trained_pair():
    """An adaptive run trained one epoch (its trace and history are not empty) and a
    CustomSampler replaying its batches."""
    data, model, clock = dataset(), make_model(), Clock()
    adaptive, optimizer = adaptive_pair(data, model, "linear", clock, base_batch=BASE, max_batch=MAX,
                                        micro_batch=MICRO)
    train(model, data, 1, sampler=adaptive, optimizer=optimizer, clock=clock)
    replay = CustomSampler(data, adaptive.trace, minibatch_size=MICRO, seed=5, when_exhausted="stop")
    return data, adaptive, replay


def uses(name: str, sampler, data, tmp_path):
    """Use ``name`` on ``sampler`` as a user would: read it, or call it with sensible arguments."""
    value = getattr(sampler, name)
    calls = {
        "get_epoch_range": (0,), "get_epochtrace": (0,), "get_batch_assignments": (sampler.get_epochtrace(0)[:2],),
        "set_epoch": (0,), "check_position": (0, 1, 0), "resume": (0, 1, 0), "write_trace": (tmp_path / "t.csv",),
        "loader": (data,), "state_dict": (), "load_state_dict": (sampler.state_dict(),), "set_world": (1, 0),
    }
    return value(*calls[name]) if name in calls else value


def test_every_public_name_of_either_sampler_works_on_both_or_says_why(tmp_path):
    data, adaptive, replay = trained_pair()
    names = public_names(adaptive) | public_names(replay)
    assert {"trace", "write_trace", "loader", "lookahead", "controller", "state_dict", "permutation",
            "get_batch_assignments", "max_epoch", "trace_samples"} <= names
    refused = {}
    for name in sorted(names):
        for sampler in (adaptive, replay):
            try:
                uses(name, sampler, data, tmp_path)
            except (AttributeError, ValueError) as error:
                message = str(error)
                # a refusal names the sampler's kind and what to use instead; a slip says "object has no attribute"
                assert "has no attribute" not in message and ("AdaptiveSampler" in message or "use" in message), \
                    f"{type(sampler).__name__}.{name}: {message}"
                refused[type(sampler).__name__, name] = message
    # only what cannot apply is refused: a trace given in advance has no controller deciding it
    assert set(refused) == {("CustomSampler", "controller"), ("CustomSampler", "interval")}
    assert "no controller" in refused["CustomSampler", "controller"]


def test_the_trace_is_a_property_on_both_and_holds_the_same_batches(tmp_path):
    data, adaptive, replay = trained_pair()
    assert adaptive.trace == replay.trace == adaptive.controller.batches and len(set(adaptive.trace)) > 1
    assert adaptive.trace_samples == replay.trace_samples == len(data)  # one epoch, no sample left out
    assert adaptive.max_epoch == replay.max_epoch == 1
    assert adaptive.get_epoch_range(0) == replay.get_epoch_range(0) == (0, len(adaptive.trace))
    assert adaptive.get_epochtrace(0) == replay.get_epochtrace(0) == adaptive.trace
    assert adaptive.get_batch_assignments([8, 16]) == replay.get_batch_assignments([8, 16])
    assert adaptive.permutation == replay.permutation == "numpy"
    adaptive.write_trace(tmp_path / "a.csv")
    replay.write_trace(tmp_path / "r.csv")
    assert (tmp_path / "a.csv").read_text() == (tmp_path / "r.csv").read_text()
    state = adaptive.state_dict()
    assert {k: v for k, v in state.items() if k != "step"} == {
        k: v for k, v in replay.state_dict().items() if k != "step"}
    assert replay.lookahead == math.inf and adaptive.lookahead == 0
    with pytest.raises(ValueError, match=r"decided to its end.*AdaptiveSampler has one"):
        replay.lookahead = 4
    with pytest.raises(ValueError, match="batch assignments number micro-batches of one size"):
        AdaptiveSampler(256, base_batch=8, max_batch=64, max_device_batch=16).get_batch_assignments([8])


def test_a_trace_optimizer_refuses_an_adaptive_sampler_and_eth_easls_default_is_the_latest_sampler():
    sampler = AdaptiveSampler(dataset(), base_batch=BASE, max_batch=MAX, micro_batch=MICRO)
    assert latest_sampler() is sampler
    model = make_model()
    with pytest.raises(TypeError, match=r"decides its batches while training: train it with AdaptiveOptimizer"):
        LinearRuleOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), sampler, ref_batchsize=BASE)
    with pytest.raises(TypeError, match="AdaptiveOptimizer"):
        LinearRuleOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), ref_batchsize=BASE)  # the latest made
