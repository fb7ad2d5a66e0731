"""AdaptiveSampler keeps the whole contract of the TraceSampler it extends: every public name of
either works on both, or is refused with a message that says why and what to use (never a bare
AttributeError from a missing attribute). eth-easl's names are its ``CustomSampler``'s, at the edge:
an AdaptiveSampler, aikit's own, has none of them. ``trace`` is one thing on both: a property, the global
batch of every step (the trace's, or the updates trained so far)."""

from __future__ import annotations

import math

import pytest
import torch
from adaptive_common import Clock, adaptive_pair, dataset, make_model, train

from aikit.elastic.Torch import AdaptiveSampler, CustomSampler, LinearRuleOptimizer, TraceSampler
from aikit.elastic.Torch.eth_easl import latest_sampler

MICRO, BASE, MAX = 4, 8, 64


def public_names(sampler) -> set[str]:
    return {name for name in dir(type(sampler)) if not name.startswith("_")} | \
        {name for name in vars(sampler) if not name.startswith("_")}


def trained_pair():
    """An adaptive run trained one epoch (its trace and history are not empty) and a
    TraceSampler replaying its batches."""
    data, model, clock = dataset(), make_model(), Clock()
    adaptive, optimizer = adaptive_pair(data, model, "linear", clock, base_batch=BASE, max_batch=MAX,
                                        micro_batch=MICRO)
    train(model, data, 1, sampler=adaptive, optimizer=optimizer, clock=clock)
    replay = TraceSampler(data, adaptive.trace, micro_batch=MICRO, seed=5, when_exhausted="stop")
    return data, adaptive, replay


def uses(name: str, sampler, data, tmp_path):
    """Use ``name`` on ``sampler`` as a user would: read it, or call it with sensible arguments."""
    value = getattr(sampler, name)
    calls = {
        "set_epoch": (0,), "check_position": (0, 1, 0), "resume": (0, 1, 0), "write_trace": (tmp_path / "t.csv",),
        "loader": (data,), "state_dict": (), "load_state_dict": (sampler.state_dict(),), "set_world": (1, 0),
    }
    return value(*calls[name]) if name in calls else value


def test_every_public_name_of_either_sampler_works_on_both_or_says_why(tmp_path):
    data, adaptive, replay = trained_pair()
    names = public_names(adaptive) | public_names(replay)
    assert {"trace", "write_trace", "loader", "lookahead", "controller", "state_dict", "permutation",
            "epoch_schedule", "micro_batch", "schedule"} <= names
    eth_easl = {"minibatch_size", "trace_samples", "minibatches_per_epoch", "max_epoch", "get_epoch_range",
                "get_epochtrace", "get_batch_assignments"}
    custom = CustomSampler(data, adaptive.trace, seed=5, minibatch_size=MICRO)
    assert names.isdisjoint(eth_easl) and eth_easl <= public_names(custom)
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
    assert set(refused) == {("TraceSampler", "controller"), ("TraceSampler", "interval")}
    assert "no controller" in refused["TraceSampler", "controller"]


def test_the_trace_is_a_property_on_both_and_holds_the_same_batches(tmp_path):
    data, adaptive, replay = trained_pair()
    assert adaptive.trace == replay.trace == adaptive.controller.batches and len(set(adaptive.trace)) > 1
    assert sum(adaptive.trace) == len(data)  # one epoch, no sample left out
    assert adaptive.epoch_schedule.batch_sizes.tolist() == replay.epoch_schedule.batch_sizes.tolist() == adaptive.trace
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


def test_a_trace_optimizer_refuses_an_adaptive_sampler_and_eth_easls_default_is_its_latest_sampler():
    """eth-easl's optimizers default to the last eth-easl CustomSampler made: an AdaptiveSampler
    (aikit's own) is never taken for one, and given explicitly it is refused with the fix."""
    custom = CustomSampler(dataset(), [BASE], minibatch_size=MICRO, when_exhausted="cycle")
    sampler = AdaptiveSampler(dataset(), base_batch=BASE, max_batch=MAX, micro_batch=MICRO)
    assert latest_sampler() is custom
    model = make_model()
    with pytest.raises(TypeError, match=r"decides its batches while training: train it with AdaptiveOptimizer"):
        LinearRuleOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), sampler, ref_batchsize=BASE)
    assert LinearRuleOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), ref_batchsize=BASE).sampler is custom
