"""The one LR policy: the LR of every rule as aikit computed it before the policy (written out
here), its checks made once, and a rule added to the registry offered by name."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aikit.core import scaling
from aikit.core.errors import InvalidType, InvalidValue
from aikit.core.gradient_noise import NoiseEstimate
from aikit.core.lr_policy import LRPolicy
from aikit.core.scaling import RULES, Rule, cosine_decay, lr_rule, step_decay


def lr_before(base: float, batch: int, ref: int, rule: str, step: int, warmup: int, decay: float) -> float:
    """``core.scaling.scaled_lr`` as it was before the policy, written out."""
    ratio = batch / ref
    factor = {"linear": ratio, "sqrt": math.sqrt(ratio), "seesaw": math.sqrt(ratio), "constant": 1.0}[rule]
    fraction = 1.0 if warmup == 0 else min(1.0, (step + 1) / warmup)
    base = base if decay == 1 else base * decay
    return base * factor if fraction == 1.0 else base * (1.0 + (factor - 1.0) * fraction)


def adascale_before(base: float, batch: int, ref: int, noise: NoiseEstimate | None) -> float:
    """``core.scaling.adaptive_lr``'s AdaScale as it was, AdaScale's gain written out."""
    if noise is None or batch == ref:
        return base
    trace, grad_sq = max(noise.trace, 0.0), max(noise.grad_sq, 0.0)
    return base if trace == grad_sq == 0 else base * ((trace / ref + grad_sq) / (trace / batch + grad_sq))


@given(st.sampled_from(["linear", "sqrt", "seesaw", "constant"]), st.floats(1e-6, 10.0), st.integers(1, 4096),
       st.integers(1, 4096), st.integers(0, 50), st.integers(0, 20), st.integers(0, 10**6))
def test_every_rule_gives_the_lr_it_gave_before_with_warmup_and_decay(rule, base, batch, ref, updates, warmup,
                                                                       samples):
    decay = cosine_decay(10**6)
    policy = LRPolicy(rule, ref, warmup, decay)
    assert policy.lr(base, batch, updates, samples) == lr_before(base, batch, ref, rule, updates, warmup,
                                                                 decay(samples))
    without = LRPolicy(rule, ref, warmup, decay if rule == "seesaw" else None)
    assert without.lr(base, batch, updates) == lr_before(base, batch, ref, rule, updates, warmup,
                                                         decay(0) if rule == "seesaw" else 1.0)


@given(st.floats(1e-6, 10.0), st.integers(1, 4096), st.integers(1, 4096), st.floats(-1.0, 1e3),
       st.floats(-1.0, 1e3), st.integers(0, 50))
def test_adascale_gives_the_lr_it_gave_before_and_is_not_warmed_up(base, batch, ref, trace, grad_sq, updates):
    noise = NoiseEstimate(grad_sq=grad_sq, trace=trace)
    policy = LRPolicy("adascale", ref, warmup_steps=10, adaptive=True)
    assert policy.lr(base, batch, updates, noise=noise) == adascale_before(base, batch, ref, noise)
    assert policy.lr(base, batch, updates) == base  # before a first estimate


def test_the_function_forms_are_the_policys():
    decay = step_decay([100, 200])
    assert scaling.scaled_lr(0.1, 64, 16, "seesaw", 3, 5, decay(150)) == \
        LRPolicy("seesaw", 16, 5, decay).lr(0.1, 64, 3, 150)
    noise = NoiseEstimate(grad_sq=2.0, trace=30.0)
    assert scaling.adaptive_lr(0.1, 64, 16, "adascale", noise) == LRPolicy("adascale", 16, adaptive=True).lr(
        0.1, 64, noise=noise)


def test_every_check_is_made_once_when_the_policy_is_made():
    with pytest.raises(InvalidValue, match=r"^TraceOptimizer needs ref_batch_size, the global batch its LR was tuned "
                                           r"for$"):
        LRPolicy("sqrt", user="TraceOptimizer")
    assert LRPolicy("constant").lr(0.3, 64) == 0.3  # no reference batch needed
    with pytest.raises(InvalidValue, match="ref_batchsize must be a positive integer, got 0"):
        LRPolicy("linear", 0, ref_name="ref_batchsize")
    with pytest.raises(InvalidValue, match=r"^rule='seesaw' needs lr_decay, the LR decay over samples its trace was "
                                           r"made from"):
        LRPolicy("seesaw", 8, user="rule='seesaw'")
    with pytest.raises(InvalidType, match=r"lr_decay must be a function of the samples trained .*got 0\.5"):
        LRPolicy("linear", 8, lr_decay=0.5)
    with pytest.raises(InvalidValue, match="warmup_steps must be a non-negative integer, got -1"):
        LRPolicy("linear", 8, -1)
    with pytest.raises(InvalidValue, match=r"LR rule must be one of \('linear', 'sqrt', 'constant', 'seesaw'\), "
                                           r"got 'adascale'"):
        LRPolicy("adascale", 8)  # a trace given in advance holds no measured noise
    with pytest.raises(InvalidValue, match=r"LR rule must be one of \('adascale', 'linear', 'sqrt', 'constant'\), "
                                           r"got 'seesaw'"):
        LRPolicy("seesaw", 8, lr_decay=cosine_decay(100), adaptive=True)  # an adaptive run's batches are its own
    assert LRPolicy("root", 8).rule is RULES["sqrt"]
    with pytest.raises(ValueError, match="base_lr must be a finite number >= 0, got nan"):
        LRPolicy("linear", 8).lr(math.nan, 16)
    with pytest.raises(ValueError, match="batch must be a positive integer, got 0"):
        LRPolicy("linear", 8).lr(0.1, 0)


def test_a_rule_added_to_the_registry_is_offered_and_listed(monkeypatch):
    cube_root = Rule("cbrt", lambda batch, ref, noise: (batch / ref) ** (1 / 3))
    monkeypatch.setitem(RULES, "cbrt", cube_root)
    assert LRPolicy("cbrt", 8).lr(0.1, 64) == 0.1 * 8 ** (1 / 3)
    assert LRPolicy("cbrt", 8, adaptive=True).rule is cube_root  # offered to adaptive runs too
    assert scaling.scaled_lr(0.1, 64, 8, "cbrt", 0, 4) == LRPolicy("cbrt", 8, 4).lr(0.1, 64)
    with pytest.raises(InvalidValue, match=r"one of \('linear', 'sqrt', 'constant', 'seesaw', 'cbrt'\), got 'x'"):
        lr_rule("x")
    own = Rule("half", lambda batch, ref, noise: 0.5, needs_ref=False)
    assert LRPolicy(own).lr(0.1, 64) == 0.05  # a rule object, registered or not
